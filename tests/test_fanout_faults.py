"""Fan-out under faults: the guarantees of groups, chains and broadcast, tried with
SIGKILLed workers, two schedulers, retries, operator retries and cancellation.

Each test runs its own redis-server and real ``runworker`` / ``runscheduler``
processes, as tests/test_faults.py does. What ran is read from append-only ledgers
(tests/support/tasks.py, "Fan-out"); what Redis holds, from the job and group hashes.
"""

import itertools
import json
import random
import time
from collections import Counter

import pytest
import redis

from django_redisqueue import chain, group
from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.core.fanout import broadcast
from django_redisqueue.runtime.scheduler import IDLE_WAIT
from tests.conftest import private_redis, wait_until
from tests.support import tasks

LEASED = ("--backend", "leased")
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@pytest.fixture
def rr():
    with private_redis() as server:
        yield redis.Redis.from_url(server.url, decode_responses=True)


def leased():
    return task_backends["leased"]


def default():
    return task_backends["default"]


def job_fields(backend, ids, *fields):
    """The given fields of each job, read in one round trip."""
    return backend.queries.jobs(ids, *fields)


def all_ended(backend, ids):
    return all(
        f.get("status") in ("SUCCESSFUL", "FAILED") for f in job_fields(backend, ids, "status")
    )


def callback_runs(rr, label):
    return [
        entry
        for entry in map(json.loads, rr.lrange(tasks.FANOUT_CALLBACKS, 0, -1))
        if entry["label"] == label
    ]


def error_class(result):
    return result.errors[-1].exception_class_path


def redis_ms(rr):
    seconds, micros = rr.time()
    return seconds * 1000 + micros // 1000


class GroupWatch:
    """Reads a group's counts, failing at once if ``ended`` ever passes ``total``."""

    def __init__(self, result):
        self.result = result

    def ended(self):
        self.result.refresh()
        ended, failed, total = self.result.progress
        assert ended <= total, f"group {self.result.id}: ended={ended} > total={total}"
        assert failed <= ended
        return ended == total


def keys_without_ttl(rr, *, workers_live):
    """Every key that would live for ever: no TTL, and not one of the fixed keys a
    backend keeps (counters, registries, wake-up lists). The tests' own ledgers
    (``test:*``) are left out."""
    allowed, allowed_prefixes = set(), []
    for backend in (default(), leased()):
        keys = backend.keys
        allowed |= {
            keys.seq,
            keys.broadcast_seq,
            keys.known_queues,
            keys.workers,
            keys.schedulers,
            keys.paused,
            keys.running,
            keys.scheduler_wake,
            keys.metrics,  # counters: monotonic for as long as Redis keeps them
            keys.groups,  # trimmed of the groups gone (tick, enqueue)
        }
        if workers_live:
            allowed.add(keys.broadcast_cursors)
        allowed_prefixes.append(keys.wake_prefix)
    return sorted(
        key
        for key in rr.scan_iter(count=1000)
        if not key.startswith("test:")
        and key not in allowed
        and not key.startswith(tuple(allowed_prefixes))
        and rr.ttl(key) == -1
    )


def last_read(read, timeout):
    """Call ``read`` until it returns nothing, or for ``timeout`` s; return its last value."""
    deadline = time.monotonic() + timeout
    while (value := read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def pids_running_a_job(rr, keys):
    """The pids of the workers that own a RUNNING job now (owner: <host>:<pid>:<hex>/<n>)."""
    owners = [rr.hget(keys.job(job_id), "owner") for job_id in rr.zrange(keys.running, 0, -1)]
    return {int(owner.split(":")[-2]) for owner in owners if owner}


# Groups


def test_the_callback_is_released_once_while_workers_are_killed(rr, procs, report):
    members = 300
    keys = leased().keys
    result = group(
        [tasks.fanout_member.using(backend="leased").job(i, 15) for i in range(members)],
        callback=tasks.fanout_callback.using(backend="leased").job("chaos", sleep_ms=300),
    ).enqueue()
    watch = GroupWatch(result)
    procs.start("runscheduler", *LEASED)
    procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *LEASED) for _ in range(3)]
    killed_pids = set()

    def kill_worker(pid):
        victim = next(i for i, w in enumerate(workers) if w.pid == pid)
        killed_pids.add(pid)
        procs.kill(workers[victim])
        workers[victim] = procs.start("runworker", *LEASED)

    # SIGKILL a worker cut short in a member every 0.3 s, while the members run.
    wait_until(lambda: rr.llen(tasks.FANOUT_MEMBERS) >= 10, 30, "the members to start")
    rng = random.Random(5)
    chaos_ends = time.monotonic() + 3.0
    while time.monotonic() < chaos_ends and not watch.ended():
        time.sleep(0.3)  # the pace of the chaos, not a wait for a condition
        busy = pids_running_a_job(rr, keys) & {w.pid for w in workers}
        if busy:  # else all are starting up or idle: a kill would cut no job short
            kill_worker(rng.choice(sorted(busy)))
    wait_until(watch.ended, 60, "every member to end")

    # Then kill the callback's own worker in the middle of it: it runs again.
    def callback_running():
        status, attempts, owner = rr.hmget(
            keys.job(result.callback_id), "status", "attempts", "owner"
        )
        assert status in ("READY", "RUNNING"), f"the callback ended in {attempts} attempt(s)"
        started = any(run["attempt"] == int(attempts or 0) for run in callback_runs(rr, "chaos"))
        # (its hash keeps the last owner once it stops running: only RUNNING counts)
        return status == "RUNNING" and owner and started and int(owner.split(":")[-2])

    kill_worker(wait_until(callback_running, 30, "the callback to run"))
    wait_until(lambda: all_ended(leased(), [result.callback_id]), 60, "the callback to end")
    callback = result.callback

    fields = job_fields(leased(), result.member_ids, "status", "finished_at", "lost")
    recovered = sum(1 for f in fields if f.get("lost"))
    assert recovered >= 1  # the chaos cut members short, or this test tried nothing
    # Two schedulers recover each lost lease once: no more losses than kills of members.
    assert sum(int(f.get("lost") or 0) for f in fields) <= len(killed_pids) - 1
    statuses = Counter(f["status"] for f in fields)
    failed_ids = [
        job_id
        for job_id, f in zip(result.member_ids, fields, strict=True)
        if f["status"] != "SUCCESSFUL"
    ]
    assert statuses["SUCCESSFUL"] + statuses["FAILED"] == members, statuses
    for job_id in failed_ids:  # only a member lost with its worker too often may fail
        assert error_class(leased().get_result(job_id)).endswith("WorkerLost")
    state = result.state
    assert state.total == state.ended == members and state.failed == len(failed_ids)
    assert state.finished_at_ms is not None

    ran = Counter(rr.lrange(tasks.FANOUT_MEMBERS, 0, -1))
    ran_twice = sum(1 for n in ran.values() if n > 1)
    assert all(ran[str(i)] for i, f in enumerate(fields) if f["status"] == "SUCCESSFUL")
    assert sum(ran.values()) - len(ran) <= len(killed_pids)  # a rerun per kill at most

    # Released once: every attempt after the first is a recovery from a lost worker,
    # every run but the last was cut short by a kill, and the last one was not.
    runs = callback_runs(rr, "chaos")
    assert callback.status == SUCCESSFUL, callback.errors
    attempts, lost = (
        int(n or 0) for n in rr.hmget(keys.job(result.callback_id), "attempts", "lost")
    )
    assert attempts == 1 + lost and lost >= 1
    assert [run["attempt"] for run in runs] == list(range(1, attempts + 1))
    assert all(run["pid"] in killed_pids for run in runs[:-1])
    assert runs[-1]["pid"] not in killed_pids
    expected = [i if f["status"] == "SUCCESSFUL" else None for i, f in enumerate(fields)]
    assert all(run["results"] == expected for run in runs)

    last_member_end = max(int(f["finished_at"]) for f in fields)
    started = int(rr.hget(keys.job(result.callback_id), "started_at"))
    assert started >= last_member_end
    report(
        f"fan-out chaos: members={members} kills={len(killed_pids)} (one in the callback) "
        f"recovered={recovered} run twice={ran_twice} failed (WorkerLost)={len(failed_ids)} "
        f"callback runs={len(runs)} (attempts={attempts}, lost={lost}) "
        f"last member end -> callback start={started - last_member_end} ms"
    )
    assert keys_without_ttl(rr, workers_live=True) == []


def test_a_retried_member_counts_once_and_the_callback_runs_once(rr, procs, report):
    plain = [tasks.fanout_member.job(i, 0) for i in range(5)]
    result = group(
        [
            *plain,
            tasks.fanout_fails_once.job("flaky"),
            tasks.fanout_fails_until_fixed.job("fixme"),
        ],
        callback=tasks.fanout_callback.job("retried"),
    ).enqueue()
    watch = GroupWatch(result)
    flaky_id, fixme_id = result.member_ids[-2:]
    procs.start("runscheduler")  # promotes the retry from the delayed set
    procs.start("runworker")
    wait_until(watch.ended, 30, "every member to end")
    wait_until(lambda: result.callback.status == SUCCESSFUL, 30, "the callback")

    flaky = default().get_result(flaky_id)
    assert flaky.status == SUCCESSFUL and flaky.attempts == 2
    assert default().get_result(fixme_id).status == FAILED
    first_end = result.state
    assert (first_end.ended, first_end.failed, first_end.total) == (7, 1, 7)
    assert callback_runs(rr, "retried")[0]["results"] == [0, 1, 2, 3, 4, "flaky", None]

    # The operator retries the failed member after the group ended: it runs again and
    # succeeds, but its end was counted already.
    rr.set("test:fixed:fixme", 1)
    assert default().broker.operate("retry_failed", "default", [fixme_id]) == 1
    wait_until(lambda: default().get_result(fixme_id).status == SUCCESSFUL, 30, "the rerun")
    watch.ended()
    again = result.state
    assert (again.ended, again.failed, again.total) == (7, 1, 7)
    assert again.finished_at_ms == first_end.finished_at_ms
    assert len(callback_runs(rr, "retried")) == 1
    assert default().get_result(result.callback_id).attempts == 1
    assert Counter(rr.lrange(tasks.FANOUT_MEMBERS, 0, -1))["fixme"] == 2
    report(f"retried members: ended={again.ended}/{again.total} after a retry and a rerun")
    assert keys_without_ttl(rr, workers_live=True) == []


def test_cancelling_a_group_cancels_what_has_not_started(rr, procs):
    members = 50
    result = group(
        [tasks.fanout_gate.job(i, 30) for i in range(members)],
        callback=tasks.fanout_callback.job("cancelled"),
    ).enqueue()
    procs.start("runworker")
    for i in range(3):  # let three members start, the third still running when cancelled
        wait_until(
            lambda i=i: f"started:{i}" in rr.lrange(tasks.FANOUT_MEMBERS, 0, -1), 30, "a start"
        )
        if i < 2:
            rr.rpush(f"test:gate:{i}", 1)
    assert result.cancel() == members - 3 + 1  # the members not started, and the callback
    rr.rpush("test:gate:2", 1)
    result.wait(timeout=30)

    stored = result.members
    assert [m.status for m in stored[:3]] == [SUCCESSFUL] * 3
    for member in stored[3:]:
        assert member.status == FAILED and error_class(member).endswith("JobCancelled")
        assert member.started_at is None
    callback = result.callback
    assert callback.status == FAILED and error_class(callback).endswith("JobCancelled")
    assert callback.started_at is None and callback_runs(rr, "cancelled") == []
    assert rr.lrange(tasks.FANOUT_MEMBERS, 0, -1) == ["started:0", "started:1", "started:2"]
    state = result.state
    assert state.cancelled and (state.ended, state.failed) == (members, members - 3)
    assert default().queries.queue_length("default") == 0
    assert default().queries.running_count() == 0
    assert keys_without_ttl(rr, workers_live=True) == []


# Chains


def test_chains_keep_their_order_under_concurrency(rr, procs, report):
    chains, length = 20, 5
    results = [
        chain(*(tasks.fanout_step.job(c, s, False) for s in range(length))).enqueue()
        for c in range(chains)
    ]
    broken = chain(*(tasks.fanout_step.job("broken", s, s == 1) for s in range(length))).enqueue()
    started = time.monotonic()
    procs.start("runworker", "--concurrency", "4")
    ends = [steps[-1].id for steps in results] + [broken[1].id]
    wait_until(lambda: all_ended(default(), ends), 30, "every chain to end")
    elapsed = time.monotonic() - started

    ledger = rr.lrange(tasks.FANOUT_STEPS, 0, -1)
    for c in range(chains):
        assert [e for e in ledger if e.startswith(f"{c}:")] == [f"{c}:{s}" for s in range(length)]
    assert [e for e in ledger if e.startswith("broken:")] == ["broken:0", "broken:1"]
    assert default().get_result(broken[1].id).status == FAILED
    for step in broken[2:]:
        stored = default().get_result(step.id)
        assert stored.status == FAILED and error_class(stored).endswith("DependencyFailed")
        reason = stored.errors[-1].traceback  # names the step whose failure started it
        assert f"job {broken[1].id}, which" in reason or f"job {broken[1].id} failed" in reason
        assert stored.started_at is None and stored.attempts == 0
    chain_of = [entry.split(":")[0] for entry in ledger]
    interleaved = sum(1 for a, b in itertools.pairwise(chain_of) if a != b)
    report(
        f"chains: {chains}x{length} steps + 1 broken, concurrency 4, {elapsed:.1f} s, "
        f"{interleaved} switches between chains in the ledger"
    )
    assert keys_without_ttl(rr, workers_live=True) == []


# Broadcast


def outcomes(rr, number):
    """How each worker's run of broadcast message ``number`` ended, as recorded."""
    message = rr.hgetall(leased().keys.broadcast_message(number))
    return [value.split()[0] for name, value in message.items() if name.startswith("ran:")]


def broadcast_pids(rr, label):
    """The pids of the workers that ran broadcast ``label``, in the order they ran it."""
    return [
        int(entry.rsplit(":", 1)[1])
        for entry in rr.lrange(tasks.FANOUT_BROADCASTS, 0, -1)
        if entry.startswith(f"{label}:")
    ]


def test_broadcast_runs_once_per_live_worker_and_a_dead_one_holds_nothing(rr, procs, report):
    keys = leased().keys
    job = tasks.fanout_pid.using(backend="leased").job
    procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *LEASED) for _ in range(3)]
    wait_until(lambda: rr.zcard(keys.broadcast_cursors) == 3, 15, "three workers registered")

    first = broadcast(job("first"))
    wait_until(lambda: len(broadcast_pids(rr, "first")) >= 3, 15, "three runs")
    assert sorted(broadcast_pids(rr, "first")) == sorted(w.pid for w in workers)
    wait_until(lambda: outcomes(rr, first) == ["SUCCESSFUL"] * 3, 15, "the three outcomes")
    wait_until(lambda: rr.zcard(keys.broadcast_unread) == 0, 15, "the message read by all")

    # A busy worker has not read the next message: it is kept for it while it lives.
    # Busy until killed below, however slowly a loaded host gets there.
    busy_job = tasks.fanout_busy.using(backend="leased").enqueue(600)
    started = wait_until(lambda: rr.lindex(tasks.FANOUT_BUSY, 0), 15, "the busy job")
    busy = next(w for w in workers if w.pid == int(started.split(":")[1]))
    idle = [w.pid for w in workers if w is not busy]
    second = broadcast(job("second"))
    wait_until(lambda: len(broadcast_pids(rr, "second")) >= 2, 15, "the idle workers' runs")
    assert sorted(broadcast_pids(rr, "second")) == sorted(idle)
    assert rr.zrange(keys.broadcast_unread, 0, -1) == [str(second)]

    # A worker started now reads from its start, not the message still unread.
    late = procs.start("runworker", *LEASED)
    wait_until(lambda: rr.zcard(keys.broadcast_cursors) == 4, 15, "the fourth worker")
    third = broadcast(job("third"))
    wait_until(lambda: len(broadcast_pids(rr, "third")) >= 3, 15, "the idle workers' runs")
    assert sorted(broadcast_pids(rr, "third")) == sorted([*idle, late.pid])
    assert late.pid not in broadcast_pids(rr, "first") + broadcast_pids(rr, "second")
    assert busy.pid not in broadcast_pids(rr, "second") + broadcast_pids(rr, "third")
    assert rr.zrange(keys.broadcast_unread, 0, -1) == [str(second), str(third)]

    # Killed, the busy worker holds them for one liveness window (a lease) past its last
    # heartbeat, and no longer than the first scheduler step after that.
    rr.rpush("test:busy:2", 1)  # the recovered job's next attempt ends at once
    procs.kill(busy)
    busy_id = next(w for w in rr.zrange(keys.workers, 0, -1) if f":{busy.pid}:" in w)
    last_heartbeat = int(rr.zscore(keys.workers, busy_id))
    window = leased().broker.lease_ms
    observed = []  # (Redis's time, unread messages, the scheduler's last step)

    def unread_now():
        pipe = rr.pipeline(transaction=True)
        pipe.time()
        pipe.zcard(keys.broadcast_unread)
        pipe.zrange(keys.schedulers, -1, -1, withscores=True)
        (seconds, micros), unread, [(_, stepped)] = pipe.execute()
        observed.append((seconds * 1000 + micros // 1000, unread, int(stepped)))
        return unread == 0

    # Within the window, every new message trims (broadcast, and each worker's receive)
    # and must keep the dead worker's cursor; after it, the scheduler's step drops it.
    deadline = last_heartbeat + window
    sent_during = 0
    while redis_ms(rr) < deadline - 150:
        broadcast(job("during"))
        sent_during += 1
        unread_now()
        time.sleep(0.1)  # the pace of the messages, not a wait for a condition
    wait_until(unread_now, window / 1000 + IDLE_WAIT + 2, "the dead worker's cursor to go")
    held_for = observed[-1][0] - last_heartbeat
    live = 3 * sent_during
    wait_until(lambda: len(broadcast_pids(rr, "during")) >= live, 15, "the live workers' runs")
    assert sorted(set(broadcast_pids(rr, "during"))) == sorted([*idle, late.pid])
    assert len(broadcast_pids(rr, "during")) == live
    assert [seen for seen in observed if seen[0] < deadline and not seen[1]] == []  # too soon
    assert [seen for seen in observed if seen[2] > deadline and seen[1]] == []  # too late
    assert busy_id not in rr.zrange(keys.broadcast_cursors, 0, -1)
    assert busy_job.wait(timeout=15) is True  # recovered, and run again by another worker
    report(
        f"broadcast: 3 + 1 late workers, each message run once per live worker; "
        f"a dead worker held {2 + sent_during} messages for {held_for} ms past its last "
        f"heartbeat (window {window} ms, scheduler idle step {IDLE_WAIT:.0f} s)"
    )
    assert keys_without_ttl(rr, workers_live=True) == []


# Keys


def test_no_key_is_left_without_a_ttl(rr, procs):
    keys = leased().keys
    using = {"backend": "leased"}
    procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *LEASED) for _ in range(2)]
    wait_until(lambda: rr.zcard(keys.broadcast_cursors) == 2, 30, "two workers registered")

    done = group(
        [
            *(tasks.fanout_member.using(**using).job(i, 1) for i in range(5)),
            tasks.fanout_fails_once.using(**using).job("ttl"),  # through the delayed set
            tasks.fanout_fails_until_fixed.using(**using).job("never"),
        ],
        callback=tasks.fanout_callback.using(**using).job("ttl"),
    ).enqueue()
    cancelled = group(
        [tasks.fanout_member.using(**using).job(i, 20) for i in range(10)],
        callback=tasks.fanout_callback.using(**using).job("ttl-cancelled"),
    ).enqueue()
    cancelled.cancel()
    steps = chain(*(tasks.fanout_step.using(**using).job("ttl", s, s == 1) for s in range(3)))
    steps = steps.enqueue()
    after = tasks.fanout_member.using(depends_on=steps[0], **using).enqueue(-1, 0)
    broadcast(tasks.fanout_pid.using(**using).job("ttl"))

    done.wait(timeout=30)
    cancelled.wait(timeout=30)  # its members that had started have ended too
    ends = [done.callback_id, cancelled.callback_id, steps[-1].id, after.id]
    wait_until(lambda: all_ended(leased(), ends), 30, "every job to end")
    wait_until(lambda: len(broadcast_pids(rr, "ttl")) >= 2, 30, "the broadcast")
    assert sorted(broadcast_pids(rr, "ttl")) == sorted(w.pid for w in workers)
    wait_until(lambda: rr.zcard(keys.broadcast_unread) == 0, 30, "the broadcast read")
    assert keys_without_ttl(rr, workers_live=True) == []

    # A worker stopped takes its cursor along; one killed leaves it behind, which must
    # go once the worker's window has passed, whether or not a broadcast is sent since.
    procs.kill(workers[0])
    procs.stop(workers[1])
    window = leased().broker.lease_ms / 1000
    leftovers = last_read(lambda: keys_without_ttl(rr, workers_live=False), window + IDLE_WAIT + 2)
    assert leftovers == [], {key: rr.zrange(key, 0, -1) for key in leftovers}
