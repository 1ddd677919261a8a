"""``manage.py runworker`` in subprocesses: draining, results, failures, signals."""

import logging
import signal
import sys
import threading

import pytest
import redis

from django_redisqueue import ResultTimeout, TaskFailed, task
from django_redisqueue.compat import TaskResultStatus, task_backends, task_finished
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.scheduler_watch import NO_SCHEDULER_NOTE
from django_redisqueue.store.queries import Queries
from tests.conftest import (
    manage,
    not_on_cluster,
    private_redis,
    run_worker_here,
    start_manage,
    wait_until,
)
from tests.support import tasks
from tests.support.entries import as_hash
from tests.support.keys import DEFAULT_KEYS


def test_burst_drains_every_queue_in_priority_order_and_exits_0(r):
    for i in range(5):
        tasks.record.using(queue_name="low").enqueue(f"low{i}")
    for i in range(5):
        tasks.record.enqueue(f"default{i}")
    for i in range(5):
        tasks.urgent.enqueue(f"high{i}")

    done = manage("runworker", "--burst")

    assert done.returncode == 0, done.stderr
    expected = [f"{q}{i}" for q in ("high", "default", "low") for i in range(5)]
    assert r.lrange(tasks.LOG, 0, -1) == expected
    assert "tests.support.tasks.record" in done.stdout  # the banner lists the registered tasks
    assert done.stderr.count("SUCCESSFUL") == 15  # one log line per job


def test_results_and_wait(backend):
    ok = tasks.add.enqueue(2, 3)
    bad = tasks.fail.enqueue("boom")
    assert manage("runworker", "--burst").returncode == 0

    assert ok.wait(timeout=5) == 5
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL
    assert ok.return_value == 5
    assert ok.finished_at >= ok.started_at >= ok.enqueued_at
    assert len(ok.worker_ids) == 1

    with pytest.raises(TaskFailed, match="ValueError: boom"):
        bad.wait(timeout=5)
    stored = backend.get_result(bad.id)
    assert stored.status == TaskResultStatus.FAILED
    assert stored.errors[0].exception_class_path == "builtins.ValueError"
    assert "raise ValueError(message)" in stored.errors[0].traceback


def test_wait_blocks_until_a_running_worker_finishes_the_job(r):
    worker = start_manage("runworker")
    try:
        result = tasks.add.enqueue(20, 22)
        assert result.wait(timeout=30) == 42
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def test_wait_times_out(r):
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(ResultTimeout):
        result.wait(timeout=0.2)
    assert isinstance(ResultTimeout("x"), TimeoutError)


def test_bad_jobs_fail_with_a_reason_and_the_worker_goes_on(r, backend):
    unknown = tasks.add.enqueue(1, 2)
    job_key = as_hash(r, DEFAULT_KEYS, unknown.id)
    r.hset(
        job_key,
        "payload",
        r.hget(job_key, "payload").replace("tests.support.tasks.add", "os.system"),
    )
    garbage = tasks.add.enqueue(1, 2)
    r.hset(as_hash(r, DEFAULT_KEYS, garbage.id), "payload", "\x00{not json")
    future = tasks.add.enqueue(1, 2)
    r.hset(as_hash(r, DEFAULT_KEYS, future.id), "payload", '{"v": 99, "task": "x"}')
    r.zadd(DEFAULT_KEYS.queue("default"), {"orphan-id": 10**16})  # an id with no job
    bad_return = tasks.returns_object.enqueue()
    good = tasks.add.enqueue(2, 2)

    done = manage("runworker", "--burst")
    assert done.returncode == 0, done.stderr

    def reason(job_id):
        stored = backend.get_result(job_id)
        assert stored.status == TaskResultStatus.FAILED
        return stored.errors[-1].traceback

    # A task this worker does not know waits for one that does (test_unknown_tasks.py).
    assert backend.get_result(unknown.id).status == TaskResultStatus.READY
    assert r.zscore(DEFAULT_KEYS.delayed("default"), unknown.id) is not None
    assert "'os.system' is not registered in worker" in done.stderr
    assert "not valid JSON" in reason(garbage.id)
    assert "envelope version 99 is not supported" in reason(future.id)
    assert "no payload is stored" in reason("orphan-id")
    assert "Unsupported type" in reason(bad_return.id)
    assert backend.get_result(good.id).return_value == 4


def test_sigterm_finishes_the_running_job_and_takes_no_new_one(r, backend):
    running = tasks.block_until_released.enqueue("first", 30)
    waiting = tasks.record.enqueue("second")
    worker = start_manage("runworker")
    try:
        wait_until(lambda: "started:first" in r.lrange(tasks.LOG, 0, -1), 30, "job start")
        worker.send_signal(signal.SIGTERM)
        r.rpush("test:release", 1)
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
    assert backend.get_result(running.id).return_value is True
    assert backend.get_result(waiting.id).status == TaskResultStatus.READY
    assert r.lrange(tasks.LOG, 0, -1) == ["started:first", "done:first"]


def test_concurrency_runs_jobs_at_the_same_time(backend):
    a = tasks.rendezvous.enqueue("a", "b", 20)
    b = tasks.rendezvous.enqueue("b", "a", 20)
    done = manage("runworker", "--burst", "--concurrency", "2")
    assert done.returncode == 0, done.stderr
    assert backend.get_result(a.id).return_value is True
    assert backend.get_result(b.id).return_value is True
    workers = backend.get_result(a.id).worker_ids + backend.get_result(b.id).worker_ids
    assert len(set(workers)) == 2


def test_max_jobs_and_named_queues(r):
    for i in range(3):
        tasks.record.using(queue_name="low").enqueue(f"low{i}")
    tasks.urgent.enqueue("high")

    done = manage("runworker", "low", "--max-jobs", "2")
    assert done.returncode == 0, done.stderr
    assert r.lrange(tasks.LOG, 0, -1) == ["low0", "low1"]


def test_weighted_queues_let_the_low_queue_through(r):
    for i in range(12):
        tasks.urgent.enqueue(f"high{i}")
        tasks.record.using(queue_name="low").enqueue(f"low{i}")

    done = manage("runworker", "high:2", "low:1", "--max-jobs", "6")
    assert done.returncode == 0, done.stderr
    log = r.lrange(tasks.LOG, 0, -1)
    assert sorted(log) == sorted(["high0", "high1", "high2", "high3", "low0", "low1"])


def test_takes_context_and_django_task(backend):
    ctx = tasks.attempt_number.enqueue("x")
    doubled = tasks.made_by_django.enqueue(21)
    assert manage("runworker", "--burst").returncode == 0
    assert ctx.wait(timeout=5) == {"label": "x", "attempt": 1, "id": ctx.id}
    assert doubled.wait(timeout=5) == 42


def test_one_runworker_serves_several_backends_each_by_its_own_processes():
    jobs = [tasks.add.enqueue(1, 2), tasks.add.using(backend="leased").enqueue(3, 4)]
    done = manage("runworker", "--burst", "--backend", "default", "--backend", "leased")
    assert done.returncode == 0, done.stderr
    assert [job.wait(timeout=5) for job in jobs] == [3, 7]
    assert "Started 2 worker processes" in done.stderr
    assert done.stdout.count("django-redisqueue worker, backend") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "Queue 'nope' is not one of backend 'default'"),
        (["high:0"], "must be a whole number >= 1"),
        (["--backend", "missing"], "No task backend 'missing'"),
        (["--backend", "default", "--backend", "default"], "A backend is given twice"),
        (["--backend", "default", "--backend", "leased", "high"], "go with one --backend"),
    ],
)
def test_bad_arguments_are_command_errors(args, message):
    done = manage("runworker", "--burst", *args)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.django_db  # the worker closes stale DB connections around each job
def test_signals_are_sent_around_each_job(backend):
    from django_redisqueue.compat import task_enqueued, task_finished, task_started
    from django_redisqueue.runtime.worker import Worker

    seen, stored_when_finished = [], []

    def receiver(signal, sender, task_result, **kwargs):
        seen.append((signal, sender, task_result.id, task_result.status))
        if signal is task_finished:
            stored_when_finished.append(backend.get_result(task_result.id).status)

    for signal_ in (task_enqueued, task_started, task_finished):
        signal_.connect(receiver)
    try:
        job = tasks.add.enqueue(1, 2)
        failing = tasks.fail.enqueue("no")
        Worker(backend, burst=True).run()
    finally:
        for signal_ in (task_enqueued, task_started, task_finished):
            signal_.disconnect(receiver)

    by_signal = [(s, job_id, status) for s, sender, job_id, status in seen]
    assert by_signal == [
        (task_enqueued, job.id, TaskResultStatus.READY),
        (task_enqueued, failing.id, TaskResultStatus.READY),
        (task_started, job.id, TaskResultStatus.RUNNING),
        (task_finished, job.id, TaskResultStatus.SUCCESSFUL),
        (task_started, failing.id, TaskResultStatus.RUNNING),
        (task_finished, failing.id, TaskResultStatus.FAILED),
    ]
    assert {sender for _, sender, _, _ in seen} == {type(backend)}
    # task_finished is sent once the outcome is stored: a receiver can read it back.
    assert stored_when_finished == [TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED]


@task
def big_result(size):
    return "x" * size


def test_a_return_value_over_the_size_limit_fails_the_job(backend):
    job = big_result.enqueue(600_000)  # MAX_PAYLOAD_BYTES is 524,288
    run_worker_here(backend)
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.FAILED
    assert "over the 524288-byte MAX_PAYLOAD_BYTES limit" in stored.errors[0].traceback


def test_a_job_whose_lease_is_lost_is_stopped_and_the_worker_goes_on(r):
    """The heartbeat finds the job taken from the worker (as after a stall longer than
    the lease): the task is interrupted, its late outcome refused, the next job runs."""
    backend = task_backends["leased"]  # 1 s leases: a heartbeat every 1/3 s
    job = tasks.block_until_released.using(backend="leased").enqueue("lost", 30)
    after = tasks.add.using(backend="leased").enqueue(1, 1)

    def steal_the_lease():
        wait_until(lambda: "started:lost" in r.lrange(tasks.LOG, 0, -1), 30, "the start")
        r.hset(backend.keys.job(job.id), "owner", "another-worker/2")

    thief = threading.Thread(target=steal_the_lease)
    thief.start()
    run_worker_here(backend)
    thief.join()

    assert "done:lost" not in r.lrange(tasks.LOG, 0, -1)  # interrupted, not released
    assert backend.get_result(job.id).status == TaskResultStatus.RUNNING  # not ours now
    assert backend.get_result(after.id).return_value == 2


@not_on_cluster
def test_a_job_that_outlasts_redis_idle_timeout_is_stored_once_and_the_next_runs(caplog):
    """A server with ``timeout`` closes a connection idle that long: the worker's own
    connection, idle while its job runs. The outcome still reaches Redis, once, on a
    new connection (no call taken for a lost reply, nothing said in the log), and the
    worker goes on."""
    with private_redis("--timeout", "1"):
        backend = task_backends["default"]
        long = tasks.outlast_idle_connections.enqueue(30)
        after = tasks.add.enqueue(1, 2)
        with caplog.at_level(logging.WARNING, logger="django_redisqueue"):
            worker = run_worker_here(backend)
        assert [r.getMessage() for r in caplog.records] == []
        result = backend.get_result(long.id)
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert (result.attempts, len(result.worker_ids)) == (1, 1)
        assert after.wait(timeout=5) == 3
        assert worker.jobs_done == 2


def test_times_come_from_redis_and_share_one_precision(backend):
    job = tasks.add.enqueue(1, 2)
    run_worker_here(backend)
    stored = backend.get_result(job.id)
    stamps = [stored.enqueued_at, stored.started_at, stored.last_attempted_at]
    assert stored.enqueued_at <= stored.started_at <= stored.finished_at
    assert all(stamp.microsecond % 1000 == 0 for stamp in [*stamps, stored.finished_at])


def test_a_failed_job_logs_its_exception_and_traceback(backend, caplog):
    job = tasks.fail.enqueue("boom")
    with caplog.at_level(logging.INFO):
        run_worker_here(backend)
    ours = [
        r
        for r in caplog.records
        if r.name == "django_redisqueue.runtime.worker" and job.id in r.message
    ]
    assert len(ours) == 2 and "started" in ours[0].getMessage()  # its start, its end
    django = [r for r in caplog.records if "state=FAILED" in r.getMessage()]
    assert "FAILED" in ours[-1].getMessage() and "ValueError: boom" in ours[-1].getMessage()
    # In-process (a test's worker), Django's own log line of the failure stays, for
    # assertLogs("django.tasks"); runworker leaves it out (test_worker_ops.py).
    for record in (ours[-1], *django):
        assert record.exc_info and record.exc_info[0] is ValueError
    assert django, "Django's task_finished log line"


def test_a_failed_job_s_signal_is_sent_while_its_exception_is_handled(backend):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.status, sys.exc_info()[0]))

    tasks.fail.enqueue("boom")
    task_finished.connect(receiver)
    try:
        run_worker_here(backend)
    finally:
        task_finished.disconnect(receiver)
    assert seen == [(TaskResultStatus.FAILED, ValueError)]


def scheduler_stepped(backend) -> bool:
    queries = backend.queries
    return bool(queries.live_schedulers(queries.clock_ms(), 1))


def test_a_worker_without_a_scheduler_says_so_at_start_and_on_a_retry_line(r, procs):
    worker = procs.start("runworker")
    procs.expect(worker, "jobs (run_after, delay) will not run until manage.py runscheduler runs")
    tasks.always_fails.enqueue("alone")  # retries=3, backoff 0.2 s
    procs.expect(worker, f"again in 0.2 s{NO_SCHEDULER_NOTE}")
    output = procs.stop(worker)
    assert output.count("no scheduler has stepped in the last 10 s") == 2, output
    assert r.llen("test:attempts:alone") == 1  # its retry is still delayed


def test_a_worker_with_a_scheduler_running_says_nothing_of_it(r, backend, procs):
    scheduler = procs.start("runscheduler")
    wait_until(lambda: scheduler_stepped(backend), 30, "the scheduler's first step")
    worker = procs.start("runworker")
    job = tasks.always_fails.enqueue("watched")
    with pytest.raises(TaskFailed, match="attempt failed: watched"):
        job.wait(timeout=60)  # its three retries ran
    output = procs.stop(worker)
    procs.stop(scheduler)
    assert output.count("; again in ") == 3, output
    assert "no scheduler" not in output


def test_a_busy_worker_asks_whether_a_scheduler_runs_once_in_a_while(monkeypatch, caplog):
    looks = []
    live_schedulers = Queries.live_schedulers

    def counted(self, *args, **kwargs):
        looks.append(args)
        return live_schedulers(self, *args, **kwargs)

    monkeypatch.setattr(Queries, "live_schedulers", counted)
    for i in range(10):
        tasks.always_fails.enqueue(f"busy{i}")
    with caplog.at_level(logging.WARNING, logger=WORKER_LOGGER):
        worker = run_worker_here(task_backends["default"])
    assert worker.jobs_done == 10
    retries = [m for m in caplog.messages if "; again in " in m]
    assert len(retries) == 10 and all(m.endswith(NO_SCHEDULER_NOTE) for m in retries)
    assert len(looks) == 1  # within SCHEDULER_LOOK_EVERY of the first
    # A burst worker leaves delayed jobs for later by design: it says nothing at start.
    assert not [m for m in caplog.messages if "will not run until" in m]


def test_a_redis_error_while_asking_for_a_scheduler_leaves_the_notice_out(r, monkeypatch, caplog):
    def refused(self, *args, **kwargs):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(Queries, "live_schedulers", refused)
    job = tasks.always_fails.enqueue("unknown")
    with caplog.at_level(logging.WARNING, logger=WORKER_LOGGER):
        worker = run_worker_here(task_backends["default"])
    assert worker.jobs_done == 1
    [retry] = [m for m in caplog.messages if "; again in " in m]
    assert retry.endswith("; again in 0.2 s")  # unknown: nothing said
    assert "no scheduler" not in caplog.text
    assert r.zscore(DEFAULT_KEYS.delayed("default"), job.id) is not None  # the retry stored
