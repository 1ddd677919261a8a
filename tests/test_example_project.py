"""The demo: example_project/demo.py starts Redis, the web server and a worker; a job
enqueued from the page runs; Ctrl-C stops everything. The log fan-out page: a group of
jobs, one per chunk of a log, and a callback that merges their counts."""

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from contextlib import closing, contextmanager

import redis

from tests.conftest import ROOT, blocked_clients, wait_until
from tests.support.keys import DEFAULT_KEYS
from tests.support.servers import RedisServer, free_port


class Browser:
    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str) -> str:
        return self.opener.open(self.base + path, timeout=10).read().decode()

    def post(self, path: str, page: str, **data: str) -> str:
        data["csrfmiddlewaretoken"] = re.search(r'csrfmiddlewaretoken" value="([^"]+)"', page)[1]
        request = urllib.request.Request(
            self.base + path,
            data=urllib.parse.urlencode(data).encode(),
            headers={"Referer": self.base + "/"},
        )
        return self.opener.open(request, timeout=10).read().decode()


def test_demo_runs_a_job_enqueued_from_the_page():
    redis_port = free_port()  # nothing answers there: the demo starts its own Redis
    web_port = free_port()
    while web_port == redis_port:
        web_port = free_port()
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "example_project" / "demo.py")],
        env={
            **_env(),
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "DEMO_ADDRESS": f"127.0.0.1:{web_port}",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        browser = Browser(f"http://127.0.0.1:{web_port}")
        page = wait_until(lambda: _try(browser.get, "/"), 60, "the demo's web server")
        username = f"ann{uuid.uuid4().hex[:8]}"  # the demo's database outlives the test
        page = browser.post("/signup/", page, username=username)
        job_id = re.search(r"job ([0-9a-f]{26})", page)[1]

        def job_done():
            status = json.loads(browser.get(f"/jobs/{job_id}/"))
            return status if status["status"] == "SUCCESSFUL" else None

        status = wait_until(job_done, 30, "the welcome email job")
        assert status["return_value"] == f"{username}@example.com"
        welcome_id = job_id

        # A report is enqueued on commit; the page links its job by the id handed back.
        page = browser.post("/reports/", page, limit="1000")
        job_id = re.search(r'href="/jobs/([0-9a-f]{26})/"', page)[1]
        assert wait_until(job_done, 30, "the report job")["return_value"] == 168
        demo_redis = redis.Redis(port=redis_port)
        # The worker and the scheduler are both up and waiting on Redis.
        wait_until(lambda: len(blocked_clients(demo_redis)) >= 2, 30, "worker and scheduler")
    finally:
        demo.send_signal(signal.SIGINT)
        output = demo.communicate(timeout=60)[0]
    assert demo.returncode == 0, output
    assert "starting redis-server" in output
    assert "Welcome!" in output  # the console email backend printed the email
    assert "stopped after" in output  # the worker stopped gracefully
    assert re.search(r"Scheduler \S+ stopped", output)  # so did the scheduler

    # The traces (the SDK is installed): the signup's request, its enqueue and the
    # welcome job's attempt in the worker are one trace.
    spans = re.findall(r"span trace=(\w+) id=(\w+) parent=(\S+) (\w+) '([^']*)' ?(.*)", output)
    (ran,) = [s for s in spans if s[3] == "CONSUMER" and f"message.id={welcome_id}," in s[5]]
    (sent,) = [s for s in spans if s[1] == ran[2]]
    assert sent[3] == "PRODUCER" and sent[4] == "send high"  # through the outbox
    (request,) = [s for s in spans if s[1] == sent[2]]
    assert request[3] == "SERVER" and "signup" in request[4]
    assert ran[0] == sent[0] == request[0]


def test_a_log_is_analysed_by_a_group_of_chunk_jobs_and_summarised_by_its_callback(tmp_path):
    database = tmp_path / "db.sqlite3"
    with _example_site(database) as (browser, env), closing(sqlite3.connect(database)) as db:
        assert 'href="/logs/"' in browser.get("/")  # linked from the home page
        page = _generate_log(browser, lines=1234)
        run_id = int(re.search(r"Log run #(\d+)", page)[1])
        group_id = re.search(r"dashboard/group/([0-9a-f]{26})/", page)[1]
        assert '<span id="progress">0 of 3</span>' in page  # 500 + 500 + 234 lines
        assert 'http-equiv="refresh"' in page
        lossy_id = int(re.search(r"Log run #(\d+)", _generate_log(browser, lines=1100))[1])
        # The logs as stored, read before any worker runs: the expected counts.
        log, lossy_log = _chunks(db, run_id), _chunks(db, lossy_id)
        assert sum(len(chunk.splitlines()) for chunk in log) == 1234
        # A chunk lost before its job runs: that job fails, the callback runs all the same.
        with db:
            db.execute('DELETE FROM shop_logchunk WHERE run_id = ? AND "index" = 1', [lossy_id])

        worker = subprocess.run(
            _manage("runworker", "--burst"), env=env, capture_output=True, text=True, timeout=60
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr

        query = "SELECT summary, failed_chunks, group_id FROM shop_logrun WHERE id = ?"
        summary, failed, stored_group = db.execute(query, [run_id]).fetchone()
        assert (json.loads(summary), failed, stored_group) == (_summary_of(log), 0, group_id)
        summary, failed, _ = db.execute(query, [lossy_id]).fetchone()
        assert (json.loads(summary), failed) == (_summary_of([lossy_log[0], lossy_log[2]]), 1)
        # The callbacks cleaned up.
        assert db.execute("SELECT count(*) FROM shop_logchunk").fetchone() == (0,)
        # Each chunk's job reported the lines it counted, the last report kept.
        read = (
            "from django_redisqueue.compat import task_backends as b; d = b['default']; "
            f"print([d.get_result(i).progress.done for i in d.get_group('{group_id}').member_ids])"
        )
        shell = subprocess.run(
            _manage("shell", "-c", read), env=env, capture_output=True, text=True, timeout=60
        )
        assert shell.stdout.splitlines()[-1] == "[500, 500, 234]", shell.stdout + shell.stderr

        page = browser.get(f"/logs/{run_id}/")
        assert '<span id="progress">3 of 3</span>' in page
        assert "1234 lines counted" in page
        assert 'http-equiv="refresh"' not in page
        assert "1 failed" in browser.get(f"/logs/{lossy_id}/")


def test_customers_imports_take_turns_on_the_fair_queue(tmp_path):
    with _example_site(tmp_path / "db.sqlite3") as (browser, env):
        page = browser.post("/imports/", browser.get("/"))
        assert "the small imports are done within the first dozen rows" in page
        assert '<td id="queue-imports">1009</td>' in page
        # Thirteen jobs: a round of four customers, three times, and acme's next.
        worker = subprocess.run(
            _manage("runworker", "--max-jobs", "13"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        read = (
            "from django_redisqueue.compat import task_backends as b; "
            "from django_redisqueue.dashboard.reads import Dashboard; "
            "print(Dashboard(b['default']).fair_keys('imports').rows)"
        )
        shell = subprocess.run(
            _manage("shell", "-c", read), env=env, capture_output=True, text=True, timeout=60
        )
        # Only acme has rows left: the small customers' imports all ran.
        assert shell.stdout.splitlines()[-1] == "[('acme', 996)]", shell.stdout + shell.stderr


def test_the_example_site_refuses_to_be_framed(tmp_path):
    """Its middleware says so for every page, the admin's too (clickjacking)."""
    with _example_site(tmp_path / "db.sqlite3") as (browser, _):
        for path in ("/", "/admin/login/"):
            with browser.opener.open(browser.base + path, timeout=10) as response:
                assert response.headers["X-Frame-Options"] == "DENY", path


def test_the_nightly_purge_is_a_periodic_job(tmp_path):
    """The example's PERIODIC purge-old-logs: a scheduler registers it; once a night
    passed (its ``last`` set back a day), the next scheduler step enqueues the purge,
    which deletes the runs older than a week and keeps the others."""
    database = tmp_path / "db.sqlite3"
    with RedisServer() as server, closing(sqlite3.connect(database)) as db:
        env = {**_env(), "REDIS_URL": server.url, "DEMO_DATABASE": str(database)}
        run = {"env": env, "capture_output": True, "text": True, "timeout": 60}
        subprocess.run(_manage("migrate", "--noinput", "-v0"), check=True, **run)
        with db:
            for name, age in (("old", "-8 days"), ("recent", "-1 days")):
                db.execute(
                    "INSERT INTO shop_logrun (name, lines, group_id, created_at) "
                    "VALUES (?, 0, '', datetime('now', ?))",
                    [name, age],
                )
        assert subprocess.run(_manage("runscheduler", "--burst"), **run).returncode == 0
        client = redis.Redis.from_url(server.url, decode_responses=True)
        state = DEFAULT_KEYS.periodic_schedule("purge-old-logs")
        client.hset(state, "last", int(client.hget(state, "last")) - 86_400_000)
        scheduler = subprocess.run(_manage("runscheduler", "--burst"), **run)
        assert "Periodic job 'purge-old-logs': enqueued 1" in scheduler.stdout + scheduler.stderr
        worker = subprocess.run(_manage("runworker", "--burst"), **run)
        assert worker.returncode == 0, worker.stdout + worker.stderr
        assert db.execute("SELECT name FROM shop_logrun").fetchall() == [("recent",)]
        assert client.hget(state, "last_job").startswith("periodic:purge-old-logs:")


@contextmanager
def _example_site(database):
    """The example project's web server on a fresh ``database`` and a Redis of its own;
    yields a browser on it and the environment for its ``manage.py`` commands."""
    with RedisServer() as server:
        env = {**_env(), "REDIS_URL": server.url, "DEMO_DATABASE": str(database)}
        subprocess.run(_manage("migrate", "--noinput", "-v0"), env=env, check=True, timeout=60)
        port = free_port()
        web = subprocess.Popen(
            _manage("runserver", f"127.0.0.1:{port}", "--noreload"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            browser = Browser(f"http://127.0.0.1:{port}")
            wait_until(lambda: _try(browser.get, "/"), 60, "the web server")
            yield browser, env
        finally:
            web.terminate()
            web.wait(timeout=30)


def _generate_log(browser: Browser, lines: int) -> str:
    """Click "generate a sample log"; return the run's page it leads to."""
    return browser.post("/logs/sample/", browser.get("/logs/"), lines=str(lines))


def _chunks(db, run_id: int) -> list[str]:
    query = 'SELECT text FROM shop_logchunk WHERE run_id = ? ORDER BY "index"'
    return [text for (text,) in db.execute(query, [run_id])]


def _summary_of(chunks: list[str]) -> dict:
    """Counted here by splitting on quotes, apart from the app's regular expression:
    ``client - - [time] "METHOD path HTTP/1.1" status size "referrer" "agent"``."""
    lines = [line for chunk in chunks for line in chunk.splitlines()]
    statuses, paths, clients = Counter(), Counter(), Counter()
    for line in lines:
        prefix, request, after, *_ = line.split('"')
        clients[prefix.split()[0]] += 1
        paths[request.split()[1]] += 1
        statuses[after.split()[0]] += 1

    def top(counter):  # most frequent first, ties by name
        return [[k, n] for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))][:10]

    return {
        "lines": len(lines),
        "unparsed": 0,
        "statuses": dict(sorted(statuses.items())),
        "top_paths": top(paths),
        "top_clients": top(clients),
    }


def _manage(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "example_project" / "manage.py"), *args]


def _try(get, path):
    try:
        return get(path)
    except OSError:
        return None


def _env():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    return env
