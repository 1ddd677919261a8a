"""No job lost: workers killed at every point, Redis restarted, hostile payloads.

Each test runs its own redis-server (AOF on where it restarts it) and real
``runworker`` / ``runscheduler`` processes in their own process groups. Jobs use the
``leased`` backend (1 s leases) so that lost jobs come back quickly.
"""

import json
import logging
import os
import random
import signal
from unittest import mock

import pytest
import redis
from redis.exceptions import RedisClusterException

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.exceptions import BrokerUnavailable
from django_redisqueue.store.gateway import Reconnector, answered, reply_lost
from tests.conftest import private_redis, wait_until
from tests.support import tasks

LEASED = ("--backend", "leased")


@pytest.fixture
def server():
    with private_redis("--appendonly", "yes", "--appendfsync", "always") as server:
        yield server


@pytest.fixture
def rr(server):
    return redis.Redis.from_url(server.url, decode_responses=True)


def result(job_id):
    return task_backends["leased"].get_result(job_id)


def all_finished(ids):
    return all(result(i).status == TaskResultStatus.SUCCESSFUL for i in ids)


def test_kill_chaos_loses_nothing(rr, procs, report):
    jobs = 3000
    ids = [tasks.ledger.using(backend="leased").enqueue(i, 2).id for i in range(jobs)]
    procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *LEASED) for _ in range(3)]
    kills = 0
    rng = random.Random(7)
    # The chaos is paced by progress, not by the clock: a worker is killed each time 60
    # more jobs have run, however slowly a busy host starts the workers again.
    while (done := rr.llen("test:ledger")) < jobs:
        target = min(done + 60, jobs)
        wait_until(lambda t=target: rr.llen("test:ledger") >= t, 120, f"{target} jobs run")
        if target == jobs:
            break
        victim = rng.randrange(len(workers))
        procs.kill(workers[victim])
        kills += 1
        workers[victim] = procs.start("runworker", *LEASED)
    wait_until(lambda: all_finished(ids), 120, "every job to finish")

    ran = rr.lrange("test:ledger", 0, -1)
    lost = jobs - len(set(ran))
    duplicates = len(ran) - len(set(ran))
    report(f"kill chaos: jobs={jobs} kills={kills} lost={lost} duplicates={duplicates}")
    assert lost == 0
    assert duplicates <= kills * 1  # each worker process runs one job at a time


@pytest.mark.parametrize(
    ("task", "window"),
    [
        (tasks.crash_on_start, "after claim, before start"),
        (tasks.crash_mid_job, "mid-job"),
        (tasks.pause_before_finish, "after the body, before the result is stored"),
    ],
)
def test_a_worker_killed_at_any_point_loses_nothing(rr, procs, report, task, window):
    job = task.using(backend="leased").enqueue()
    first = procs.start("runworker", *LEASED)
    wait_until(lambda: result(job.id).status == TaskResultStatus.RUNNING, 30, "the claim")
    if task is tasks.pause_before_finish:
        wait_until(lambda: "body done, attempt 1" in rr.lrange(tasks.LOG, 0, -1), 30, "body")
        procs.kill(first)
        rr.client_unpause()
    else:
        assert first.wait(timeout=30) == -signal.SIGKILL  # the worker died by itself
        procs.running.remove(first)
    assert result(job.id).status == TaskResultStatus.RUNNING  # lost with its worker

    procs.start("runscheduler", *LEASED)
    procs.start("runworker", *LEASED)
    wait_until(lambda: result(job.id).status == TaskResultStatus.SUCCESSFUL, 30, "a rerun")
    stored = result(job.id)
    report(f"killed {window}: attempts={stored.attempts} status={stored.status}")
    assert stored.return_value == "attempt 2"
    assert stored.attempts == 2


def test_a_job_longer_than_its_lease_runs_once(rr, procs):
    job = tasks.sleep_for.using(backend="leased").enqueue(3.5)  # the lease is 1 s
    procs.start("runscheduler", *LEASED)
    procs.start("runworker", *LEASED)
    wait_until(lambda: result(job.id).status == TaskResultStatus.SUCCESSFUL, 30, "the job")
    assert result(job.id).attempts == 1


def test_a_stalled_worker_loses_its_job_and_its_late_finish_is_refused(rr, procs, report):
    job = tasks.held.using(backend="leased").enqueue(60)
    stalled = procs.start("runworker", *LEASED)
    wait_until(lambda: "started:1" in rr.lrange(tasks.LOG, 0, -1), 30, "the first attempt")
    os.killpg(stalled.pid, signal.SIGSTOP)

    procs.start("runscheduler", *LEASED)
    other = procs.start("runworker", *LEASED)
    wait_until(lambda: "started:2" in rr.lrange(tasks.LOG, 0, -1), 30, "the second attempt")
    rr.rpush("test:release:2", 1)
    wait_until(lambda: result(job.id).status == TaskResultStatus.SUCCESSFUL, 30, "the rerun")

    os.killpg(stalled.pid, signal.SIGCONT)
    rr.rpush("test:release:1", 1)  # the stalled attempt now finishes too...
    output = procs.stop(stalled)
    stored = result(job.id)
    assert "lease ran out before it finished" in output  # ...and is refused
    assert stored.return_value == other.pid
    assert stored.attempts == 2
    report(f"stalled worker: refused late finish, attempts={stored.attempts}")


def test_workers_and_scheduler_survive_a_redis_restart(server, rr, procs, report):
    jobs = 600
    ids = [tasks.ledger.using(backend="leased").enqueue(i, 5).id for i in range(jobs)]
    delayed = tasks.ledger.using(backend="leased", delay=3).enqueue(-1, 0)
    scheduler = procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *LEASED) for _ in range(2)]
    wait_until(lambda: rr.llen("test:ledger") >= 100, 60, "some jobs to run")

    server.kill()
    with pytest.raises(BrokerUnavailable, match="did not answer"):
        tasks.ledger.using(backend="leased").enqueue(0, 0)
    for process in (scheduler, *workers):
        procs.expect(process, "Redis unreachable")
    server.start()

    wait_until(lambda: all_finished([*ids, delayed.id]), 120, "every job to finish")
    outputs = [procs.stop(p) for p in (scheduler, *workers)]
    ran = rr.lrange("test:ledger", 0, -1)
    duplicates = len(ran) - len(set(ran))
    report(f"redis restart: jobs={jobs + 1} lost=0 duplicates={duplicates}")
    for output in outputs:
        assert "Redis unreachable" in output
        assert "Redis reachable again" in output
    assert set(ran) == {str(i) for i in range(-1, jobs)}


def test_redis_loading_its_data_is_a_refusal_that_workers_wait_out(server, rr, procs):
    """A Redis restarted on its data answers LOADING until it has read it: nothing
    ran, so the enqueue says Redis refused it, and a worker waits with backoff, saying
    so, then runs the jobs queued once the data is in."""
    if int(rr.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("Redis 6.2 answers clients only every 2 MB it loads: mostly silence")
    rr.eval("for i = 1, 10000 do redis.call('SET', 'padding:' .. i, i) end", 0)
    worker = procs.start("runworker", *LEASED)
    first = tasks.ledger.using(backend="leased").enqueue("first", 0)
    wait_until(lambda: all_finished([first.id]), 60, "the worker to run a job")
    rr.bgrewriteaof()  # the data in an RDB base, whose keys the delay slows down
    wait_until(lambda: rr.info("persistence")["aof_rewrite_in_progress"] == 0, 30, "rewrite")
    server.kill()
    # A key every ms, and clients answered every KB read (not every 2 MB).
    slow_load = ("--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
    server.extra_args = (*server.extra_args, *slow_load)
    server.start(loaded=False)
    loading = redis.Redis.from_url(server.url)
    assert loading.info("persistence")["loading"] == 1
    with pytest.raises(BrokerUnavailable, match=r"Redis refused it .*loading"):
        tasks.ledger.using(backend="leased").enqueue("refused", 0)
    # The worker, idle on the server killed, retries with backoff: well within the
    # seconds of loading, one of its retries meets LOADING.
    procs.expect(worker, "Redis refused a command", timeout=60)
    wait_until(lambda: loading.info("persistence")["loading"] == 0, 120, "the data loaded")
    after = tasks.ledger.using(backend="leased").enqueue("after", 0)
    wait_until(lambda: all_finished([after.id]), 60, "the job queued after to run")
    procs.expect(worker, "Redis reachable again")
    assert sorted(rr.lrange("test:ledger", 0, -1)) == ["after", "first"]


def test_a_job_that_kills_its_worker_fails_while_the_others_finish(rr, procs, report):
    poison = tasks.kill_own_worker.using(backend="leased").enqueue()
    ids = [tasks.ledger.using(backend="leased").enqueue(i, 1).id for i in range(200)]
    procs.start("runscheduler", *LEASED)
    pool = procs.start("runworker", "--concurrency", "2", *LEASED)
    wait_until(lambda: result(poison.id).status == TaskResultStatus.FAILED, 60, "the poison")
    wait_until(lambda: all_finished(ids), 60, "the other jobs")
    stored = result(poison.id)
    report(f"poison job: attempts={stored.attempts} status={stored.status}, 200/200 others")
    assert stored.errors[-1].exception_class_path.endswith("WorkerLost")
    assert stored.attempts == 3  # MAX_RECOVERIES = 2
    assert pool.poll() is None  # the pool replaced its dead children and goes on


def test_hostile_payloads_fail_with_a_reason_and_the_worker_lives_on(rr, procs, report):
    backend = task_backends["default"]
    keys = backend.keys
    rng = random.Random(11)
    garbage = {
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(1000)
    }
    raw = redis.Redis.from_url(os.environ["REDISQUEUE_TEST_URL"])
    raw.zadd(keys.queue("default"), dict.fromkeys(garbage, 0))

    good = json.dumps({"v": 1, "task": "tests.support.tasks.add", "args": [1, 2], "kwargs": {}})
    bad_payloads = {
        "truncated": good[:25],
        "not-an-object": "[1, 2, 3]",
        "version-2": good.replace('"v": 1', '"v": 2'),
        "no-version": good.replace('"v": 1, ', ""),
        "unknown-task": good.replace("tests.support.tasks.add", "tests.support.tasks.nope"),
        "not-a-task": good.replace("tests.support.tasks.add", "tests.support.tasks.client"),
        "os-system": good.replace("tests.support.tasks.add", "os.system").replace(
            "[1, 2]", '["id"]'
        ),
        "importable": good.replace("tests.support.tasks.add", "tests.support.canary.boom"),
        "bad-types": good.replace('"args": [1, 2]', '"args": "1, 2"'),
        "wrong-arguments": good.replace("[1, 2]", "[1, 2, 3, 4]"),
        "deep": "[" * 100_000,
        "oversized": good.replace('"kwargs": {}', '"kwargs": {"x": "%s"}' % ("x" * 600_000)),
        "binary": b"\xff\xfe\x00\x01",
    }
    seconds, micros = raw.time()
    now_ms = seconds * 1000 + micros // 1000
    for name, payload in bad_payloads.items():
        job = {"payload": payload, "queue": "default", "priority": 0, "enqueued_at": now_ms}
        raw.hset(keys.job(name), mapping=job)
        raw.zadd(keys.queue("default"), {name: 0})

    worker = procs.start("runworker")
    pid = worker.pid
    wait_until(lambda: backend.queries.queue_length("default") == 0, 60, "the queue to drain")
    ok = tasks.add.enqueue(2, 2)
    assert ok.wait(timeout=30) == 4  # the same worker still runs good jobs

    # Tasks this worker does not know wait for one that does (test_unknown_tasks.py),
    # in their delayed set, their attempt not counted: none of them is ever imported.
    unknown = {"unknown-task", "not-a-task", "os-system", "importable"}
    for name in unknown:
        assert backend.get_result(name).status == TaskResultStatus.READY, name
        assert raw.zscore(keys.delayed("default"), name) is not None, name
    bad_payloads = {name: p for name, p in bad_payloads.items() if name not in unknown}
    reasons = {name: backend.get_result(name).errors[-1].traceback for name in bad_payloads}
    failed = [
        key
        for key in raw.scan_iter(match=keys.job("*"), _type="hash")
        if raw.hget(key, "status") == b"FAILED"
    ]
    report(
        f"hostile payloads: {len(garbage)} random ids + {len(bad_payloads)} bad payloads, "
        f"{len(failed)} FAILED records, worker pid unchanged"
    )
    assert worker.poll() is None and worker.pid == pid
    assert all(backend.get_result(n).status == TaskResultStatus.FAILED for n in bad_payloads)
    assert "not valid JSON" in reasons["truncated"]
    assert "version 2 is not supported" in reasons["version-2"]
    for path in (
        "tests.support.tasks.nope",
        "tests.support.tasks.client",
        "os.system",
        "tests.support.canary.boom",
    ):
        assert f"{path!r} is not registered in worker" in worker.output
    assert "over the 524288-byte limit" in reasons["oversized"]
    assert "TypeError" in reasons["wrong-arguments"]
    assert rr.get("test:canary") is None  # tests.support.canary was never imported
    assert len(failed) >= len(garbage) + len(bad_payloads)


def test_a_job_past_its_timeout_is_stopped(rr, procs):
    slow = tasks.overruns.enqueue(30)  # timeout=0.5
    after = tasks.add.enqueue(1, 1)
    procs.start("runworker")
    assert after.wait(timeout=30) == 2
    stored = task_backends["default"].get_result(slow.id)
    assert stored.status == TaskResultStatus.FAILED
    assert stored.errors[0].exception_class_path.endswith("JobTimeout")
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback


def test_a_second_sigterm_gives_the_job_back(rr, procs):
    job = tasks.held.enqueue(60)
    worker = procs.start("runworker")
    wait_until(lambda: "started:1" in rr.lrange(tasks.LOG, 0, -1), 30, "the job to start")
    worker.send_signal(signal.SIGTERM)
    procs.expect(worker, "finishing the job in hand")  # the first signal was handled
    worker.send_signal(signal.SIGTERM)
    output = procs.stop(worker, signal_first=False)
    stored = task_backends["default"].get_result(job.id)
    assert worker.returncode == 0, output
    assert stored.status == TaskResultStatus.READY, (stored.errors, output)
    assert "giving the running job back" in output
    assert stored.attempts == 0  # the interrupted attempt does not count
    assert task_backends["default"].queries.queue_length("default") == 1

    rr.rpush("test:release:1", 1)
    procs.start("runworker")
    assert job.wait(timeout=30) > 0


@pytest.mark.pure
@pytest.mark.parametrize(
    "exc",
    [
        redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.AuthenticationError("invalid username-password pair"),
        redis.ConnectionError("Connection closed by server."),
        redis.TimeoutError("Timeout reading from socket"),
        RedisClusterException("Redis Cluster cannot be connected."),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_whether_redis_answered_is_one_verdict_for_every_message_and_recovery(exc, caplog):
    """Redis answered (a refusal: nothing ran) or did not (the reply lost: it may have
    run): the enqueue's error, the loops' log line and the recovery agree. LOADING is
    a refusal, though redis-py raises it as a connection error."""
    refused = isinstance(exc, redis.ResponseError | redis.exceptions.BusyLoadingError)
    refused = refused or isinstance(exc, redis.exceptions.AuthenticationError)
    assert answered(exc) is refused and reply_lost(exc) is not refused
    said = str(task_backends["default"]._unavailable("enqueue the job", exc))
    assert ("Redis refused it" in said) is refused and ("did not answer" in said) is not refused
    with mock.patch("time.sleep"):
        Reconnector(logging.getLogger("tests"), "Worker w").failed(exc)
    assert ("Redis refused a command" in caplog.text) is refused
    assert ("Redis unreachable" in caplog.text) is not refused


def test_an_enqueue_at_once_after_a_redis_restart_is_stored(server):
    """Its connection, lent from the spare ones, died with the server a moment ago:
    the enqueue goes on a new one, as one through the pool would."""
    enqueue = tasks.add.using(backend="leased").enqueue
    first = enqueue(1, 1)
    server.kill()
    server.start()
    second = enqueue(2, 2)
    assert second.status == TaskResultStatus.READY
    assert result(second.id).args == [2, 2]
    assert first.id != second.id


def test_a_worker_of_eight_threads_and_enqueues_survive_a_redis_restart(server, rr, procs, report):
    """The slots call Redis on spare connections, which a restart leaves dead: each is
    found out (a reply lost, recovered) or replaced, and no job is lost; an enqueue at
    once after the restart is stored, not refused on a dead connection."""
    ledger = tasks.ledger.using(backend="leased")
    ids = [job.id for job in ledger.enqueue_many([((i, 5), {}) for i in range(600)])]
    scheduler = procs.start("runscheduler", *LEASED)
    worker = procs.start("runworker", "--threads", "8", *LEASED)
    wait_until(lambda: rr.llen("test:ledger") >= 100, 60, "some jobs to run")
    ids.append(ledger.enqueue(600, 0).id)  # this process holds a spare connection too

    server.kill()
    procs.expect(worker, "Redis unreachable")
    server.start()
    ids += [ledger.enqueue(i, 0).id for i in range(601, 611)]

    wait_until(lambda: all_finished(ids), 120, "every job to finish")
    outputs = [procs.stop(p) for p in (scheduler, worker)]
    ran = rr.lrange("test:ledger", 0, -1)
    report(
        f"redis restart under --threads 8: jobs={len(ids)} lost=0 "
        f"duplicates={len(ran) - len(set(ran))}"
    )
    assert "Redis reachable again" in outputs[1]
    assert set(ran) == {str(i) for i in range(611)}
