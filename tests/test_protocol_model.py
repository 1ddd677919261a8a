"""A model-based test of the delivery protocol: the Lua scripts, driven through
``Broker`` against the suite's real redis-server, step by step, while a Python model
says where every job must be.

Hypothesis' stateful testing chooses the steps: enqueues (now, in the past, a few ms
ahead, an hour ahead; through the task API or ``Broker.enqueue``), claims by three
fake workers over the queues in various orders (alone or finishing the worker's
previous job in the same call), every outcome (SUCCESSFUL, FAILED, RETRY with a
delay, RELEASE), finishes by a wrong owner, heartbeats, scheduler ticks (with and
without recovery, small and large batches), cancels, every dashboard action,
abandon, workers that vanish, claims whose reply is lost, SCRIPT FLUSH, Redis errors
injected before a script, and a real out-of-memory Redis. After every step the
invariants read Redis directly and compare it with the model: each job in exactly one
place with the status, owner, counters, errors, TTL and FIFO place the model says;
the per-queue counts, the failed index, the stats and the wake-up lists agree; no
stray key.

How the test controls time
--------------------------
The scripts read Redis's clock (TIME), which a test cannot move. So:

- Leases never run out by themselves: the broker under test has a one-hour lease.
  A lease runs out only when the ``lease_runs_out`` step moves that job's deadline
  into the past in the running zset (ZADD score 0), which simulates time passing for
  that job alone. The model knows per job whether its lease has passed.
- Due times: a job due an hour ahead is due only when the ``becomes_due`` step moves
  its score in ``{P}:delayed:<queue>`` to 0 (same trick). Jobs due in the past, now
  (RETRY in 0 ms) or SOON (20 ms) ahead are left to real time: the model learns each
  due time from the delayed zset (checking it lies in the window of Redis clock
  readings around the call that set it), and between two steps the test sleeps until
  Redis's clock has passed every SOON due time (``let_time_pass``; the only real
  sleep, 20 ms at most, in the few steps that set such a due time). It also waits
  for the clock to reach the next ms, so no two steps share one.
- So no step depends on how fast the previous ones ran: a job SOON due is due from
  the next step on; finish times and lease deadlines of different steps differ. Where
  a script's own clock reading still decides (a due time falling between the Redis
  clock readings taken just before and just after an enqueue or a tick: an enqueue
  slower than 20 ms), the model accepts exactly the outcomes some instant of that
  window would give, and follows the one Redis took.

Job ids are made deterministic (``backend.new_job_id`` is replaced during the test by
a counter hashed into an id), so that a failing sequence replays with the same ids,
and so the same ties between equal scores.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from unittest import mock

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_redisqueue.broker import (
    FAILED,
    RELEASE,
    RETRY,
    SUCCESSFUL,
    Broker,
    NewJob,
    Outcome,
)
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.exceptions import NotCancellable
from tests import tasks

QUEUES = ("high", "default", "low")
# Orders in which a worker (or a scheduler) serves queues.
ORDERS = (
    ("high", "default", "low"),
    ("low", "default", "high"),
    ("default",),
    ("low", "high"),
    ("high",),
)
TICK_QUEUES = (QUEUES, ("low", "default", "high"), ("default",), ())
WORKERS = ("w1", "w2", "w3")
PRIORITIES = (-100, 0, 5, 100)
FAR = 3_600_000  # ms: an hour, longer than any run of this test
SOON = 20  # ms: a due time that real time reaches (between two steps)
DELAYS = {"now": None, "past": -1000, "soon": SOON, "an hour": FAR}
RETRY_IN = (0, SOON, FAR)
LEASE = 3600.0  # s: leases pass only when a step says so
RESULT_TTL = 24 * 3600  # the backend's (cancel goes through the backend)
LOST_LIMIT = 2

ERROR = '{"exception_class_path":"builtins.ValueError","traceback":"boom"}'
LOST_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.LeaseLost","traceback":""}'
CANCEL_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.JobCancelled"}'

# Errors Redis (or the way to it) raises; injected before a script runs.
INJECTED = {
    "oom": lambda: redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'."
    ),
    "readonly": lambda: redis.exceptions.ReadOnlyError(
        "You can't write against a read only replica."
    ),
    "busy": lambda: redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    "connection": lambda: redis.exceptions.ConnectionError("Connection reset by peer"),
    "timeout": lambda: redis.exceptions.TimeoutError("Timeout reading from socket"),
}

# Steps, distinct model states and examples over the run, reported at the end.
RUN: Counter[str] = Counter()
STATES: set[int] = set()

QUEUED, DELAYED, RUNNING, FINISHED, DELETED = "queue", "delayed", "running", "finished", "deleted"
STATUSES = (SUCCESSFUL, FAILED, RETRY, RELEASE)

# Strategies. Jobs and workers are picked by index in lists the model keeps in a
# stable order (PICK modulo the length).
# Jobs go to "default" at priority 0 more often than elsewhere: FIFO is a promise
# among equal priorities of one queue, so it needs jobs that share both.
JOB_QUEUE = st.sampled_from(["default", "default", "high", "low"])
PRIORITY = st.sampled_from([0, 0, *PRIORITIES])
STATUS = st.sampled_from(STATUSES)
RETRY_DELAY = st.sampled_from(RETRY_IN)
PICK = st.integers(0, 1 << 16)
WORKER = st.sampled_from(WORKERS)
ORDER = st.just(QUEUES) | st.sampled_from(ORDERS)  # all queues, in order, half the time
WRONG = st.sampled_from(["stale", "other worker", "made up", "empty"])


class FaultyRedis(redis.Redis):
    """A client whose next script call can be made to fail: refused before it runs
    (``fault``), or run with its reply lost (``lose_reply``)."""

    fault: Exception | None = None
    lose_reply: Exception | None = None

    def evalsha(self, sha, numkeys, *keys_and_args):  # type: ignore[override]
        if self.fault is not None:
            exc, self.fault = self.fault, None
            raise exc
        reply = super().evalsha(sha, numkeys, *keys_and_args)
        if self.lose_reply is not None:
            exc, self.lose_reply = self.lose_reply, None
            raise exc
        return reply

    def pipeline(self, transaction=True, shard_hint=None):  # type: ignore[override]
        pipe = FaultyPipeline(self.connection_pool, self.response_callbacks, transaction, None)
        pipe.owner = self
        return pipe


class FaultyPipeline(redis.client.Pipeline):
    """A pipeline of FaultyRedis: a pipeline that calls scripts fails as FaultyRedis's
    script calls do (the broker pipelines its calls with REPLICA_ACKS)."""

    owner: FaultyRedis

    def execute(self, raise_on_error=True):  # type: ignore[override]
        owner = self.owner
        if not any(args[0] == "EVALSHA" for args, _ in self.command_stack):
            return super().execute(raise_on_error)
        if owner.fault is not None:
            exc, owner.fault = owner.fault, None
            self.reset()
            raise exc
        replies = super().execute(raise_on_error)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            return replies  # nothing ran: the reply to lose is the next call's, as above
        if owner.lose_reply is not None:
            exc, owner.lose_reply = owner.lose_reply, None
            raise exc
        return replies


class Ids:
    """Deterministic job ids in a pseudo-random order (ties between equal scores are
    broken by id in Redis)."""

    def __init__(self) -> None:
        self.n = 0

    def new_job_id(self) -> str:
        self.n += 1
        return hashlib.sha256(str(self.n).encode()).hexdigest()[:26]


@dataclass
class Job:
    """Where the model says a job is, and what its hash must hold."""

    id: str
    n: int  # the order of creation, to pick jobs the same way on every replay
    queue: str
    priority: int
    place: str = QUEUED
    final: str = ""  # SUCCESSFUL or FAILED, when FINISHED
    seq: int = 0  # its place among the jobs of its priority (FIFO), kept on give-back
    due: int | None = None  # when DELAYED: the due time (ms), None until read back
    due_window: tuple[int, int] = (0, 0)
    deadline: int | None = None  # when RUNNING: the lease deadline (ms)
    deadline_window: tuple[int, int] = (0, 0)
    owner: str | None = None
    attempts: int = 0
    lost: int = 0
    workers: list[str] = field(default_factory=list)
    errors: int = 0
    result: str | None = None
    cancelled: bool = False
    indexed: bool = False  # in its queue's failed index
    finished_at: int | None = None
    finish_window: tuple[int, int] = (0, 0)
    waiters: bool = False
    done: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<job #{self.n} {self.id[:8]} {self.queue}/{self.priority} {self.status}>"

    @property
    def status(self) -> str:
        return {RUNNING: "RUNNING", FINISHED: self.final}.get(self.place, "READY")

    @property
    def expired(self) -> bool:
        return self.place == RUNNING and self.deadline == 0


def snapshot(r: redis.Redis, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """Every key's type, contents and whether it expires."""
    state: dict[str, object] = {}
    for key in sorted(r.keys("*")):
        if key.startswith(skip):
            continue
        kind = r.type(key)
        if kind == "string":
            value: object = r.get(key)
        elif kind == "hash":
            value = r.hgetall(key)
        elif kind == "list":
            value = r.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(r.smembers(key))
        elif kind == "zset":
            value = r.zrange(key, 0, -1, withscores=True)
        else:
            value = None
        state[key] = (kind, value, r.ttl(key) > 0)
    return state


def run_after(due_ms: int) -> tuple[datetime, int]:
    """A run_after for a due time, and the due time (ms) the backend derives from it."""
    when = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
    return when, int(when.timestamp() * 1000)


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self, env: dict) -> None:
        super().__init__()
        self.r: redis.Redis = env["r"]
        self.backend = env["backend"]
        self.client: FaultyRedis = env["client"]
        self.broker: Broker = env["broker"]
        self.keys = self.broker.keys
        self.ids: Ids = env["ids"]
        self.ids.n = 0
        self.client.fault = self.client.lose_reply = None
        self.r.flushall()
        self.jobs: dict[str, Job] = {}
        self.seq = 0
        self.paused: set[str] = set()
        self.held: dict[str, dict[str, str]] = {w: {} for w in WORKERS}
        self.issued: list[tuple[str, str]] = []  # every (job id, owner token) handed out
        self.stats: Counter[str] = Counter()
        self.heartbeats: set[str] = set()
        self.schedulers: set[str] = set()
        self.lease_ms = self.broker.lease_ms
        self.last_clock = 0
        assert self.backend.config.result_ttl == RESULT_TTL
        self.started = self.clock()
        RUN["examples"] += 1

    # Redis's clock, read around each call: the window in which its script ran.

    def clock(self) -> int:
        seconds, micros = self.r.time()
        now = int(seconds) * 1000 + int(micros) // 1000
        self.last_clock = max(self.last_clock, now)
        return now

    def let_time_pass(self) -> None:
        """Between two steps, Redis's clock moves past every due time set SOON ahead,
        and past the last ms a step has seen, so that no two steps share a ms: then no
        step's result depends on how fast the previous ones ran (due or not yet, ties
        between finish times or lease deadlines), and a failing sequence replays."""
        near = self.started + FAR // 2
        target = max(
            [self.last_clock, *(j.due for j in self.job_list(DELAYED) if j.due and j.due < near)]
        )
        ahead = target - self.clock()
        if ahead > 1:
            time.sleep(min(ahead, 2 * SOON) / 1000)
            RUN["sleeps"] += 1
        while self.clock() <= target:
            time.sleep(0.0002)

    # The model's moves, as common.lua makes them.

    def job_list(self, *places: str) -> list[Job]:
        return [j for j in self.jobs.values() if not places or j.place in places]

    def queue_order(self, queue: str) -> list[Job]:
        ready = [j for j in self.jobs.values() if j.place == QUEUED and j.queue == queue]
        return sorted(ready, key=lambda j: (-j.priority, j.seq))

    def failed_order(self, queue: str) -> list[Job]:
        failed = [j for j in self.jobs.values() if j.indexed and j.queue == queue]
        return sorted(failed, key=lambda j: (j.finished_at, j.id))

    def push_ready(self, job: Job) -> None:
        """To the back of its priority in its queue."""
        self.seq += 1
        job.seq, job.place, job.due = self.seq, QUEUED, None

    def requeue(self, job: Job) -> None:
        """Back to the place it had in its queue."""
        job.place = QUEUED

    def push_delayed(self, job: Job, due: int | None, window: tuple[int, int]) -> None:
        job.place, job.due, job.due_window = DELAYED, due, window

    def leave_running(self, job: Job) -> None:
        job.owner, job.deadline = None, None

    def forget_attempt(self, job: Job) -> None:
        job.attempts = max(job.attempts - 1, 0)
        if job.workers:
            job.workers.pop()

    def record_outcome(
        self, job: Job, status: str, window: tuple[int, int], error: bool, result: str = ""
    ) -> None:
        job.place, job.final = FINISHED, status
        job.finished_at, job.finish_window = None, window
        if status == FAILED and not job.cancelled:
            job.indexed = True
        job.errors += error
        if result:
            job.result = result
        self.stats[("failed:" if status == FAILED else "ok:") + job.queue] += 1
        if job.waiters:
            job.done.append(status)

    def m_finish(self, outcome: Outcome | None, window: tuple[int, int]) -> bool | None:
        if outcome is None:
            return None
        job = self.jobs.get(outcome.job_id)
        if job is None or job.place != RUNNING or job.owner != outcome.owner:
            return False
        self.leave_running(job)
        t0, t1 = window
        if outcome.status == RETRY:
            job.errors += 1
            self.push_delayed(job, None, (t0 + outcome.retry_in_ms, t1 + outcome.retry_in_ms))
        elif outcome.status == RELEASE:
            self.forget_attempt(job)
            self.requeue(job)
        else:
            self.record_outcome(job, outcome.status, window, bool(outcome.error), outcome.result)
        return True

    def m_claim(self, queues, worker: str, window: tuple[int, int]) -> Job | None:
        for queue in queues:
            if queue in self.paused:
                continue
            ready = self.queue_order(queue)
            if ready:
                job = ready[0]
                job.attempts += 1
                job.owner = f"{worker}/{job.attempts}"
                job.workers.append(worker)
                job.place, job.deadline = RUNNING, None
                job.deadline_window = (window[0] + self.lease_ms, window[1] + self.lease_ms)
                self.issued.append((job.id, job.owner))
                return job
        return None

    def m_abandon(self, worker: str) -> list[Job]:
        mine = [
            j
            for j in self.job_list(RUNNING)
            if j.owner is not None and j.owner.startswith(worker + "/")
        ]
        mine.sort(key=lambda j: (j.deadline if j.deadline is not None else FAR * 1000, j.id))
        for job in mine:
            self.leave_running(job)
            self.forget_attempt(job)
            self.requeue(job)
        return mine

    # Reading back what a script decided with its own clock.

    def settle(self) -> None:
        """Learn the exact due times, lease deadlines and finish times the last step set,
        checking each lies in the window of the call that set it."""
        for job in self.jobs.values():
            if job.place == DELAYED and job.due is None:
                score = self.r.zscore(self.keys.delayed(job.queue), job.id)
                if score is not None:
                    lo, hi = job.due_window
                    assert lo <= score <= hi, f"job {job.n}: due {score} not in {job.due_window}"
                    job.due = int(score)
            elif job.place == RUNNING and job.deadline is None:
                score = self.r.zscore(self.keys.running, job.id)
                if score is not None:
                    lo, hi = job.deadline_window
                    assert lo <= score <= hi, f"job {job.n}: lease {score} not in {lo}..{hi}"
                    job.deadline = int(score)
            elif job.place == FINISHED and job.finished_at is None:
                stored = self.r.hget(self.keys.job(job.id), "finished_at")
                if stored is not None:
                    lo, hi = job.finish_window
                    assert lo <= int(stored) <= hi, f"job {job.n}: finished_at {stored}"
                    job.finished_at = int(stored)

    # Operations: each calls the broker, then moves the model and compares the reply.
    # If the call raises, the model is left as it was.

    def op_enqueue(self, queue: str, priority: int, delay: int | None, via_api: bool) -> None:
        if not via_api:
            self.op_enqueue_batch([(queue, priority, delay)])
            return
        t0 = self.clock()
        when, due = (None, 0) if delay is None else run_after(t0 + delay)
        task = tasks.noop.using(queue_name=queue, priority=priority, run_after=when)
        job_id = task.enqueue().id
        self.place_new(job_id, queue, priority, due, t0, self.clock())

    def op_enqueue_batch(self, specs: list[tuple[str, int, int | None]]) -> None:
        """Jobs (queue, priority, delay) stored by one enqueue call, in that order."""
        prepared = [self.backend.prepare(tasks.noop, (), {}) for _ in specs]
        t0 = self.clock()
        jobs = [
            NewJob(result.id, queue, priority, result._payload, 0 if delay is None else t0 + delay)
            for result, (queue, priority, delay) in zip(prepared, specs, strict=True)
        ]
        enqueued = self.broker.enqueue(jobs)
        t1 = self.clock()
        assert len(enqueued) == len(jobs)
        for job, enqueued_at in zip(jobs, enqueued, strict=True):
            assert enqueued_at is not None and t0 <= enqueued_at <= t1
            self.place_new(job.job_id, job.queue, job.priority, job.due_ms, t0, t1)

    def place_new(self, job_id: str, queue: str, priority: int, due: int, t0: int, t1: int):
        """Model a job just stored, due at ``due`` (0: now), between t0 and t1."""
        job = Job(job_id, len(self.jobs), queue, priority)
        self.jobs[job_id] = job
        if due > t1:
            self.push_delayed(job, due, (due, due))
        elif due <= t0:
            self.push_ready(job)
        else:  # the script's clock decided; either is right
            if self.r.zscore(self.keys.delayed(queue), job_id) is not None:
                self.push_delayed(job, due, (due, due))
            else:
                self.push_ready(job)

    def op_claim(self, worker: str, order, outcome: Outcome | None, woken_by: str = "") -> None:
        """``woken_by``: the worker took that queue's wake-up token (BLPOP) first."""
        if woken_by:
            self.r.lpop(self.keys.wake(woken_by))
        t0 = self.clock()
        stored, claimed = self.broker.claim(order, worker, outcome, woken_by=woken_by)
        t1 = self.clock()
        expected_stored = self.m_finish(outcome, (t0, t1))
        job = self.m_claim(order, worker, (t0, t1))
        if woken_by in QUEUES and woken_by not in self.paused:
            waiting = any(j.queue == woken_by for j in self.job_list(QUEUED))
            tokens = self.r.llen(self.keys.wake(woken_by))
            assert tokens == int(waiting), f"wake:{woken_by}: {tokens} token(s) after a pass-on"
        if outcome is not None:
            self.drop_held(worker, outcome)
        assert stored is expected_stored, f"stored {stored}, model {expected_stored}"
        if job is None:
            assert claimed is None, f"claimed {claimed} from {order}; model: nothing"
            return
        assert claimed is not None, f"model: job {job.n} claimed from {order}"
        assert claimed.job_id == job.id, (
            f"claimed {claimed.job_id}, model: job {job.n} ({job.id}) first in {job.queue}"
        )
        assert claimed.owner == job.owner
        fields = claimed.fields
        assert fields["status"] == "RUNNING"
        assert int(fields["attempts"]) == job.attempts
        assert fields["workers"] == ",".join(job.workers)
        assert fields["queue"] == job.queue and int(fields["priority"]) == job.priority
        assert int(fields.get("lost", 0)) == job.lost
        assert fields["payload"]
        assert t0 <= int(fields["last_attempted_at"]) <= t1
        self.held[worker][job.id] = job.owner
        RUN["claims"] += 1

    def op_finish(self, worker: str, outcome: Outcome) -> None:
        t0 = self.clock()
        stored = self.broker.finish(outcome)
        t1 = self.clock()
        expected = self.m_finish(outcome, (t0, t1))
        self.drop_held(worker, outcome)
        assert stored is expected, f"finish stored {stored}, model {expected}"

    def op_heartbeat(self, worker: str, extra: dict[str, str]) -> None:
        owned = {**self.held[worker], **extra}
        t0 = self.clock()
        lost = self.broker.heartbeat(worker, {}, owned)
        t1 = self.clock()
        expected = []
        for job_id, token in owned.items():
            job = self.jobs.get(job_id)
            if job is not None and job.place == RUNNING and job.owner == token:
                job.deadline = None
                job.deadline_window = (t0 + self.lease_ms, t1 + self.lease_ms)
            else:
                expected.append(job_id)
        assert lost == expected, f"heartbeat lost {lost}, model {expected}"
        for job_id in lost:
            self.held[worker].pop(job_id, None)
        self.heartbeats.add(worker)

    def op_tick(
        self, scheduler: str, queues, batch: int, recover: bool, held: bool = False
    ) -> None:
        """``held``: the step reaches Redis after the time it may recover leases by."""
        before_delayed = [j for j in self.job_list(DELAYED) if j.queue in queues]
        t0 = self.clock()
        tick = self.broker.tick(
            scheduler,
            queues,
            batch=batch,
            lost_limit=LOST_LIMIT,
            lost_error=LOST_ERROR,
            recover=recover,
            recover_until_ms=t0 - 1 if held else t0 + 60_000,
        )
        t1 = self.clock()
        assert tick.held == held, tick
        recover = recover and not held
        before_running = self.job_list(RUNNING) if recover else []
        pipe = self.r.pipeline(transaction=False)
        for job in before_delayed:
            pipe.zscore(self.keys.delayed(job.queue), job.id)
        for job in before_running:
            pipe.zscore(self.keys.running, job.id)
        scores = pipe.execute()
        moved = {
            j.id for j, s in zip(before_delayed + before_running, scores, strict=True) if s is None
        }

        def predict(now: int):
            promoted, full = [], False
            for queue in queues:
                due = [j for j in before_delayed if j.queue == queue and j.due <= now]
                due = sorted(due, key=lambda j: (j.due, j.id))[:batch]
                promoted += due
                full = full or len(due) == batch
            expired = sorted(
                (j for j in before_running if j.deadline <= now), key=lambda j: (j.deadline, j.id)
            )[:batch]
            full = full or (recover and len(expired) == batch)
            return promoted, expired, full

        # The tick's clock reading lies in [t0, t1]; only a due time or deadline inside
        # that window can make a difference between the instants.
        inside = {j.due for j in before_delayed if t0 < j.due <= t1}
        inside |= {j.deadline for j in before_running if t0 < j.deadline <= t1}
        instants = [t0, *sorted(inside)]
        for now in instants:
            promoted, expired, full = predict(now)
            if {j.id for j in promoted + expired} == moved:
                break
        else:
            raise AssertionError(
                f"tick moved {sorted(self.jobs[i].n for i in moved)}; no instant in "
                f"[{t0}, {t1}] explains it (model at {t0}: "
                f"{[j.n for j in predict(t0)[0] + predict(t0)[1]]})"
            )
        for job in promoted:
            self.push_ready(job)
        recovered = failed = 0
        for job in expired:
            self.leave_running(job)
            job.lost += 1
            if job.lost > LOST_LIMIT:
                self.record_outcome(job, FAILED, (t0, t1), error=True)
                failed += 1
            else:
                self.requeue(job)
                recovered += 1
        model = (len(promoted), recovered, failed)
        assert (tick.promoted, tick.recovered, tick.failed) == model, f"{tick}, model {model}"
        later = [j.due for j in self.job_list(DELAYED) if j.queue in queues]
        if recover:
            later += [j.deadline for j in self.job_list(RUNNING)]
        if full:
            assert tick.next_in == 0, f"a full batch: next_in {tick.next_in}"
        elif not later:
            assert tick.next_in is None, f"nothing left: next_in {tick.next_in}"
        else:
            nearest = min(later)
            assert tick.next_in is not None
            next_ms = round(tick.next_in * 1000)
            assert max(nearest - t1, 0) <= next_ms <= max(nearest - t0, 0), (
                f"next_in {tick.next_in} for {nearest} in [{t0}, {t1}]"
            )
        self.schedulers.add(scheduler)
        RUN["promoted"] += len(promoted)
        RUN["recovered"] += recovered
        RUN["failed by lost leases"] += failed

    def op_cancel(self, job: Job, via_api: bool) -> None:
        t0 = self.clock()
        if via_api:
            try:
                self.backend.cancel(job.id)
                status: str | None = "CANCELLED"
            except NotCancellable:
                status = "not cancellable"
            except TaskResultDoesNotExist:
                status = None
        else:
            status = self.broker.cancel(job.id, CANCEL_ERROR)
        t1 = self.clock()
        if job.place == DELETED:
            expected = None
        elif job.place in (QUEUED, DELAYED):
            job.cancelled = True
            self.record_outcome(job, FAILED, (t0, t1), error=True)
            expected = "CANCELLED"
        else:
            expected = "not cancellable" if via_api else job.status
        assert status == expected, f"cancel of job {job.n}: {status}, model {expected}"

    def op_operate(self, action: str, queue: str, ids: list[str], limit: int) -> None:
        changed = self.broker.operate(action, queue, ids, limit)
        expected = 0
        if action == "pause":
            expected = int(queue not in self.paused)
            self.paused.add(queue)
        elif action == "resume":
            expected = int(queue in self.paused)
            self.paused.discard(queue)
        else:
            if not ids:
                chosen = {
                    "empty": self.queue_order(queue),
                    "retry_failed": self.failed_order(queue),
                    "delete_failed": self.failed_order(queue),
                }.get(action, [])
                ids = [j.id for j in chosen[: limit or None]]
            for job_id in ids:
                job = self.jobs.get(job_id)
                if job is None or job.queue != queue:
                    continue
                if action in ("retry_failed", "delete_failed") and job.indexed:
                    job.indexed = False
                    if action == "delete_failed":
                        job.place, job.done = DELETED, []
                    else:
                        job.finished_at, job.result, job.waiters, job.done = None, None, False, []
                        self.push_ready(job)
                    expected += 1
                elif action == "run_now" and job.place == DELAYED:
                    self.push_ready(job)
                    expected += 1
                elif action == "empty" and job.place == QUEUED:
                    job.place = DELETED
                    expected += 1
        assert changed == expected, f"{action} {queue} {ids} {limit}: {changed}, model {expected}"

    def op_abandon(self, worker: str) -> None:
        given = self.broker.abandon(worker)
        expected = [j.id for j in self.m_abandon(worker)]  # in the running zset's order
        assert given == expected, f"abandon gave back {given}, model {expected}"
        self.held[worker].clear()

    def op_watch(self, job: Job) -> None:
        status = self.broker.watch(job.id)
        if job.place == DELETED:
            expected = None
        else:
            expected = job.status
            if job.place != FINISHED:
                job.waiters = True
        assert status == expected, f"watch job {job.n}: {status}, model {expected}"

    # Choosing what a step acts on. Every rule draws all its arguments from fixed
    # strategies and picks jobs and workers by index, with no preconditions: the shape
    # of the choices must not depend on what Redis's clock decided (a job SOON ahead
    # may or may not be due), or Hypothesis could not replay a sequence.

    def pick(self, items, index: int):
        items = list(items)
        return items[index % len(items)] if items else None

    def held_job(self, index: int) -> tuple[str, str, str] | None:
        held = [(w, i, t) for w in WORKERS for i, t in sorted(self.held[w].items())]
        return self.pick(held, index)

    def outcome(self, job_id: str, token: str, status: str, retry_in: int) -> Outcome:
        if status == SUCCESSFUL:
            return Outcome(job_id, token, status, result='{"n": 42}')
        if status == FAILED:
            return Outcome(job_id, token, status, error=ERROR)
        if status == RETRY:
            return Outcome(job_id, token, status, error=ERROR, retry_in_ms=retry_in)
        return Outcome(job_id, token, status)

    def wrong_token(self, job: Job, kind: str, index: int) -> str:
        """A token that is not the job's owner's."""
        stale = [t for i, t in self.issued if i == job.id and t != job.owner]
        if kind == "stale" and stale:
            return self.pick(stale, index)
        if kind in ("stale", "other worker"):
            mine = job.owner.split("/")[0] if job.owner else None
            other = self.pick([w for w in WORKERS if w != mine], index)
            return f"{other}/{max(job.attempts, 1)}"
        return "" if kind == "empty" else "w9/7"

    def drop_held(self, worker: str, outcome: Outcome) -> None:
        """The worker is done with a job once it has sent its outcome (its own token)."""
        if self.held[worker].get(outcome.job_id) == outcome.owner:
            del self.held[worker][outcome.job_id]

    def any_held(self) -> bool:
        return any(self.held.values())

    # Rules: producers.

    @initialize(
        batch=st.lists(
            st.tuples(
                JOB_QUEUE,
                PRIORITY,
                st.sampled_from(list(DELAYS)),
            ),
            max_size=8,
        )
    )
    def backlog(self, batch):
        """A few jobs to start with."""
        for queue, priority, delay in batch:
            self.op_enqueue(queue, priority, DELAYS[delay], via_api=False)

    @rule(
        queue=JOB_QUEUE,
        priority=PRIORITY,
        delay=st.sampled_from(list(DELAYS)),
        via_api=st.booleans(),
    )
    def enqueue(self, queue, priority, delay, via_api):
        self.op_enqueue(queue, priority, DELAYS[delay], via_api)

    @rule(queue=JOB_QUEUE, priority=PRIORITY)
    def enqueue_now(self, queue, priority):
        self.op_enqueue(queue, priority, None, via_api=False)

    @rule(
        batch=st.lists(
            st.tuples(JOB_QUEUE, PRIORITY, st.sampled_from(list(DELAYS))),
            min_size=2,
            max_size=5,
        )
    )
    def enqueue_a_batch(self, batch):
        """Several jobs, of any queues, priorities and delays, in one script call."""
        self.op_enqueue_batch([(q, p, DELAYS[d]) for q, p, d in batch])

    @rule(pick=PICK)
    def enqueue_a_taken_id(self, pick):
        """An id already taken (any job not deleted): refused, nothing changes."""
        job = self.pick(self.job_list(QUEUED, DELAYED, RUNNING, FINISHED), pick)
        if job is None:
            return
        before = snapshot(self.r)
        payload = self.backend.prepare(tasks.noop, (), {})._payload
        assert self.broker.enqueue([NewJob(job.id, "low", 5, payload)]) == [None]
        assert snapshot(self.r) == before

    # Rules: Workers.

    @rule(worker=WORKER, order=ORDER, woken_by=st.sampled_from(["", "", *QUEUES, "no/queue"]))
    def claim(self, worker, order, woken_by):
        self.op_claim(worker, order, None, woken_by)

    @rule(worker=WORKER, status=STATUS, retry_in=RETRY_DELAY)
    def work(self, worker, status, retry_in):
        """A worker's loop: finish the job in hand (if any) and claim the next."""
        outcome = None
        if self.held[worker]:
            job_id, token = min(self.held[worker].items())
            outcome = self.outcome(job_id, token, status, retry_in)
        self.op_claim(worker, QUEUES, outcome)

    @rule(pick=PICK, order=ORDER, status=STATUS, retry_in=RETRY_DELAY)
    def finish_and_claim(self, pick, order, status, retry_in):
        held = self.held_job(pick)
        if held is None:
            return
        worker, job_id, token = held
        self.op_claim(worker, order, self.outcome(job_id, token, status, retry_in))

    @rule(pick=PICK, status=STATUS, retry_in=RETRY_DELAY)
    def finish(self, pick, status, retry_in):
        held = self.held_job(pick)
        if held is None:
            return
        worker, job_id, token = held
        self.op_finish(worker, self.outcome(job_id, token, status, retry_in))

    @rule(
        pick=PICK,
        kind=WRONG,
        index=PICK,
        status=STATUS,
        retry_in=RETRY_DELAY,
        worker=WORKER,
        order=st.none() | ORDER,
    )
    def finish_by_a_wrong_owner(self, pick, kind, index, status, retry_in, worker, order):
        """Fenced out (a stale token, another worker's, a made-up one): the outcome
        changes nothing. Alone, or in a claim (then the claim goes on as usual)."""
        job = self.pick(self.jobs.values(), pick)
        if job is None:
            return
        token = self.wrong_token(job, kind, index)
        assert token != job.owner
        outcome = self.outcome(job.id, token, status, retry_in)
        if order is not None:
            self.op_claim(worker, order, outcome)
            return
        before = snapshot(self.r)
        assert self.broker.finish(outcome) is False
        assert snapshot(self.r) == before, f"a finish by {token!r} changed Redis"

    @rule(worker=WORKER, wrong=st.none() | WRONG, pick=PICK, index=PICK)
    def heartbeat(self, worker, wrong, pick, index):
        """Renews what the worker still owns; with a wrong token too, reported lost."""
        extra = {}
        if wrong is not None:
            others = [j for j in self.jobs.values() if j.id not in self.held[worker]]
            job = self.pick(others, pick)
            if job is not None:
                extra[job.id] = self.wrong_token(job, wrong, index)
            else:
                extra["no-such-job"] = f"{worker}/1"
        self.op_heartbeat(worker, extra)

    @rule(worker=WORKER)
    def abandon(self, worker):
        self.op_abandon(worker)

    @rule(worker=WORKER)
    def worker_vanishes(self, worker):
        """It stops using its tokens; its jobs come back once their lease passes."""
        self.held[worker].clear()

    @rule(worker=WORKER)
    def worker_stalls(self, worker):
        """A whole lost lease in one step: the worker claims, stalls past its lease, and
        the scheduler recovers the job (which keeps its place, so the next stalled
        claim often takes it again: after LOST_LIMIT recoveries it fails)."""
        self.op_claim(worker, QUEUES, None)
        for job in self.job_list(RUNNING):
            if job.owner and job.owner.startswith(worker + "/"):
                self.r.zadd(self.keys.running, {job.id: 0}, xx=True)
                job.deadline = 0
        self.op_tick("s1", QUEUES, 100, True)

    @rule(
        worker=WORKER,
        order=ORDER,
        with_outcome=st.booleans(),
        pick=PICK,
        status=STATUS,
        retry_in=RETRY_DELAY,
    )
    def claim_reply_lost(self, worker, order, with_outcome, pick, status, retry_in):
        """The claim runs but its reply is lost; the worker sends its outcome again
        (fenced: refused if stored) and gives back what the claim may have taken."""
        outcome = None
        held = self.pick(sorted(self.held[worker].items()), pick)
        if with_outcome and held is not None:
            outcome = self.outcome(*held, status, retry_in)
        self.client.lose_reply = redis.exceptions.ConnectionError("Connection reset by peer")
        t0 = self.clock()
        with pytest.raises(redis.exceptions.ConnectionError):
            self.broker.claim(order, worker, outcome)
        again = self.broker.finish(outcome) if outcome else None
        given = self.broker.abandon(worker)
        t1 = self.clock()
        self.m_finish(outcome, (t0, t1))
        self.m_claim(order, worker, (t0, t1))
        assert again is self.m_finish(outcome, (t0, t1))
        expected = self.m_abandon(worker)
        assert sorted(given) == sorted(j.id for j in expected)
        self.held[worker].clear()
        RUN["lost claim replies"] += 1

    # Rules: Schedulers, clients, operators.

    @rule(
        scheduler=st.sampled_from(["s1", "s2"]),
        queues=st.sampled_from(TICK_QUEUES),
        batch=st.sampled_from([1, 2, 100]),
        recover=st.sampled_from([True, True, False]),
        held=st.sampled_from([False, False, False, True]),
    )
    def tick(self, scheduler, queues, batch, recover, held):
        self.op_tick(scheduler, queues, batch, recover, held)

    @rule(pick=PICK, via_api=st.booleans())
    def cancel(self, pick, via_api):
        job = self.pick(self.jobs.values(), pick)
        if job is not None:
            self.op_cancel(job, via_api)

    @rule(pick=PICK)
    def watch(self, pick):
        job = self.pick(self.jobs.values(), pick)
        if job is not None:
            self.op_watch(job)

    @rule(
        action=st.sampled_from(["retry_failed", "delete_failed", "run_now", "empty"]),
        queue=st.sampled_from(QUEUES),
        picks=st.lists(PICK, max_size=2),
        limit=st.sampled_from([0, 1, 2]),
    )
    def operate(self, action, queue, picks, limit):
        """A dashboard action on chosen jobs (of any queue, any state), or on the first
        ``limit`` of the queue's list (0: all)."""
        ids = [self.pick(self.jobs, p) for p in picks] if self.jobs else []
        self.op_operate(action, queue, ids, 0 if ids else limit)

    @rule(action=st.sampled_from(["pause", "resume"]), queue=st.sampled_from(QUEUES))
    def pause_or_resume(self, action, queue):
        self.op_operate(action, queue, [], 0)

    # Rules: Time.

    @rule(pick=PICK, every=st.booleans())
    def lease_runs_out(self, pick, every):
        """Time passes for one running job (or all): its lease deadline moves into the
        past."""
        running = self.job_list(RUNNING)
        for job in running if every else [self.pick(running, pick)] if running else []:
            self.r.zadd(self.keys.running, {job.id: 0}, xx=True)
            job.deadline = 0

    @rule(pick=PICK)
    def becomes_due(self, pick):
        """Time passes for one delayed job: its due time moves into the past."""
        job = self.pick(self.job_list(DELAYED), pick)
        if job is not None:
            self.r.zadd(self.keys.delayed(job.queue), {job.id: 0}, xx=True)
            job.due = 0

    # Rules: Redis trouble.

    @rule(
        trouble=st.sampled_from(["script flush", "out of memory", *sorted(INJECTED)]),
        operation=st.tuples(*[PICK] * 5),
    )
    def redis_trouble(self, trouble, operation):
        """SCRIPT FLUSH (a restart, a failover: the broker loads its scripts again); an
        error before a script runs (nothing changes, and the model neither); a real
        OOM (maxmemory below what is used: a script is refused whole, before its first
        write, or runs whole; never half-way)."""
        if trouble == "script flush":
            self.r.script_flush()
            return
        before = snapshot(self.r)
        if trouble in INJECTED:
            exc = INJECTED[trouble]()
            self.client.fault = exc
            with pytest.raises(type(exc)):
                self.any_operation(*operation)
            self.client.fault = None
            assert snapshot(self.r) == before
            return
        self.r.config_set("maxmemory", 1)
        try:
            self.any_operation(*operation)
        except redis.exceptions.ResponseError as exc:
            assert "maxmemory" in str(exc), exc
            assert snapshot(self.r) == before
            RUN["refused when out of memory"] += 1
        finally:
            self.r.config_set("maxmemory", 0)

    def any_operation(self, kind: int, worker: int, pick: int, status: int, other: int) -> None:
        """One broker call of any kind; the model moves only if it succeeds."""
        kinds = ["enqueue", "claim", "heartbeat", "tick", "abandon", "retry_failed"]
        kinds += ["finish"] if self.any_held() else []
        kinds += ["cancel", "watch"] if self.jobs else []
        kind_name = self.pick(kinds, kind)
        worker_id = self.pick(WORKERS, worker)
        if kind_name == "enqueue":
            self.op_enqueue("default", 0, self.pick(DELAYS.values(), other), via_api=False)
        elif kind_name == "claim":
            self.op_claim(worker_id, QUEUES, None)
        elif kind_name == "finish":
            held_by, job_id, token = self.held_job(pick)
            outcome = self.outcome(job_id, token, self.pick(STATUSES, status), 0)
            self.op_finish(held_by, outcome)
        elif kind_name == "heartbeat":
            self.op_heartbeat(worker_id, {})
        elif kind_name == "tick":
            self.op_tick("s1", QUEUES, 100, True)
        elif kind_name == "abandon":
            self.op_abandon(worker_id)
        elif kind_name == "retry_failed":
            self.op_operate("retry_failed", self.pick(QUEUES, other), [], 0)
        elif kind_name == "cancel":
            self.op_cancel(self.pick(self.jobs.values(), pick), via_api=False)
        else:
            self.op_watch(self.pick(self.jobs.values(), pick))

    # The invariants, checked after every step by reading Redis.

    @invariant()
    def redis_holds_what_the_model_says(self):
        self.settle()
        RUN["checks"] += 1
        STATES.add(hash(self.abstract_state()))
        k, r = self.keys, self.r
        pipe = r.pipeline(transaction=False)
        for queue in QUEUES:
            pipe.zrange(k.queue(queue), 0, -1, withscores=True)
            pipe.zrange(k.delayed(queue), 0, -1, withscores=True)
            pipe.zrange(k.failed(queue), 0, -1, withscores=True)
            pipe.llen(k.wake(queue))
        pipe.zrange(k.running, 0, -1, withscores=True)
        pipe.smembers(k.paused)
        pipe.llen(k.scheduler_wake)
        jobs = list(self.jobs.values())
        for job in jobs:
            pipe.hgetall(k.job(job.id))
            pipe.ttl(k.job(job.id))
            pipe.lrange(k.done(job.id), 0, -1)
        replies = iter(pipe.execute())

        where: dict[str, list[str]] = {}
        queue_scores: dict[str, float] = {}
        for queue in QUEUES:
            ready, delayed, failed, wake = (next(replies) for _ in range(4))
            model_ready = self.queue_order(queue)
            got = [member for member, _ in ready]
            want = [j.id for j in model_ready]
            assert got == want, (
                f"queue {queue} holds {self.names(got)}; model (priority, then FIFO): "
                f"{self.names(want)}"
            )
            for member, score in ready:
                where.setdefault(member, []).append(f"queue:{queue}")
                queue_scores[member] = score
            model_delayed = {j.id: j.due for j in self.job_list(DELAYED) if j.queue == queue}
            assert dict(delayed) == model_delayed, (
                f"delayed:{queue} {self.names(dict(delayed))} {dict(delayed)}, "
                f"model {self.names(model_delayed)} {model_delayed}"
            )
            for member, _ in delayed:
                where.setdefault(member, []).append(f"delayed:{queue}")
            model_failed = {j.id: j.finished_at for j in self.failed_order(queue)}
            assert dict(failed) == model_failed, (
                f"failed:{queue} {self.names(dict(failed))}, model {self.names(model_failed)}"
            )
            assert wake <= 1, f"wake:{queue} holds {wake} tokens"
        running = dict(next(replies))
        model_running = {j.id: j.deadline for j in self.job_list(RUNNING)}
        assert running == model_running, (
            f"running {self.names(running)} {running}, model {self.names(model_running)} "
            f"{model_running}"
        )
        for member in running:
            where.setdefault(member, []).append("running")
        assert next(replies) == self.paused
        assert next(replies) <= 1, "more than one scheduler wake-up token"

        for job in jobs:
            fields, ttl, done = next(replies), next(replies), next(replies)
            self.check_job(job, fields, ttl, done, where.get(job.id, []), queue_scores)
        untracked = set(where) - set(self.jobs)
        assert not untracked, f"sets hold jobs nobody enqueued: {untracked}"

        self.check_counts()
        self.check_keys()
        self.let_time_pass()

    def check_job(self, job: Job, fields, ttl, done, places, queue_scores) -> None:
        name = f"job {job.n} ({job.id})"
        expected_places = {
            QUEUED: [f"queue:{job.queue}"],
            DELAYED: [f"delayed:{job.queue}"],
            RUNNING: ["running"],
        }.get(job.place, [])
        assert places == expected_places, f"{name} is in {places}; model: {job.place}"
        assert done == job.done, f"{name}: done list {done}, model {job.done}"
        if job.place == DELETED:
            assert not fields and ttl == -2, f"{name} was deleted but its hash is there"
            return
        assert fields, f"{name}: its hash is gone ({job.place} in the model)"
        assert fields.get("status") == job.status, f"{name}: {fields.get('status')}, {job}"
        assert fields.get("owner") == job.owner, f"{name}: owner {fields.get('owner')}, {job}"
        assert (fields["queue"], int(fields["priority"])) == (job.queue, job.priority)
        assert int(fields.get("attempts", 0)) == job.attempts, f"{name}: attempts, {job}"
        assert int(fields.get("lost", 0)) == job.lost, f"{name}: lost, {job}"
        assert fields.get("workers", "") == ",".join(job.workers), f"{name}: workers, {job}"
        errors = json.loads(fields.get("errors", "[]"))
        assert len(errors) == job.errors, f"{name}: {len(errors)} errors, model {job.errors}"
        assert fields.get("result") == job.result, f"{name}: result {fields.get('result')}"
        assert ("cancelled" in fields) == job.cancelled, f"{name}: cancelled, {job}"
        assert ("waiters" in fields) == job.waiters, f"{name}: waiters, {job}"
        assert "payload" in fields and "enqueued_at" in fields
        if job.place == FINISHED:
            assert 0 < ttl <= RESULT_TTL, f"{name}: finished with TTL {ttl}"
            assert int(fields["finished_at"]) == job.finished_at
        else:
            assert ttl == -1, f"{name}: {job.place} with TTL {ttl}"
            assert "finished_at" not in fields, f"{name}: {job.place} with a finished_at"
        if job.place == QUEUED:
            assert int(fields["score"]) == queue_scores[job.id], f"{name}: stored score"

    def check_counts(self) -> None:
        counts = self.broker.counts(QUEUES)
        for queue in QUEUES:
            expected = {
                "ready": len(self.queue_order(queue)),
                "delayed": sum(j.queue == queue for j in self.job_list(DELAYED)),
                "failed": len(self.failed_order(queue)),
                "paused": queue in self.paused,
            }
            assert counts[queue] == expected, f"counts of {queue}: {counts[queue]}, {expected}"

    def check_keys(self) -> None:
        """Every key is one the schema names; the stats count every finish."""
        k = self.keys
        allowed = {k.seq, k.running, k.scheduler_wake, k.paused, k.workers, k.schedulers}
        allowed |= {k.known_queues}
        for queue in QUEUES:
            allowed |= {k.queue(queue), k.wake(queue), k.delayed(queue), k.failed(queue)}
        allowed |= {k.worker(w) for w in self.heartbeats}
        if self.heartbeats:  # each worker's broadcast cursor, set by its first heartbeat
            allowed.add(k.broadcast_cursors)
        allowed |= {k.job(j.id) for j in self.jobs.values() if j.place != DELETED}
        allowed |= {k.done(j.id) for j in self.jobs.values() if j.done}
        stats: Counter[str] = Counter()
        for key in self.r.keys("*"):
            if key.startswith(k.stats_prefix) and key[len(k.stats_prefix) :].isdigit():
                stats.update({f: int(v) for f, v in self.r.hgetall(key).items()})
            else:
                assert key in allowed, f"unexpected key {key}"
        assert stats == self.stats, f"stats {dict(stats)}, model {dict(self.stats)}"
        assert set(self.r.zrange(k.workers, 0, -1)) == self.heartbeats
        assert set(self.r.zrange(k.broadcast_cursors, 0, -1)) <= self.heartbeats
        assert set(self.r.zrange(k.schedulers, 0, -1)) == self.schedulers

    def names(self, ids) -> list[str]:
        return [f"#{self.jobs[i].n}" if i in self.jobs else i for i in ids]

    def abstract_state(self) -> tuple:
        return (
            tuple(
                (
                    j.queue,
                    j.priority,
                    j.place,
                    j.final,
                    j.attempts,
                    j.lost,
                    j.expired,
                    j.owner,
                    j.indexed,
                    j.cancelled,
                    j.waiters,
                    j.errors,
                )
                for j in self.jobs.values()
            ),
            tuple(sorted(self.paused)),
            tuple(tuple(sorted(self.held[w].values())) for w in WORKERS),
        )


# About 13,000 steps in 40 s on two cores; REDISQUEUE_MODEL_EXAMPLES=3000 for a long
# local run.
EXAMPLES = int(os.environ.get("REDISQUEUE_MODEL_EXAMPLES", "300"))


@pytest.mark.parametrize(
    ("pipelined", "examples"),
    [(False, EXAMPLES), (True, max(EXAMPLES // 3, 1))],
    ids=["one-call", "pipelined"],
)
def test_the_protocol_follows_its_model(r, redis_server, backend, report, pipelined, examples):
    """``pipelined``: every script call goes the way REPLICA_ACKS sends it, in a
    pipeline (``Broker._run_many``: its own NOSCRIPT handling), without the WAIT, which
    tests/test_replication.py proves against a real replica."""
    client = FaultyRedis.from_url(redis_server.url)
    broker = Broker(client, backend.keys, lease=LEASE, result_ttl=RESULT_TTL)
    if pipelined:
        broker._run = lambda script, *args, acked=False: broker._run_many([(script, args)])[0]
    ids = Ids()
    env = {"r": r, "backend": backend, "client": client, "broker": broker, "ids": ids}
    RUN.clear()
    STATES.clear()
    started = time.monotonic()
    try:
        with mock.patch("django_redisqueue.backend.new_job_id", ids.new_job_id):
            run_state_machine_as_test(
                lambda: ProtocolMachine(env),
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=50,
                    deadline=None,
                    database=None,
                    derandomize=False,
                    suppress_health_check=list(HealthCheck),
                ),
            )
    finally:
        r.config_set("maxmemory", 0)
        client.close()
    steps = RUN["checks"] - RUN["examples"]
    extra = ", ".join(
        f"{RUN[name]} {name}"
        for name in (
            "claims",
            "promoted",
            "recovered",
            "failed by lost leases",
            "sleeps",
            "refused when out of memory",
        )
    )
    report(
        f"protocol model{' (pipelined)' if pipelined else ''}: {steps} steps in "
        f"{RUN['examples']} sequences, "
        f"{len(STATES)} distinct states, {time.monotonic() - started:.1f} s ({extra})"
    )
