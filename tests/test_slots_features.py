"""The features that order or bound jobs, on workers that run several jobs at once:
limits per key, retries, unique jobs, groups and chains, and sync and ``async def``
tasks side by side in one process; a slot's own claim meeting a parked job, an
operator acting on a job a slot has just claimed, broadcasts while every slot is
busy. Each job that must not overlap another counts itself in and out in Redis
(tests/support/slot_tasks.py), or is held until the test releases it, so an overlap is seen,
not timed."""

import contextlib
import json
import threading
import time
from unittest.mock import patch

from django_redisqueue import broadcast, chain, group, task
from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.runtime.slots import SlotWorker
from tests.conftest import wait_until
from tests.support import slot_tasks, tasks
from tests.support.keys import DEFAULT_KEYS
from tests.test_slots import run_patched, run_slots_here, slots_on

THREADS = ("--threads", "4")


def most_at_once(r, name: str) -> int:
    return int(r.get(slot_tasks.overlap_key(name)[1]) or 0)


def test_limits_retries_and_unique_jobs_hold_across_slots(r, backend, procs, report):
    """Two ``runworker --threads 4`` and a scheduler: jobs limited to one at a time and
    to two at a time never run more at once (eight slots free for them), jobs that fail
    twice run attempts 1, 2, 3 once each, and a unique job enqueued again and again
    while its twin waits or runs never runs beside it."""
    ones = [slot_tasks.one_at_a_time.enqueue(f"one{i}", 0.02) for i in range(24)]
    twos = [slot_tasks.two_at_a_time.enqueue(f"two{i}", 0.02) for i in range(24)]
    retried = [slot_tasks.fails_twice_counted.enqueue(f"r{i}", 0.01) for i in range(12)]
    procs.start("runscheduler")
    for _ in range(2):
        procs.start("runworker", *THREADS)
    wait_until(lambda: r.zcard(DEFAULT_KEYS.workers) == 2, 60, "two workers")
    unique = {}  # job id -> key: the jobs the enqueues made
    runs = {key: f"test:slots:unique:{key}" for key in ("k0", "k1", "k2")}
    enqueues, deadline = 0, time.monotonic() + 60
    # Enqueued again and again until each key has run 5 times: most enqueues find the
    # key's job waiting or running, and return it.
    while min(r.llen(ledger) for ledger in runs.values()) < 5:
        assert time.monotonic() < deadline, "the unique jobs did not run 5 times each"
        for key in runs:
            unique[slot_tasks.unique_counted.enqueue(key, 0.02).id] = key
            enqueues += 1

    finished = ones + twos + retried
    wait_until(lambda: r.llen("test:slots:done") == 48, 60, "the limited jobs")
    wait_until(lambda: all(job.wait(timeout=30) for job in retried), 60, "the retried jobs")
    wait_until(lambda: sum(r.llen(k) for k in runs.values()) == len(unique), 30, "unique")
    statuses = {backend.get_result(job.id).status for job in finished}
    most = {name: most_at_once(r, name) for name in ("one_at_a_time", "two-at-a-time", "free")}
    report(
        f"features on 2 x runworker --threads 4: most at once {most}, "
        f"{len(unique)} unique jobs from {enqueues} enqueues of 3 keys"
    )
    assert statuses == {TaskResultStatus.SUCCESSFUL}
    assert most["one_at_a_time"] == 1 and most["two-at-a-time"] <= 2
    for job in retried:
        label = job.args[0]
        assert r.lrange(f"test:slots:attempts:{label}", 0, -1) == ["1", "2", "3"]
        assert backend.get_result(job.id).return_value == 3
    for key, ledger in runs.items():
        assert most_at_once(r, f"unique:{key}") == 1
        assert r.llen(ledger) == sum(k == key for k in unique.values())  # each job once


def test_groups_run_their_callback_once_after_all_members_and_chains_in_order(r, backend):
    groups = [
        group(
            [tasks.fanout_member.job(i, 10) for i in range(10)],
            callback=tasks.fanout_callback.job(f"g{g}"),
        ).enqueue()
        for g in range(3)
    ]
    chains = [
        chain(*(tasks.fanout_step.job(c, s, False) for s in range(5))).enqueue() for c in range(4)
    ]
    run_slots_here(backend, threads=4)

    callbacks = [json.loads(entry) for entry in r.lrange(tasks.FANOUT_CALLBACKS, 0, -1)]
    assert sorted(entry["label"] for entry in callbacks) == ["g0", "g1", "g2"]  # once each
    assert all(entry["results"] == list(range(10)) for entry in callbacks)  # after all
    assert all(entry["attempt"] == 1 for entry in callbacks)
    assert [result.wait(timeout=5) for result in groups] == [list(range(10))] * 3
    steps = r.lrange(tasks.FANOUT_STEPS, 0, -1)
    for c in range(4):
        assert [s for s in steps if s.startswith(f"{c}:")] == [f"{c}:{s}" for s in range(5)]
    assert all(backend.get_result(steps[-1].id).return_value == 4 for steps in chains)


def test_sync_and_async_tasks_run_side_by_side_in_one_process(r, backend):
    """A sync task and an ``async def`` one meet only if both run at once."""
    met = [
        tasks.rendezvous.enqueue("sync", "async", 20),
        slot_tasks.rendezvous_async.enqueue("async", "sync", 20),
        tasks.add.enqueue(2, 3),
        tasks.meaning_of_life_async.enqueue(),
    ]
    worker = run_slots_here(backend, threads=4)
    assert [job.wait(timeout=5) for job in met] == [True, True, 5, 42]
    ran_on = {tuple(backend.get_result(job.id).worker_ids) for job in met}
    assert ran_on == {(worker.worker_id,)}


@task(concurrency_limit=1)
def limited(label, held):
    """One at a time by its limit key; ``held``: until the test pushes its release."""
    r = tasks.client()
    r.rpush(tasks.LOG, f"start {label}")
    if held:
        assert r.blpop([f"test:release:{label}"], timeout=30), f"{label} never released"
    r.rpush(tasks.LOG, f"end {label}")


def test_a_slots_own_claim_parks_a_limited_job_and_the_store_that_frees_its_limit_claims_it(
    r, backend
):
    """Two slots, jobs of one key limited to one at a time: while slot A holds L1, slot
    B's call that stores F's outcome and claims its next job meets L2, parks it and
    takes H behind it. The call that stores L1's outcome (A's) lets L2 go and claims
    it in the same step. L2 runs after L1 ended, each job once, none left parked."""
    key = backend.keys.limit("mends", "parked")
    using = limited.using(limit_key="mends")
    l1 = using.enqueue("L1", True)
    f = tasks.record.enqueue("F")
    l2 = using.enqueue("L2", False)
    h = tasks.steps_until_released.enqueue("H", 30)
    worker = SlotWorker(backend, threads=2, burst=True)
    slot_claim, calls = backend.broker.claim, []

    def slot_claim_seen(queues, worker_id, *outcomes, **kwargs):
        stored, job = slot_claim(queues, worker_id, *outcomes, **kwargs)
        ended = [o.job_id for o in outcomes if o is not None]
        calls.append((ended, job and job.job_id, r.zrange(key, 0, -1)))
        if job is not None and job.job_id == h.id:
            r.rpush("test:release:L1", 1)  # L2 parked by this call: A's L1 may end
        elif job is not None and job.job_id == l2.id:
            r.rpush("test:release", 1)  # and H ends once L2 is in A's slot
        return stored, job

    run_patched(
        worker,
        # The slots claim their next jobs whatever the time (no broadcasts' number due).
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        slots_on(backend.broker),
        patch.object(backend.broker, "claim", slot_claim_seen),
    )
    assert ([f.id], h.id, [l2.id]) in calls  # B's call parked L2, took H
    assert ([l1.id], l2.id, []) in calls  # A's call freed the limit and took L2
    for job in (l1, f, l2, h):
        stored = backend.get_result(job.id)
        assert stored.status == TaskResultStatus.SUCCESSFUL and stored.attempts == 1
    log = r.lrange(tasks.LOG, 0, -1)
    assert sorted(log) == ["F", "done:H", "end L1", "end L2", "start L1", "start L2", "started:H"]
    assert log.index("end L1") < log.index("start L2")  # never beside each other
    assert r.zcard(key) == 0 and worker.jobs_done == 4


@task(takes_context=True)
def fails_on_its_first_attempt(context, label):
    """FAILED on attempt 1 (no retries of its own); runs on an operator's retry."""
    tasks.client().rpush(tasks.LOG, f"{label} {context.attempt}")
    if context.attempt == 1:
        raise ValueError("first attempt")
    return context.attempt


def test_an_operators_stale_actions_on_a_job_a_slot_has_just_claimed_change_nothing(r, backend):
    """A job FAILED; an operator retries it, and a slot's own call (storing the job
    before it, claiming the next) claims it. Before the slot runs it, the operator acts
    on it again from pages that still show it failed, waiting or delayed: retry,
    delete, cancel, run now, empty its queue. Each says it changed nothing, and the
    job runs once more, from the slot that claimed it."""
    from django.contrib import messages

    from django_redisqueue.dashboard.actions import apply, apply_to_selection

    job = fails_on_its_first_attempt.enqueue("J")
    run_slots_here(backend, threads=1)
    assert backend.get_result(job.id).status == TaskResultStatus.FAILED
    tasks.record.enqueue("F")  # ahead of J once J is retried: J is the slot's own claim
    assert apply(backend, "retry_failed", "default", job.id)[0][0] == messages.SUCCESS
    worker = SlotWorker(backend, threads=1, burst=True)
    slot_claim, told = backend.broker.claim, []

    def slot_claim_then_the_operator(queues, worker_id, *outcomes, **kwargs):
        stored, claimed = slot_claim(queues, worker_id, *outcomes, **kwargs)
        if claimed is not None and claimed.job_id == job.id:
            told.extend(apply(backend, "retry_failed", "default", job.id))
            told.extend(apply(backend, "delete_failed", "default", job.id))
            told.extend(apply_to_selection(backend, "retry_failed", "default", [job.id]))
            told.extend(apply_to_selection(backend, "cancel", "default", [job.id]))
            told.extend(apply_to_selection(backend, "run_now", "default", [job.id]))
            told.extend(apply(backend, "cancel", "default", job.id))
            told.extend(apply(backend, "empty", "default", ""))
        return stored, claimed

    run_patched(
        worker,
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        slots_on(backend.broker),
        patch.object(backend.broker, "claim", slot_claim_then_the_operator),
    )
    assert len(told) == 7, told  # the operator acted on the job the slot had claimed
    assert all(level in (messages.WARNING, messages.ERROR) for level, _ in told), told
    assert r.lrange(tasks.LOG, 0, -1) == ["J 1", "F", "J 2"]
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL and stored.attempts == 2
    assert stored.return_value == 2
    assert r.zcard(backend.keys.failed("default")) == 0 and worker.jobs_done == 2


# Broadcasts while every slot is busy

BROADCAST_RAN = "test:slots:broadcast"


@task
def held(label):
    """Runs until the test pushes its release."""
    r = tasks.client()
    r.rpush(tasks.LOG, f"start {label}")
    assert r.blpop([f"test:release:{label}"], timeout=30), f"{label} never released"
    r.rpush(tasks.LOG, f"end {label}")


@task
def relay(label, n):
    """A stream of jobs: each enqueues the next before it ends (until a broadcast ran,
    or 5,000 of them did), so that its queue never runs dry."""
    r = tasks.client()
    r.rpush(tasks.LOG, f"{label}{n}")
    if not r.exists(BROADCAST_RAN) and n < 5000:
        relay.enqueue(label, n + 1)


@task
def mark_broadcast():
    r = tasks.client()
    r.incr(BROADCAST_RAN)
    r.rpush(tasks.LOG, "broadcast")


@contextlib.contextmanager
def slots_running(backend, threads: int):
    """A worker of ``threads`` slots (not burst: as runworker runs) on a thread of its
    own, stopped when the block ends."""
    worker = SlotWorker(backend, threads=threads)
    thread = threading.Thread(target=run_patched, args=(worker,))
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop"


def test_a_broadcast_waits_for_the_first_slot_to_end_its_job_not_for_all(r, backend):
    """Both slots hold a job when a broadcast is sent: it runs once the first of them
    ends, while the other runs on (docs/howto/many-jobs.md: between two jobs)."""
    held.enqueue("a"), held.enqueue("b")
    with slots_running(backend, threads=2):
        wait_until(lambda: {"start a", "start b"} <= set(r.lrange(tasks.LOG, 0, -1)), 30, "both")
        broadcast(mark_broadcast.job())
        r.rpush("test:release:a", 1)
        wait_until(lambda: r.exists(BROADCAST_RAN), 30, "the broadcast, b still held")
        assert "end b" not in r.lrange(tasks.LOG, 0, -1)
        r.rpush("test:release:b", 1)
        wait_until(lambda: "end b" in r.lrange(tasks.LOG, 0, -1), 30, "b")
    log = r.lrange(tasks.LOG, 0, -1)
    assert log.index("end a") < log.index("broadcast") < log.index("end b")
    assert log.count("broadcast") == 1


def test_a_broadcast_runs_while_every_slot_stays_busy_with_a_stream_of_jobs(r, backend):
    """Two streams of jobs keep both slots busy, their queue never empty: a broadcast
    sent meanwhile still runs (the slots leave the loop a turn to read the broadcasts'
    number, then to run them), once, and the streams, which stop once it ran, end long
    before their 5,000 jobs."""
    relay.enqueue("x", 0), relay.enqueue("y", 0)
    with slots_running(backend, threads=2):
        wait_until(lambda: {"x1", "y1"} <= set(r.lrange(tasks.LOG, 0, -1)), 30, "the streams")
        broadcast(mark_broadcast.job())
        wait_until(lambda: r.exists(BROADCAST_RAN), 60, "the broadcast")
        wait_until(lambda: r.zcard(backend.keys.queue("default")) == 0, 30, "the streams' ends")
    log = r.lrange(tasks.LOG, 0, -1)
    assert log.count("broadcast") == 1
    ran = [entry for entry in log if entry[0] in "xy"]
    assert max(int(entry[1:]) for entry in ran) < 5000, "the broadcast waited for the streams"
