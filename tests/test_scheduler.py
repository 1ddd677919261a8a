"""Delayed jobs, retries, lease recovery and cancel: ``runscheduler`` and friends."""

import itertools
import os
import re
import signal
import threading
import time
from datetime import timedelta
from unittest import mock

import pytest
import redis
from django.utils import timezone

from django_redisqueue import TaskFailed
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.exceptions import NotCancellable
from django_redisqueue.runtime.heartbeat import HEARTBEAT_RETRY
from django_redisqueue.runtime.scheduler import Scheduler, recovery_grace
from django_redisqueue.store.gateway import now_ms
from tests.conftest import blocked_clients, manage, start_manage, wait_until
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS, LEASED_KEYS

DELAYED = DEFAULT_KEYS.delayed("default")


def stop(process) -> str:
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output
    return output


def test_a_delayed_job_waits_until_due_then_runs(r, backend):
    result = tasks.add.using(delay=1).enqueue(1, 2)
    due = r.zscore(DELAYED, result.id)

    assert result.status == TaskResultStatus.READY
    assert backend.get_result(result.id).task.run_after is not None
    assert backend.queries.queue_length("default") == 0
    Scheduler(backend, burst=True).run()
    assert r.zscore(DELAYED, result.id) == due  # not due yet: left alone

    wait_until(lambda: now_ms() >= due, 10, "the due time")
    assert manage("runscheduler", "--burst").returncode == 0
    assert r.zcard(DELAYED) == 0
    assert backend.queries.queue_length("default") == 1
    assert manage("runworker", "--burst").returncode == 0
    assert result.wait(timeout=5) == 3


def test_run_after_and_delay(r, backend):
    past = tasks.add.using(run_after=timezone.now() - timedelta(hours=1)).enqueue(1, 1)
    later = tasks.add.using(delay=timedelta(minutes=5)).enqueue(1, 1)

    assert backend.queries.queue_length("default") == 1  # a past run_after is due now
    assert r.zrange(DELAYED, 0, -1) == [later.id]
    assert r.zscore(DELAYED, later.id) / 1000 == pytest.approx(time.time() + 300, abs=5)
    assert backend.get_result(past.id).status == TaskResultStatus.READY
    with pytest.raises(TypeError, match="either delay or run_after"):
        tasks.add.using(delay=1, run_after=timezone.now())


# Due after the wake-up: on the local clock (below LOCAL_SLEEP_BELOW), or first blocked
# on Redis with a fractional timeout, which the server must end in time.
@pytest.mark.parametrize("delay", [0.2, 0.8])
def test_an_earlier_job_wakes_the_sleeping_scheduler(r, backend, delay):
    scheduler = Scheduler(backend, idle_wait=120)
    thread = threading.Thread(target=scheduler.run)
    thread.start()
    try:
        late = tasks.add.using(delay=100).enqueue(1, 1)
        wait_until(
            lambda: scheduler.waiting and r.llen(DEFAULT_KEYS.scheduler_wake) == 0,
            10,
            "the scheduler to sleep until the first job",
        )
        soon = tasks.add.using(delay=delay).enqueue(2, 2)
        # Without the wake-up, or the wait after it ended in time, the scheduler would
        # sleep for 100 s, its idle step.
        wait_until(lambda: backend.queries.queue_length("default") == 1, 30, "promotion")
        assert r.zrange(DEFAULT_KEYS.queue("default"), 0, -1) == [soon.id]
        assert r.zrange(DELAYED, 0, -1) == [late.id]
    finally:
        scheduler.stop()
        r.rpush(DEFAULT_KEYS.scheduler_wake, 1)
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_parallel_schedulers_promote_each_job_exactly_once(r, backend):
    schedulers = [start_manage("runscheduler") for _ in range(3)]
    try:
        # A scheduler still starting up when the test ends would die of the SIGTERM.
        wait_until(lambda: len(blocked_clients(r)) == 3, 30, "the schedulers to start")
        results = [
            tasks.record.using(delay=(i % 100 + 1) / 100).enqueue(f"job{i}") for i in range(300)
        ]
        wait_until(lambda: backend.queries.queue_length("default") == 300, 30, "promotion")
    finally:
        outputs = [stop(s) for s in schedulers]
    # A job whose enqueue reached Redis after its due time (a busy host) was queued at
    # once, not promoted: by Redis's clock, its enqueue time is not before its due time.
    pipe = r.pipeline(transaction=False)
    for result in results:
        pipe.hget(backend.keys.job(result.id), "enqueued_at")
    queued_at_once = sum(
        int(enqueued) >= int(result.task.run_after.timestamp() * 1000)
        for result, enqueued in zip(results, pipe.execute(), strict=True)
    )
    promoted = [int(n) for out in outputs for n in re.findall(r"promoted (\d+)", out)]
    assert sum(promoted) == 300 - queued_at_once
    assert manage("runworker", "--burst").returncode == 0
    log = r.lrange(tasks.LOG, 0, -1)
    assert sorted(log) == sorted(f"job{i}" for i in range(300))


def test_sigterm_stops_an_idle_scheduler(r):
    scheduler = start_manage("runscheduler")
    wait_until(lambda: blocked_clients(r), 30, "the scheduler to block on Redis")
    assert "stopped" in stop(scheduler)


def test_a_scheduler_that_stops_cleanly_is_no_longer_live_at_once(r, backend):
    def live() -> list[str]:
        return [s.id for s in backend.queries.live_schedulers(backend.queries.clock_ms(), 10)]

    scheduler = start_manage("runscheduler")
    wait_until(live, 30, "the scheduler's first step")
    stop(scheduler)  # SIGTERM
    assert live() == []
    done = manage("queuehealth", "--no-workers")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "FAIL scheduler: no live scheduler" in done.stdout

    assert manage("runscheduler", "--burst").returncode == 0
    assert live() == []


def test_the_job_of_a_killed_worker_runs_again_after_its_lease(r):
    leased = task_backends["leased"]
    job = tasks.block_until_released.using(backend="leased").enqueue("x", 60)
    worker = start_manage("runworker", "--backend", "leased")
    wait_until(lambda: "started:x" in r.lrange(tasks.LOG, 0, -1), 30, "the job to start")
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()

    assert leased.get_result(job.id).status == TaskResultStatus.RUNNING
    deadline = r.zscore(LEASED_KEYS.running, job.id)
    wait_until(lambda: now_ms() > deadline, 10, "the lease to run out")
    recovered = manage("runscheduler", "--burst", "--backend", "leased")
    assert "recovered 1 lost job(s)" in recovered.stderr
    assert leased.get_result(job.id).status == TaskResultStatus.READY

    r.rpush("test:release", 1)
    assert manage("runworker", "--burst", "--backend", "leased").returncode == 0
    stored = leased.get_result(job.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL
    assert stored.attempts == 2 and len(set(stored.worker_ids)) == 2


def test_a_job_that_keeps_killing_its_worker_fails_after_max_recoveries(r):
    leased = task_backends["leased"]  # MAX_RECOVERIES 2: three attempts in all
    job = tasks.kill_own_worker.using(backend="leased").enqueue()
    for _ in range(3):
        died = manage("runworker", "--burst", "--backend", "leased")
        assert died.returncode == -signal.SIGKILL
        deadline = r.zscore(LEASED_KEYS.running, job.id)
        wait_until(lambda: now_ms() > deadline, 10, "the lease to run out")  # noqa: B023
        assert manage("runscheduler", "--burst", "--backend", "leased").returncode == 0
    stored = leased.get_result(job.id)
    assert stored.status == TaskResultStatus.FAILED
    assert stored.attempts == 3
    assert stored.errors[-1].exception_class_path == "django_redisqueue.exceptions.WorkerLost"
    # The other jobs are not held up: a worker runs them as usual.
    ok = tasks.add.using(backend="leased").enqueue(1, 1)
    assert manage("runworker", "--burst", "--backend", "leased").returncode == 0
    assert leased.get_result(ok.id).return_value == 2


def test_retries_back_off_and_keep_every_error(r, backend):
    job = tasks.always_fails.enqueue("a")  # retries=3, backoff 0.2 s, no jitter
    scheduler, worker = start_manage("runscheduler"), start_manage("runworker")
    try:
        with pytest.raises(TaskFailed, match="attempt failed: a"):
            job.wait(timeout=60)
    finally:
        stop(scheduler), stop(worker)
    stored = backend.get_result(job.id)
    assert stored.attempts == 4
    assert [e.exception_class_path for e in stored.errors] == ["builtins.ValueError"] * 4
    times = [float(t) for t in r.lrange("test:attempts:a", 0, -1)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # A retry never runs before it is due: 0.2, 0.4 and 0.8 s after the failure.
    assert all(gap >= 0.2 * 2**n for n, gap in enumerate(gaps)), gaps


def test_a_retry_can_succeed_and_retry_on_limits_what_retries(backend):
    flaky = tasks.fails_once.enqueue("b")
    wrong_error = tasks.fails_with_value_error.enqueue()
    assert manage("runworker", "--burst").returncode == 0
    assert backend.get_result(wrong_error.id).status == TaskResultStatus.FAILED
    assert backend.get_result(flaky.id).status == TaskResultStatus.READY  # waiting to retry

    scheduler, worker = start_manage("runscheduler"), start_manage("runworker")
    try:
        assert flaky.wait(timeout=30) == "second try worked"
    finally:
        stop(scheduler), stop(worker)
    stored = backend.get_result(flaky.id)
    assert stored.attempts == 2
    assert [e.exception_class_path for e in stored.errors] == ["builtins.ConnectionError"]
    assert backend.get_result(wrong_error.id).attempts == 1


def test_cancel(r, backend):
    queued = tasks.add.enqueue(1, 1)
    delayed = tasks.add.using(delay=60).enqueue(1, 1)
    running = tasks.add.enqueue(1, 1)

    queued.cancel()
    delayed.cancel()
    assert queued.status == delayed.status == TaskResultStatus.FAILED
    assert "was cancelled" in queued.errors[0].traceback
    assert r.zcard(DELAYED) == 0
    with pytest.raises(TaskFailed, match="cancelled"):
        delayed.wait(timeout=1)

    backend.broker.claim(["default"], "w1")
    with pytest.raises(NotCancellable, match="is RUNNING"):
        running.cancel()
    with pytest.raises(NotCancellable, match="is FAILED"):
        queued.cancel()
    with pytest.raises(TaskResultDoesNotExist):
        backend.cancel("no-such-job")
    assert manage("runworker", "--burst").returncode == 0  # nothing left to run


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": -1}, "retries must be"),
        ({"retry_backoff": "1"}, "retry_backoff must be"),
        ({"retry_on": ValueError}, "retry_on must be a tuple"),
    ],
)
def test_bad_retry_options(options, message):
    from django_redisqueue import task

    with pytest.raises(ValueError, match=message):
        task(**options)(tasks.add.func)


def test_the_clock_of_the_scheduler_host_decides_no_lease_and_no_due_time(r):
    """Only Redis's clock counts: a scheduler on a host whose clock runs an hour ahead
    recovers no live job and promotes no job before it is due."""
    backend = task_backends["leased"]
    running = tasks.noop.using(backend="leased").enqueue()
    backend.broker.claim(["default"], "w1")
    later = tasks.noop.using(backend="leased", delay=600).enqueue()
    skewed = time.time() + 3600
    with mock.patch("time.time", lambda: skewed):
        Scheduler(backend, burst=True).run()
    assert backend.get_result(running.id).status == TaskResultStatus.RUNNING
    assert r.zscore(LEASED_KEYS.running, running.id) is not None
    assert r.zscore(LEASED_KEYS.delayed("default"), later.id) is not None


def test_after_a_redis_error_the_scheduler_gives_workers_a_lease_to_renew(r):
    backend = task_backends["leased"]
    tasks.noop.using(backend="leased").enqueue()
    _, claimed = backend.broker.claim(["default"], "w1")
    r.zadd(LEASED_KEYS.running, {claimed.job_id: 0})  # its lease ran out meanwhile
    scheduler = Scheduler(backend, burst=True)
    failing = [redis.exceptions.ResponseError("OOM command not allowed")]

    def tick(*args, **kwargs):
        if failing:
            raise failing.pop()
        return real_tick(*args, **kwargs)

    real_tick = backend.broker.tick
    with mock.patch.object(backend.broker, "tick", tick), mock.patch("time.sleep"):
        scheduler.run()
    assert r.zscore(LEASED_KEYS.running, claimed.job_id) == 0  # left to its worker
    assert scheduler.recover_after > time.monotonic()


def test_a_step_that_redis_held_recovers_no_lease(r, caplog):
    """A step that reaches Redis much later than sent (CLIENT PAUSE, a busy script) finds
    leases that ran out because the heartbeats were held too: it leaves them alone, and
    so do the steps of the next lease."""
    backend = task_backends["leased"]
    tasks.noop.using(backend="leased").enqueue()
    _, claimed = backend.broker.claim(["default"], "w1")
    r.zadd(LEASED_KEYS.running, {claimed.job_id: 0})  # its lease ran out meanwhile
    scheduler = Scheduler(backend, burst=True)
    # The last step read Redis's clock 10 s ago by Redis, just now by this host: the
    # next step is 10 s late, as if Redis had held it.
    scheduler.steps.append((backend.broker.clock_ms() - 10_000, time.monotonic()))
    scheduler.run()
    assert r.zscore(LEASED_KEYS.running, claimed.job_id) == 0  # left to its worker
    assert scheduler.recover_after > time.monotonic()
    assert "Redis held a step" in caplog.text
    Scheduler(backend, burst=True).run()  # a step in time recovers it
    assert r.zscore(LEASED_KEYS.running, claimed.job_id) is None


@pytest.mark.parametrize("held", [False, True])
def test_a_scheduler_whose_wait_was_held_leaves_expired_leases_to_their_workers(r, held):
    """A blocking wait Redis held (a busy script, CLIENT PAUSE) says no error: the
    workers' heartbeats were held alike, so the next step recovers no lease."""
    backend = task_backends["leased"]
    scheduler = Scheduler(backend, burst=True)
    job = tasks.add.using(backend="leased").enqueue(1, 2)
    backend.broker.claim(["default"], "w1")
    r.zadd(backend.keys.running, {job.id: 0})  # its lease ran out while Redis was held

    def wait_held(timeout: float) -> bool:
        time.sleep(timeout + backend.config.lease)  # the stall being simulated
        return False

    wait = wait_held if held else backend.broker.wait_for_schedule
    with mock.patch.object(scheduler.broker, "wait_for_schedule", wait):
        scheduler.sleep(0.3)
    scheduler.run()  # one step
    recovered = r.hget(backend.keys.job(job.id), "status") != "RUNNING"
    assert recovered != held


@pytest.mark.pure
@pytest.mark.parametrize("lease", [0.1, 1.0, 4.0, 60.0, 3600.0])
def test_the_grace_leaves_a_held_worker_a_few_heartbeat_retries_and_a_share_of_its_lease(lease):
    """After Redis held every client, a live worker's refused heartbeat tries again
    every HEARTBEAT_RETRY s: the grace gives it a few tries whatever the lease, and a
    quarter of a long lease."""
    grace = recovery_grace(lease)
    assert grace >= 4 * HEARTBEAT_RETRY
    assert grace >= lease / 4
    assert grace == max(lease / 4, 4 * HEARTBEAT_RETRY)  # no more: recovery waits it


@pytest.mark.parametrize("renewed", [True, False])
def test_a_lease_that_ran_out_after_the_latest_step_a_grace_ago_waits_for_its_heartbeat(
    r, renewed
):
    """Redis held every client past a lease (a busy script, CLIENT PAUSE) and answered
    the scheduler's step before the heartbeats it had refused: that step takes no
    lease that ran out after the scheduler's step a grace before it, and the heartbeat
    that lands meanwhile keeps the job with its worker. A lease nobody renews is
    recovered by the next step, a grace later."""
    backend = task_backends["leased"]
    scheduler = Scheduler(backend)
    job = tasks.add.using(backend="leased").enqueue(1, 2)
    _, claimed = backend.broker.claim(["default"], "w1")
    scheduler.steps.append((now_ms() - 60_000, time.monotonic() - 60))  # a minute ago
    r.zadd(backend.keys.running, {job.id: now_ms() - 1})  # ran out during the hold
    waits: list[float | None] = []
    renewals = []

    def sleep(seconds: float | None) -> None:
        waits.append(seconds)
        if len(waits) == 1 and renewed:  # the refused heartbeat lands
            renewals.append(backend.broker.heartbeat("w1", {}, {job.id: claimed.owner}))
        if len(waits) == 2:
            scheduler.stop()
            return
        time.sleep(seconds or 0)

    with mock.patch.object(scheduler, "sleep", sleep):
        scheduler.run()
    assert waits[0] == pytest.approx(scheduler.grace, abs=0.01)  # due again a grace later
    status, owner = r.hmget(backend.keys.job(job.id), "status", "owner")
    if renewed:
        assert renewals == [([], [])]
        assert (status, owner) == ("RUNNING", claimed.owner)
    else:
        assert status == "READY" and r.zscore(backend.keys.running, job.id) is None
