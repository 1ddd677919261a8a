"""The demo: example_project/demo.py starts Redis, the web server and a worker; a job
enqueued from the page runs; Ctrl-C stops everything."""

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid

import redis

from django_redisqueue.testing import free_port
from tests.conftest import ROOT, blocked_clients, wait_until


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


def _try(get, path):
    try:
        return get(path)
    except OSError:
        return None


def _env():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    return env
