"""Running workers in production and development: the pool's children replaced,
``runworker --max-memory``, ``--reload`` and ``--log-format json``."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import autoreload
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.observe.events import JobEvent
from django_redisqueue.observe.logformat import JsonFormatter, job_fields
from django_redisqueue.runtime import memory
from django_redisqueue.runtime.reloading import RELOAD_EXIT_CODE, ReloadWatcher
from tests.conftest import ROOT, ManagedProcess, child_env, manage, run_worker_here, wait_until
from tests.support import tasks
from tests.support.entries import as_hash

# An app of the test's own, in a directory on sys.path, so that a test may edit its
# code while a worker runs it.
APP = "opsapp"
SETTINGS = f"""
from tests.support.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, {APP!r}]  # noqa: F405
"""
TASKS = """
import os
import time

from django_redisqueue import task
from tests.support.tasks import LOG, client

from .edited import version  # noqa: F401

_kept = []


@task
def hog(megabytes):
    \"\"\"Keep megabytes of memory for good, and count the runs.\"\"\"
    _kept.append(b"\\x01" * (megabytes * 1024 * 1024))
    client().incr("test:hogs")
    return os.getpid()


@task
def held_until_released():
    \"\"\"Run until the test sets test:released (polled: redis-py times a BLPOP out).\"\"\"
    client().rpush(LOG, "started")
    deadline = time.monotonic() + 60
    while not client().exists("test:released") and time.monotonic() < deadline:
        time.sleep(0.02)
    client().rpush(LOG, "done")
    return os.getpid()
"""
VERSION = """
from django_redisqueue import task


@task
def version():
    return {value!r}
"""


@pytest.fixture
def app(tmp_path, monkeypatch):
    """The app on this process's sys.path (to enqueue its tasks) and the workers'."""
    package = tmp_path / APP
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(TASKS)
    (package / "edited.py").write_text(VERSION.format(value=1))
    (tmp_path / "ops_settings.py").write_text(SETTINGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name.partition(".")[0] == APP]:
        del sys.modules[name]  # another test's copy, from another directory
    import opsapp.tasks

    return opsapp.tasks


@pytest.fixture
def start_worker(app, procs):
    """Start ``runworker ARGS`` on the app's settings, in its own process group."""

    def start(*args):
        env = {
            **child_env(),
            "DJANGO_SETTINGS_MODULE": "ops_settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(app.__file__).parent.parent)]),
            "PYTHONDONTWRITEBYTECODE": "1",  # an edit within the second must be seen
        }
        process = ManagedProcess(
            [sys.executable, "-m", "django", "runworker", *args],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        procs.running.append(process)
        return process

    return start


def live_worker_pids(backend) -> set[int]:
    """The pids of the workers registered now (a worker id is host:pid:random)."""
    return {
        int(worker.split(":")[-2]) for worker, _ in backend.queries.alive(backend.keys.workers)
    }


# The pool


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sigterms", [1, 2], ids=["sigterm", "sigterm-twice"])
def test_the_pool_replaces_a_child_that_someone_else_stopped(r, backend, procs, sigterms):
    """One SIGTERM: the child finishes its job and exits 0; two: it gives the job back
    and exits 0. Either way the supervisor was not stopping, so it starts a new one."""
    pool = procs.start("runworker", "--concurrency", "2")
    wait_until(lambda: len(live_worker_pids(backend)) == 2, 30, "two workers")
    held = tasks.block_until_released.enqueue("held", 30)
    wait_until(lambda: r.lrange(tasks.LOG, 0, -1) == ["started:held"], 30, "the job's start")
    victim = int(backend.get_result(held.id).worker_ids[0].split(":")[-2])

    os.kill(victim, signal.SIGTERM)
    procs.expect(pool, "SIGTERM received, finishing the job in hand")
    if sigterms == 2:
        os.kill(victim, signal.SIGTERM)
        procs.expect(pool, "SIGTERM again, giving the running job back to its queue")
        # Until the victim exits, Redis holds its BLPOP, which would take the release.
        wait_until(lambda: not process_exists(victim), 30, "the victim's exit")
    r.rpush("test:release", 1)  # the job ends, in the victim or, given back, elsewhere
    assert held.wait(timeout=30) is True

    def two_workers_without_the_victim() -> set[int] | None:
        pids = live_worker_pids(backend)
        return pids if len(pids) == 2 and victim not in pids else None

    pids = wait_until(two_workers_without_the_victim, 30, "a new worker in the victim's place")
    a = tasks.rendezvous.enqueue("a", "b", 20)  # they meet only if both run at once
    b = tasks.rendezvous.enqueue("b", "a", 20)
    assert a.wait(timeout=30) is True and b.wait(timeout=30) is True
    ran_on = {backend.get_result(job.id).worker_ids[-1].split(":")[-2] for job in (a, b)}
    assert {int(pid) for pid in ran_on} == pids

    output = procs.stop(pool)
    assert pool.returncode == 0, output
    assert f"Worker process {victim} exited (code 0) while the pool was not stopping" in output


# --max-memory


def test_resident_set_size_is_this_process_s_rss_now():
    with open("/proc/self/status") as status:
        vm_rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))
    assert abs(memory.resident_set_size() - vm_rss) < 0.1 * vm_rss


def test_without_proc_the_peak_rss_is_read(monkeypatch):
    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/self/statm")

    monkeypatch.setattr(memory, "open", no_proc, raising=False)
    assert memory.resident_set_size() >= 10 * memory.MB  # ru_maxrss is in KiB on Linux


def test_a_single_worker_past_max_memory_stops_after_the_job_in_hand(r, backend):
    jobs = [tasks.record.enqueue(f"job{i}") for i in range(3)]
    run_worker_here(backend, max_memory=1)  # any Python process is past 1 MB
    assert r.lrange(tasks.LOG, 0, -1) == ["job0"]
    assert backend.get_result(jobs[0].id).status == TaskResultStatus.SUCCESSFUL
    assert backend.get_result(jobs[1].id).status == TaskResultStatus.READY


def test_the_pool_replaces_a_worker_past_max_memory_at_once(r, backend, app, start_worker, procs):
    worker = start_worker("--concurrency", "2", "--max-memory", "100")
    first = wait_until(lambda: len(live_worker_pids(backend)) == 2 and live_worker_pids(backend))

    hog = app.hog.enqueue(80)  # about 50 MB at start, so past 100 MB after it
    hog_pid = hog.wait(timeout=30)
    assert hog_pid in first

    def replaced_by_a_new_one():
        pids = live_worker_pids(backend)
        return pids if hog_pid not in pids and len(pids) == 2 else None

    replaced = wait_until(replaced_by_a_new_one, 30, "a new worker in place of the hog's")
    adds = [tasks.add.enqueue(i, i) for i in range(4)]
    assert [job.wait(timeout=30) for job in adds] == [0, 2, 4, 6]

    output = procs.stop(worker)
    assert worker.returncode == 0, output
    assert r.get("test:hogs") == "1"  # it ran once, and its outcome was stored
    assert backend.get_result(hog.id).status == TaskResultStatus.SUCCESSFUL
    over = rf"Worker \S+:{hog_pid}:\w+: RSS \d+ MB over --max-memory 100 MB; exiting to be"
    assert re.search(over, output), output
    assert f"Worker process {hog_pid} recycled; starting a new one" in output
    assert "Restarting it in" not in output  # no crash-loop delay
    assert first - {hog_pid} <= replaced  # the other worker went on


# --reload


def test_reload_restarts_the_worker_on_a_change_and_the_running_job_finishes_once(
    r, backend, app, start_worker, procs
):
    edited = Path(app.__file__).with_name("edited.py").resolve()
    worker = start_worker("--reload")
    procs.expect(worker, "Watching for file changes")
    before = app.version.enqueue()
    assert before.wait(timeout=30) == 1

    running = app.held_until_released.enqueue()
    wait_until(lambda: r.lrange(tasks.LOG, 0, -1) == ["started"], 30, "the job's start")
    edited.write_text(VERSION.format(value="the second version"))
    procs.expect(worker, f"Reloading: {edited} changed")
    r.set("test:released", 1)

    after = app.version.enqueue()
    assert after.wait(timeout=30) == "the second version"
    assert running.wait(timeout=5) == int(before.worker_ids[0].split(":")[-2])  # old process
    assert r.lrange(tasks.LOG, 0, -1) == ["started", "done"]  # once
    after.refresh()
    assert after.worker_ids != before.worker_ids  # a new process

    output = procs.stop(worker)  # the parent passes SIGTERM on to the worker
    assert worker.returncode == 0, output
    assert live_worker_pids(backend) == set()  # the worker stopped too, cleanly
    assert "given back" not in output


def test_reload_waits_for_a_fix_after_a_broken_tasks_module(app, start_worker, procs):
    edited = Path(app.__file__).with_name("edited.py").resolve()
    edited.write_text("def version(:\n")
    worker = start_worker("--reload")
    procs.expect(worker, "Could not import the tasks modules; waiting for a change")
    procs.expect(worker, "Watching for file changes")
    assert worker.poll() is None
    edited.write_text(VERSION.format(value="fixed"))
    procs.expect(worker, f"Reloading: {edited} changed")
    assert app.version.enqueue().wait(timeout=30) == "fixed"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_a_change_stops_once_and_the_job_is_given_back_after_the_grace(tmp_path):
    watcher = ReloadWatcher(grace=0.05)
    calls = []
    watcher.attach(lambda: calls.append("stop"), lambda: calls.append("give back"))
    watcher.start()
    try:
        for name in ("messages.mo", "tasks.py", "views.py"):  # .mo: Django reloads it
            autoreload.file_changed.send(sender=watcher.reloader, file_path=tmp_path / name)
        wait_until(lambda: calls == ["stop", "give back"], 5, "the stop, then the give-back")
        assert watcher.changed == tmp_path / "tasks.py"
        with pytest.raises(SystemExit) as exited:
            watcher.exit_if_changed()
        assert exited.value.code == RELOAD_EXIT_CODE
    finally:
        watcher.reloader.stop()


# --log-format json


def test_json_log_has_one_object_per_line_and_a_start_and_an_end_line_per_job(r, backend):
    ok = tasks.add.enqueue(2, 3)
    failed = tasks.fail.enqueue("boom")
    unreadable = tasks.add.using(queue_name="low").enqueue(1, 1)
    r.hset(as_hash(r, backend.keys, unreadable.id), "payload", "\x00{not json")

    done = manage("runworker", "--burst", "--log-format", "json")
    assert done.returncode == 0, done.stderr

    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    by_job = {line["job_id"]: line for line in lines if "duration_ms" in line}  # the ends
    assert [(line["job_id"], line["status"]) for line in lines if "job_id" in line] == [
        (ok.id, "RUNNING"),
        (ok.id, "SUCCESSFUL"),
        (failed.id, "RUNNING"),
        (failed.id, "FAILED"),
        (unreadable.id, "FAILED"),  # never started
    ]
    assert by_job[ok.id]["task"] == "tests.support.tasks.add"
    assert by_job[ok.id]["queue"] == "default"
    assert by_job[ok.id]["status"] == "SUCCESSFUL"
    assert by_job[ok.id]["attempt"] == 1
    assert by_job[ok.id]["duration_ms"] >= 0 and by_job[ok.id]["wait_ms"] >= 0
    assert by_job[failed.id]["status"] == "FAILED" and by_job[failed.id]["level"] == "ERROR"
    assert "ValueError: boom" in by_job[failed.id]["error"]
    assert by_job[unreadable.id]["status"] == "FAILED"
    assert by_job[unreadable.id]["queue"] == "low"
    messages = [line["message"] for line in lines]
    assert any(m.startswith("django-redisqueue worker, backend 'default'") for m in messages)
    assert any(m.endswith("stopped after 3 job(s)") for m in messages)


def burst_with_logging(
    project_logging: str, log_format: str, *options: str
) -> subprocess.CompletedProcess:
    """``runworker --burst --log-format LOG_FORMAT OPTIONS`` under the project LOGGING
    named by ``project_logging`` (tests/support/settings_logging.py)."""
    env = {
        **child_env(),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings_logging",
        "REDISQUEUE_TEST_LOGGING": project_logging,
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "runworker",
            "--burst",
            "--log-format",
            log_format,
            *options,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "project_logging", ["django-debug", "root", "django", "app", "unconfigured", ""]
)
def test_every_line_is_json_whatever_the_project_s_logging(r, backend, project_logging):
    ok = tasks.add.enqueue(2, 3)
    failed = tasks.fail.enqueue("boom")
    logging_task = tasks.logs_and_warns.enqueue("careful")
    done = burst_with_logging(project_logging, "json")
    assert done.returncode == 0, done.stderr

    output = (done.stdout + done.stderr).splitlines()
    not_json = [line for line in output if not is_json_object(line)]
    assert not not_json, "\n".join(not_json[:20])
    lines = [json.loads(line) for line in output]
    job_lines = {line["job_id"]: line for line in lines if "job_id" in line}
    assert job_lines.keys() == {ok.id, failed.id, logging_task.id}
    assert "ValueError: boom" in job_lines[failed.id]["error"]
    assert "careful\nsecond line" in {line["message"] for line in lines}
    assert any("KeyError: 'careful'" in line.get("error", "") for line in lines)
    assert any("RuntimeWarning: careful" in line["message"] for line in lines)
    assert any("(tests.W001) a warning of the project's" in line["message"] for line in lines)
    # What a task prints, or writes to sys.stderr itself.
    messages = {line["message"] for line in lines}
    assert {"careful printed", "over two lines", "careful written to stderr"} <= messages


@pytest.mark.parametrize(
    ("project_logging", "log_format", "concurrency"),
    [
        *[
            (project_logging, log_format, "1")
            for project_logging in ("", "django-debug", "root", "unconfigured")
            for log_format in ("text", "json")
        ],
        ("root", "text", "2"),  # forked processes
    ],
)
def test_each_job_s_start_and_end_is_one_record_and_a_traceback_is_printed_once(
    r, backend, project_logging, log_format, concurrency
):
    """Django's tasks framework logs each state change from its signal receivers; the
    worker logs the same events itself, so runworker leaves the framework's lines out,
    whatever the project's LOGGING: Django's default (with DEBUG off, then on), a root
    handler, none at all."""
    ok = tasks.add.enqueue(2, 3)
    failed = tasks.fail.enqueue("boom")
    done = burst_with_logging(project_logging, log_format, "--concurrency", concurrency)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr

    def records(job_id: str) -> list[str]:
        return [line for line in output.splitlines() if job_id in line]

    assert len(records(ok.id)) == 2, output  # started, SUCCESSFUL
    assert len(records(failed.id)) == 2, output  # started, FAILED
    assert "started" in records(ok.id)[0] and "SUCCESSFUL" in records(ok.id)[1]
    assert "started" in records(failed.id)[0] and "FAILED" in records(failed.id)[1]
    assert output.count("Traceback (most recent call last)") == 1, output
    assert output.count("raise ValueError(message)") == 1, output  # the task's frame
    assert "Task id=" not in output
    assert tasks.fail.get_result(failed.id).status == TaskResultStatus.FAILED


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


some_text = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["\n", "\r\n", '"}\n{"', "\u2028", "\x00"]
)


@given(
    job_id=some_text,
    task=some_text,
    queue=some_text,
    status=some_text,
    duration=st.floats(0, 1e6),
    attempt=st.integers(1, 10**6),
    wait=st.none() | st.floats(0, 1e6),
    message=some_text,
)
def test_json_lines_stay_one_line_of_the_job_s_fields_whatever_redis_held(
    job_id, task, queue, status, duration, attempt, wait, message
):
    event = JobEvent(job_id, task, queue, status, duration, attempt, wait)
    record = logging.LogRecord(
        "django_redisqueue.runtime.worker", logging.INFO, __file__, 1, "%s", (message,), None
    )
    record.__dict__.update(job_fields(event))

    line = JsonFormatter().format(record)

    assert "\n" not in line and "\r" not in line
    parsed = json.loads(line)
    assert parsed["message"] == message
    assert (parsed["job_id"], parsed["task"], parsed["queue"]) == (job_id, task, queue)
    assert (parsed["status"], parsed["attempt"]) == (status, attempt)
    assert parsed["duration_ms"] == pytest.approx(duration * 1000, abs=1e-3)
    if wait is None:
        assert "wait_ms" not in parsed
    else:
        assert parsed["wait_ms"] == pytest.approx(wait * 1000, abs=1e-3)


def test_a_json_lines_stream_is_as_usable_as_the_stream_it_wraps(tmp_path):
    """Under --log-format json, sys.stdout and sys.stderr are JsonLines: code that asks
    them for an encoding, a buffer or a file descriptor (faulthandler) still works."""
    from django_redisqueue.observe.logformat import JsonLines

    with open(tmp_path / "out", "w+", encoding="utf-8") as raw:
        lines = JsonLines(raw, "py.stdout", logging.INFO)
        assert lines.encoding == "utf-8" and lines.fileno() == raw.fileno()
        lines.write('one\n{"already": "json"}\npart')
        lines.buffer.flush()
        lines.flush()
        raw.seek(0)
        written = [json.loads(line) for line in raw.read().splitlines()]
    assert [line.get("message", line.get("already")) for line in written] == [
        "one",
        "json",
        "part",
    ]
