"""The features that order or bound jobs, on workers that run several jobs at once:
limits per key, retries, unique jobs, groups and chains, and sync and ``async def``
tasks side by side in one process. Each job that must not overlap another counts
itself in and out in Redis (tests/slot_tasks.py), so an overlap is seen, not timed."""

import json
import time

from django_redisqueue import chain, group
from django_redisqueue.compat import TaskResultStatus
from tests import slot_tasks, tasks
from tests.conftest import wait_until
from tests.keys import DEFAULT_KEYS
from tests.test_slots import run_slots_here

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
