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
stray key, and no key left without a TTL but the few the schema keeps for good.

The fan-out is modelled too. Chains and ``depends_on`` (through the task API and
``Broker.enqueue_linked``, on a job in any state, or on one that does not exist) make
waiting jobs: READY, in no queue and no delayed set, until the job they wait for ends
(released at the back of their queue, or into their delayed set, when it succeeded;
FAILED with one ``DependencyFailed`` naming it when it did not, down the chain).
Groups of 0 to 5 members (some waiting for other jobs), with or without a callback,
go in batches of two jobs per call (``ENQUEUE_BATCH_JOBS`` is patched), so that
sealing happens in a later call than the first members; the model counts each
member's end once (an operator's retry does not count again), completes the group
when the last sealed member ends, and releases its callback then (or cancels it, for
a cancelled group); cancel_group runs in slices. Broadcasts go to the workers whose
cursor exists (heartbeats register it, receive moves it, unregister drops it, and a
tick, a broadcast or a receive drops the cursors of workers silent for a lease):
each worker receives each message at most once, exactly those sent after it
registered for the queues it serves, and the unread set keeps every message a live
cursor has not passed. A worker's receive loop reads on while a reply says unread
messages remain, also when the messages read were all for other queues (a read of 1
or 2 behind several messages for another queue): once it ends, nothing for its queues
is left unread.

Unique jobs and limits are modelled in tests/protocol_model_limits.py (its docstring
says how): enqueues under unique keys, held until the end or for a window, answered
with the holder's id, and taken again by an operator's retry (also within the window
of the job's own earlier end); jobs of two limit keys whose jobs carry limits of every
kind and two periods (concurrency only, rate only, both; an hour and two hours), so
that a key's jobs differ as after a deploy, whatever state the others are in
(running, parked, recovered, given back); parked by the claims over their own limits
counted against every job of the key (a place of their own) and unparked by a freed
slot or the tick's look. After every step the unique keys, the slots (every RUNNING
job of the key), the starts the key keeps and its window of rates, the parked sets
and the looks agree with the model, no job started beside more jobs of its key than
its max_running, and no parked job is left without a look or a slot holder to bring
it back.

How the test controls time
--------------------------
The scripts read Redis's clock (TIME), which a test cannot move. So:

- Leases never run out by themselves: the broker under test has a one-hour lease.
  A lease runs out only when the ``lease_runs_out`` step moves that job's deadline
  into the past in the running zset (ZADD score 0), which simulates time passing for
  that job alone. The model knows per job whether its lease has passed. A worker
  falls silent for a lease the same way: ``worker_goes_away`` moves its last
  heartbeat in ``{P}:workers`` to 0.
- Due times: a job due an hour ahead is due only when the ``becomes_due`` step moves
  its score in ``{P}:delayed:<queue>`` to 0 (same trick). Jobs due in the past, now
  (RETRY in 0 ms) or SOON (20 ms) ahead are left to real time: the model learns each
  due time from the delayed zset (checking it lies in the window of Redis clock
  readings around the call that set it), and between two steps the test sleeps until
  Redis's clock has passed every SOON due time, of delayed and of waiting jobs
  (``let_time_pass``; the only real sleep, 20 ms at most, in the few steps that set
  such a due time). It also waits for the clock to reach the next ms, so no two steps
  share one.
- So no step depends on how fast the previous ones ran: a job SOON due is due from
  the next step on; finish times and lease deadlines of different steps differ. Where
  a script's own clock reading still decides (a due time falling between the Redis
  clock readings taken just before and just after an enqueue, a tick or a release:
  an enqueue slower than 20 ms), the model accepts exactly the outcomes some instant
  of that window would give, and follows the one Redis took.

Job ids are made deterministic (``preparation.new_job_id`` is replaced during the test by
a counter hashed into an id), so that a failing sequence replays with the same ids,
and so the same ties between equal scores.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple
from unittest import mock

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    rule,
)

from django_redisqueue import Job as WorkflowJob
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.exceptions import NotCancellable
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.queries import Queries
from django_redisqueue.store.wire import (
    AFTER_GROUP,
    RELEASE,
    RETRY,
    MissingJob,
    NewJob,
    Outcome,
    Received,
)
from tests import tasks
from tests.model.harness import (
    FAR,
    INJECTED,
    RESULT_TTL,
    RUN,
    STATES,
    FaultyRedis,
    ModelMachine,
    model_env,
    run_model,
    snapshot,
)
from tests.protocol_model_limits import (
    DELAYED,
    DELETED,
    FINISHED,
    LIMITS,
    PARKED,
    QUEUED,
    RUNNING,
    UNIQUE_KEYS,
    WAITING,
    LimitsModel,
    options_json,
)

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
SOON = 20  # ms: a due time that real time reaches (between two steps)
DELAYS = {"now": None, "past": -1000, "soon": SOON, "an hour": FAR}
RETRY_IN = (0, SOON, FAR)
LEASE = 3600.0  # s: leases pass only when a step says so
LOST_LIMIT = 2
# Jobs per enqueue call (ENQUEUE_BATCH_JOBS, patched): a group of three members and a
# callback takes two calls, the second sealing it.
BATCH = 2
UNKNOWN_ID = "0" * 26  # an id no job has

ERROR = '{"exception_class_path":"builtins.ValueError","traceback":"boom"}'
LOST_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.LeaseLost","traceback":""}'
CANCEL_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.JobCancelled"}'
# The error classes a job's errors can name.
VALUE_ERROR = "builtins.ValueError"
LEASE_LOST = "django_redisqueue.exceptions.LeaseLost"
CANCELLED = "django_redisqueue.exceptions.JobCancelled"
DEPENDENCY = "django_redisqueue.exceptions.DependencyFailed"

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
# What a linked job waits for: nothing, the job before it in the call, a job of the
# model (any state, deleted ones too), or a job that never existed.
LINK = st.sampled_from(["prev", "prev", "prev", "prev", "none", "job", "job", "unknown"])
MEMBER_LINK = st.sampled_from(["none", "none", "none", "none", "none", "job", "prev", "unknown"])
# Not SOON: let_time_pass would sleep for each such waiting job (plain enqueues and
# retries cover the due times real time reaches).
LINKED_DELAY = st.sampled_from(["now", "now", "past", "an hour"])
LINKED = st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY, LINK, PICK)
MEMBER = st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY, MEMBER_LINK, PICK)
BROADCAST_QUEUE = st.sampled_from(["", "", *QUEUES])


class Err(NamedTuple):
    """An error in a job's list: its class, and for a DependencyFailed the job it ran
    after and the job whose end started the failure down the chain."""

    kind: str
    parent: str = ""
    root: str = ""


class Pending(NamedTuple):
    """A waiting job to fail (common.lua's worklist ``pending``)."""

    job_id: str
    error: Err
    cancelled: bool = False
    root: str | None = None


class Spec(NamedTuple):
    """A job for enqueue_linked: its id, queue, priority, due time (ms, 0: now) and
    what it runs after ('' , a job id, or AFTER_GROUP); its limit key, if any."""

    job_id: str
    queue: str
    priority: int
    due: int
    after: str
    limit: str = ""


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
    errors: list[Err] = field(default_factory=list)
    result: str | None = None
    cancelled: bool = False
    indexed: bool = False  # in its queue's failed index
    finished_at: int | None = None
    finish_window: tuple[int, int] = (0, 0)
    waiters: bool = False
    done: list[str] = field(default_factory=list)
    # The fan-out fields of its hash.
    group: str | None = None  # a member: its group's id
    counted: str = ""  # the status its end was counted with in its group
    after: str | None = None  # the job it runs after, or group:<gid> for a callback
    run_after: int | None = None  # ``due``: a job stored waiting keeps its due time
    then: list[str] = field(default_factory=list)  # the jobs waiting for it
    # Unique jobs and limits (protocol_model_limits.py): its unique key, the window of
    # its ``unique_until`` (PASSED once the window ended), and its limit key.
    unique: str | None = None
    unique_until: tuple[int, int] | None = None
    limit: str | None = None  # the name of its limits in LIMITS
    claim_order: int = 0  # when RUNNING: the order of its claim among every claim

    def __repr__(self) -> str:
        return f"<job #{self.n} {self.id[:8]} {self.queue}/{self.priority} {self.place}>"

    @property
    def status(self) -> str:
        return {RUNNING: "RUNNING", FINISHED: self.final}.get(self.place, "READY")

    @property
    def expired(self) -> bool:
        return self.place == RUNNING and self.deadline == 0


@dataclass
class Group:
    """What the model says a group's hash and lists hold."""

    id: str
    n: int
    created: tuple[int, int]  # the window of the call that made it
    members: list[str] = field(default_factory=list)
    callback: str | None = None
    total: int | None = None  # set by the sealing call
    ended: int = 0
    failed: int = 0
    finished: tuple[int, int] | None = None  # the window of the call that completed it
    cancelled: bool = False
    indexed: bool = True  # in the groups index
    aged: bool = False  # created over a result TTL ago (its index score moved to 0)
    gone: bool = False  # its record expired (a result TTL after it ended)


@dataclass
class Message:
    """A broadcast message: its queue ('' for all), when it was sent, and per worker
    how its run stands (status, and the window the script wrote it in)."""

    n: int
    queue: str
    sent: tuple[int, int]
    ran: dict[str, tuple[str, int, int]] = field(default_factory=dict)


def run_after(due_ms: int) -> tuple[datetime, int]:
    """A run_after for a due time, and the due time (ms) the backend derives from it."""
    when = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
    return when, int(when.timestamp() * 1000)


def in_window(value: str | float | None, window: tuple[int, int]) -> bool:
    """A time Redis stored (a field, or a score) lies in the window of its call."""
    return value is not None and window[0] <= int(float(value)) <= window[1]


class ProtocolMachine(LimitsModel, ModelMachine):
    def __init__(self, env: dict) -> None:
        super().__init__(env)
        self.broker: Broker
        self.queries: Queries = env["queries"]
        self.jobs: dict[str, Job] = {}
        self.groups: dict[str, Group] = {}
        self.seq = 0
        self.paused: set[str] = set()
        self.held: dict[str, dict[str, str]] = {w: {} for w in WORKERS}
        self.issued: list[tuple[str, str]] = []  # every (job id, owner token) handed out
        self.stats: Counter[str] = Counter()
        self.heartbeats: set[str] = set()  # the members of {P}:workers
        self.silent: set[str] = set()  # among them, those last seen a lease ago
        self.records: set[str] = set()  # the workers whose {P}:worker:<id> exists
        self.schedulers: set[str] = set()
        # Broadcast: the last number, the messages, the unread set, the cursors, the
        # wake-up lists; per worker what it took (ever) and what it has yet to report.
        self.last_message = 0
        self.messages: dict[int, Message] = {}
        self.unread: set[int] = set()
        self.cursors: dict[str, int] = {}
        self.message_wakes: set[str] = set()
        self.received: dict[str, set[int]] = {w: set() for w in WORKERS}
        self.to_report: dict[str, list[int]] = {w: [] for w in WORKERS}
        self.lease_ms = self.broker.lease_ms
        self.last_clock = 0
        self.last_claim = 0  # Redis's clock after the last claim
        self.init_limits()
        assert self.backend.config.result_ttl == RESULT_TTL
        self.started = self.clock()

    def count(self, name: str) -> None:
        RUN[name] += 1

    def take_snapshot(self) -> dict[str, object]:
        return snapshot(self.r)

    # Redis's clock, read around each call: the window in which its script ran.

    def clock(self) -> int:
        now = super().clock()
        self.last_clock = max(self.last_clock, now)
        return now

    def let_time_pass(self) -> None:
        """Between two steps, Redis's clock moves past every due time set SOON ahead
        (of a delayed job, or of a waiting one, to be released later), and past the
        last ms a step has seen, so that no two steps share a ms: then no step's result
        depends on how fast the previous ones ran (due or not yet, ties between finish
        times or lease deadlines), and a failing sequence replays."""
        near = self.started + FAR // 2
        dues = [j.due for j in self.job_list(DELAYED)]
        dues += [j.run_after for j in self.job_list(WAITING)]
        target = max([self.last_clock, *(due for due in dues if due and due < near)])
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

    def place(self, job: Job, due: int, window: tuple[int, int]) -> None:
        """Queue a job due at ``due`` (0: now), or delay it, as a script whose clock
        read some instant of ``window`` did: inside the window, as Redis did."""
        t0, t1 = window
        delayed = due > t1
        if t0 < due <= t1:
            delayed = self.r.zscore(self.keys.delayed(job.queue), job.id) is not None
        if delayed:
            self.push_delayed(job, due, (due, due))
        else:
            self.push_ready(job)

    def leave_running(self, job: Job) -> None:
        job.owner, job.deadline = None, None

    def forget_attempt(self, job: Job) -> None:
        job.attempts = max(job.attempts - 1, 0)
        if job.workers:
            job.workers.pop()

    def end(
        self,
        job: Job,
        status: str,
        window: tuple[int, int],
        error: Err | None,
        result: str = "",
    ) -> None:
        """record_outcome: the job's end, then every waiting job it fails in turn."""
        pending: list[Pending] = []
        self.store_outcome(job, status, window, error, pending, result)
        self.fail_pending(pending, window)

    def store_outcome(
        self,
        job: Job,
        status: str,
        window: tuple[int, int],
        error: Err | None,
        pending: list[Pending],
        result: str = "",
        root: str | None = None,
    ) -> None:
        never_ran = job.place == WAITING
        job.place, job.final = FINISHED, status
        self.m_release_unique(job)
        job.finished_at, job.finish_window = None, window
        if status == FAILED and not job.cancelled and not never_ran:
            job.indexed = True
        if error is not None:
            job.errors.append(error)
        if result:
            job.result = result
        self.stats[("failed:" if status == FAILED else "ok:") + job.queue] += 1
        if job.waiters:
            job.done.append(status)
        if job.group is not None:
            self.count_in_group(job, status, window, pending)
        then, job.then = job.then, []  # the list and the field go
        for next_id in then:
            if status == SUCCESSFUL:
                self.release(self.jobs[next_id], window)
            else:
                origin = root or job.id
                pending.append(Pending(next_id, Err(DEPENDENCY, job.id, origin), root=origin))

    def fail_pending(self, pending: list[Pending], window: tuple[int, int]) -> None:
        """Last in, first out, as the script's worklist (the order decides the FIFO
        places of the callbacks the failures release)."""
        while pending:
            item = pending.pop()
            job = self.jobs[item.job_id]
            if job.place == WAITING:
                job.cancelled = job.cancelled or item.cancelled
                self.store_outcome(job, FAILED, window, item.error, pending, root=item.root)
                RUN["failed waiting jobs"] += 1

    def release(self, job: Job, window: tuple[int, int]) -> None:
        """A waiting job goes to its queue, or its delayed set while its run_after is
        ahead; any other job stays as it is."""
        if job.place != WAITING:
            return
        self.place(job, job.run_after or 0, window)
        RUN["released"] += 1

    def count_in_group(
        self, job: Job, status: str, window: tuple[int, int], pending: list[Pending]
    ) -> None:
        """Once per member, whatever happens to it later."""
        if job.counted:
            return
        job.counted = status
        group = self.groups[job.group or ""]
        group.ended += 1
        group.failed += status == FAILED
        self.complete_group(group, window, pending)

    def complete_group(
        self, group: Group, window: tuple[int, int], pending: list[Pending]
    ) -> None:
        if group.total is None or group.ended < group.total or group.finished:
            return
        group.finished = window
        RUN["groups completed"] += 1
        if group.callback is None:
            return
        if group.cancelled:
            pending.append(Pending(group.callback, Err(CANCELLED), cancelled=True))
        else:
            self.release(self.jobs[group.callback], window)

    def m_cancel(self, job: Job | None, error: Err, window: tuple[int, int]) -> bool:
        """cancel_job: a READY job (queued, delayed, waiting or parked) ends FAILED,
        cancelled."""
        if job is None or job.place not in (QUEUED, DELAYED, WAITING, PARKED):
            return False
        job.cancelled = True
        self.end(job, FAILED, window, error)
        return True

    def m_finish(self, outcome: Outcome | None, window: tuple[int, int]) -> bool | None:
        if outcome is None:
            return None
        job = self.jobs.get(outcome.job_id)
        if job is None or job.place != RUNNING or job.owner != outcome.owner:
            return False
        self.leave_running(job)
        self.m_free_slot(job)
        t0, t1 = window
        if outcome.status == RETRY:
            job.errors.append(Err(VALUE_ERROR))
            self.push_delayed(job, None, (t0 + outcome.retry_in_ms, t1 + outcome.retry_in_ms))
        elif outcome.status == RELEASE:
            self.forget_attempt(job)
            self.requeue(job)
        else:
            error = Err(VALUE_ERROR) if outcome.error else None
            self.end(job, outcome.status, window, error, outcome.result)
        return True

    def m_claim(self, queues, worker: str, window: tuple[int, int]) -> Job | None:
        """The first job of the first unpaused queue; one over its limit is parked, and
        the next one is taken."""
        for queue in queues:
            while queue not in self.paused:
                ready = self.queue_order(queue)
                if not ready:
                    break
                job = ready[0]
                if job.limit and not self.m_limit_room(job.limit):
                    self.m_park(job)
                    continue
                self.claims += 1
                job.claim_order = self.claims
                if job.limit:
                    self.m_take_limit(job, window)
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
            self.m_free_slot(job)
            self.forget_attempt(job)
            self.requeue(job)
        return mine

    def m_enqueue_linked(self, specs: list[Spec], gid: str, window: tuple[int, int]) -> None:
        """enqueue_linked.lua, one call per BATCH jobs (the last sealing the group), for
        jobs that wait for nothing missing (see ``missing``)."""
        batches = [specs[i : i + BATCH] for i in range(0, len(specs), BATCH)] or [[]]
        for i, batch in enumerate(batches):
            self.m_linked_call(batch, gid, i == len(batches) - 1, window)

    def m_linked_call(
        self, batch: list[Spec], gid: str, seal: bool, window: tuple[int, int]
    ) -> None:
        pending: list[Pending] = []
        group = None
        if gid:
            group = self.groups.get(gid)
            if group is None:
                group = self.groups[gid] = Group(gid, len(self.groups), window)
                self.m_trim_groups()
        for spec in batch:
            job = Job(spec.job_id, len(self.jobs), spec.queue, spec.priority)
            job.limit = spec.limit or None
            if job.limit:
                self.m_rate_window(job.limit)
            self.jobs[job.id] = job
            before = ""  # what the job it runs after is: 'waits' (not ended), or its end
            if spec.after == AFTER_GROUP:
                assert group is not None
                before, group.callback = "waits", job.id
            elif spec.after:
                parent = self.jobs[spec.after]
                before = parent.final if parent.place == FINISHED else "waits"
                if before == "waits":
                    parent.then.append(job.id)
            if before in ("waits", FAILED):
                job.place, job.run_after = WAITING, spec.due
                job.after = f"group:{gid}" if spec.after == AFTER_GROUP else spec.after
                if before == FAILED:
                    # Its own dependents fail naming the failed job as the origin.
                    error = Err(DEPENDENCY, spec.after, spec.after)
                    pending.append(Pending(job.id, error, root=spec.after))
            else:
                self.place(job, spec.due, window)
                job.after = spec.after or None
            if group is not None and spec.after != AFTER_GROUP:
                job.group = gid
                group.members.append(job.id)
        if group is not None and seal:
            group.total = len(group.members)
            self.complete_group(group, window, pending)
        self.fail_pending(pending, window)

    def m_cancel_group(
        self, gid: str, slice_size: int, window: tuple[int, int], calls: int = 0
    ) -> int:
        """cancel_group.lua, slice by slice (``calls``: only that many calls ran)."""
        group = self.groups.get(gid)
        if group is None or group.gone:
            return 0
        cancelled, start, made = 0, 0, 0
        while start >= 0 and not (calls and made == calls):
            made += 1
            error = Err(CANCELLED)
            if start == 0:
                group.cancelled = True
                if group.callback is not None:
                    cancelled += self.m_cancel(self.jobs[group.callback], error, window)
            ids = group.members[start : start + slice_size]
            for job_id in ids:
                cancelled += self.m_cancel(self.jobs[job_id], error, window)
            start = start + slice_size if len(ids) == slice_size else -1
        return cancelled

    def m_trim_groups(self) -> None:
        """trim_groups: of the groups created over a result TTL ago (their index score
        is 0: ordered by id), the first 100 are looked at, and those whose record is
        gone leave the index."""
        old = sorted((g for g in self.groups.values() if g.indexed and g.aged), key=lambda g: g.id)
        for group in old[:100]:
            if group.gone:
                group.indexed = False
                RUN["groups trimmed from the index"] += 1

    def m_trim_broadcasts(self) -> None:
        """Drop the cursors of workers silent for a lease (or gone from the workers),
        then the messages every remaining cursor has passed."""
        for worker in list(self.cursors):
            if worker not in self.heartbeats or worker in self.silent:
                del self.cursors[worker]
        lowest = min(self.cursors.values(), default=None)
        self.unread = set() if lowest is None else {n for n in self.unread if n > lowest}

    def m_broadcast(self, queue: str, window: tuple[int, int]) -> int:
        self.last_message += 1
        number = self.last_message
        self.messages[number] = Message(number, queue, window)
        self.unread.add(number)
        self.m_trim_broadcasts()
        self.message_wakes |= set(self.cursors)
        return number

    def m_receive(
        self,
        worker: str,
        queues,
        ran: list[tuple[int, str]],
        most: int,
        window: tuple[int, int],
    ) -> tuple[list[int], bool]:
        """receive.lua: the messages taken, and whether unread ones remain past the
        ``most`` read (for this worker's queues or not)."""
        for number, status in ran:
            if number in self.messages:
                self.messages[number].ran[worker] = (status, *window)
        cursor = self.cursors.get(worker)
        if cursor is None:  # not registered: from now on, as a new worker
            self.cursors[worker] = self.last_message
            return [], False
        taken, last = [], cursor
        for number in sorted(n for n in self.unread if n > cursor)[:most]:
            last = number
            message = self.messages[number]
            if message.queue in ("", *queues):
                message.ran[worker] = ("RUNNING", *window)
                taken.append(number)
        if last > cursor:
            self.cursors[worker] = last
            self.m_trim_broadcasts()
        assert not self.received[worker] & set(taken), f"{worker} takes {taken} again"
        self.received[worker] |= set(taken)
        return taken, any(n > last for n in self.unread)

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
        self.settle_starts()

    # Operations: each calls the broker, then moves the model and compares the reply.
    # If the call raises, the model is left as it was. ``lost``: the call runs but its
    # reply is lost (the model moves, the reply is not compared).

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
        self.place(job, due, (t0, t1))

    def link(self, kind: str, pick: int, previous: str) -> str:
        """The job a linked job runs after: see LINK."""
        if kind == "prev":
            return previous
        if kind == "job":
            return self.pick(self.jobs, pick) or ""
        return UNKNOWN_ID if kind == "unknown" else ""

    def op_linked(
        self, steps, gid: str = "", callback=None, lost: bool = False, limits=()
    ) -> None:
        """Jobs (queue, priority, delay, link, pick) through Broker.enqueue_linked, in
        one call per BATCH jobs: with ``gid``, a group of them (and ``callback``, a
        (queue, priority, delay), its callback); ``limits``: the steps' limit keys."""
        prepared = [self.backend.prepare(tasks.noop, (), {}) for _ in range(len(steps) + 1)]
        t0 = self.clock()
        specs, previous = [], ""
        limits = [*limits, *[""] * len(steps)]
        for result, (queue, priority, delay, link, pick), limit in zip(
            prepared, steps, limits, strict=False
        ):
            due = 0 if DELAYS[delay] is None else t0 + DELAYS[delay]
            after = self.link(link, pick, previous)
            specs.append(Spec(result.id, queue, priority, due, after, limit))
            previous = result.id
        if callback is not None:
            queue, priority, delay = callback
            due = 0 if DELAYS[delay] is None else t0 + DELAYS[delay]
            specs.append(Spec(prepared[-1].id, queue, priority, due, AFTER_GROUP))
        jobs = [
            NewJob(
                s.job_id,
                s.queue,
                s.priority,
                self.payload,
                s.due,
                s.after,
                options_json(None, s.limit or None),
            )
            for s in specs
        ]
        missing = self.missing(specs)
        before = snapshot(self.r) if missing else None
        named: str | None = None
        try:
            enqueued = self.broker.enqueue_linked(jobs, group_id=gid)
        except MissingJob as exc:
            named, enqueued = exc.job_id, []
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
            enqueued = []
        t1 = self.clock()
        if missing:  # refused whole: one call or several, nothing is stored
            assert lost or named in missing, f"MissingJob({named}), model: one of {missing}"
            assert snapshot(self.r) == before, "a refused linked enqueue stored something"
            RUN["refused linked enqueues"] += 1
            return
        assert named is None, f"MissingJob({named}) for jobs that all exist"
        self.m_enqueue_linked(specs, gid, (t0, t1))
        if not lost:
            assert len(enqueued) == len(specs)
            assert all(at is not None and t0 <= at <= t1 for at in enqueued), enqueued

    def missing(self, specs: list[Spec]) -> set[str]:
        """The jobs these wait for that neither exist nor come earlier among them:
        MissingJob names one, and nothing at all is stored, as Broker.enqueue_linked
        promises (however many calls the jobs take)."""
        stored = {j.id for j in self.jobs.values() if j.place != DELETED}
        missing = set()
        for i, spec in enumerate(specs):
            earlier = {s.job_id for s in specs[:i]}
            if spec.after not in ("", AFTER_GROUP) and spec.after not in earlier | stored:
                missing.add(spec.after)
        return missing

    def op_chain_api(self, steps, parent: str) -> None:
        """A chain through the task API: ``a.then(b, ...)`` (one step: ``enqueue()``),
        the first step ``depends_on`` ``parent`` (if any)."""
        t0 = self.clock()
        dues, jobs = [], []
        for queue, priority, delay, *_ in steps:
            when, due = (None, 0) if DELAYS[delay] is None else run_after(t0 + DELAYS[delay])
            task = tasks.noop.using(queue_name=queue, priority=priority, run_after=when)
            if parent and not jobs:
                task = task.using(depends_on=parent)
            jobs.append(WorkflowJob(task))
            dues.append(due)
        missing = bool(parent and self.missing([Spec("", "", 0, 0, parent)]))
        before = snapshot(self.r) if missing else None
        try:
            if len(jobs) == 1:
                results = [jobs[0].task.enqueue()]
            else:
                results = jobs[0].then(*jobs[1:]).enqueue()
        except TaskResultDoesNotExist:
            assert missing, "TaskResultDoesNotExist for a job that exists"
            assert snapshot(self.r) == before, "a refused chain stored something"
            RUN["refused linked enqueues"] += 1
            return
        t1 = self.clock()
        assert not missing, f"a chain after {parent}, which does not exist, was queued"
        specs, previous = [], parent
        for result, (queue, priority, *_), due in zip(results, steps, dues, strict=True):
            specs.append(Spec(result.id, queue, priority, due, previous))
            previous = result.id
        self.m_enqueue_linked(specs, "", (t0, t1))
        for result in results:
            assert result.enqueued_at is not None

    def op_group_api(self, members, callback) -> None:
        """A group through the task API: ``group(jobs, callback=...).enqueue()``."""
        t0 = self.clock()
        jobs, specs_in = [], []
        for queue, priority, delay, *_ in [*members, *([callback] if callback else [])]:
            when, due = (None, 0) if DELAYS[delay] is None else run_after(t0 + DELAYS[delay])
            jobs.append(
                WorkflowJob(tasks.noop.using(queue_name=queue, priority=priority, run_after=when))
            )
            specs_in.append((queue, priority, due))
        callback_job = jobs.pop() if callback else None
        result = self.backend.enqueue_group(jobs, callback_job)
        t1 = self.clock()
        ids = [*result.member_ids, *([result.callback_id] if callback else [])]
        afters = [""] * len(members) + [AFTER_GROUP] * bool(callback)
        specs = [
            Spec(job_id, queue, priority, due, after)
            for job_id, (queue, priority, due), after in zip(ids, specs_in, afters, strict=True)
        ]
        self.m_enqueue_linked(specs, result.id, (t0, t1))

    def op_cancel_group(self, gid: str, via_api: bool, slice_size: int, lost=False) -> None:
        t0 = self.clock()
        cancelled: int | None = None
        try:
            if via_api:
                cancelled = self.backend.cancel_group(gid)
                slice_size = 1000
            else:
                cancelled = self.broker.cancel_group(gid, CANCEL_ERROR, slice_size=slice_size)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected = self.m_cancel_group(gid, slice_size, (t0, t1), calls=1 if lost else 0)
        if not lost:
            assert cancelled == expected, f"cancel_group: {cancelled}, model {expected}"

    def op_broadcast(self, queue: str, via_api: bool, lost: bool = False) -> None:
        t0 = self.clock()
        number: int | None = None
        try:
            if via_api:
                number = self.backend.send_broadcast(WorkflowJob(tasks.noop), queue)
            else:
                number = self.broker.broadcast(self.payload, queue)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected = self.m_broadcast(queue, (t0, t1))
        if not lost:
            assert number == expected, f"broadcast number {number}, model {expected}"

    def op_receive(
        self, worker: str, queues, report: str, most: int, lost: bool = False
    ) -> tuple[list[int], bool]:
        """The worker reports how the messages it took ran (``report``: all SUCCESSFUL,
        all FAILED, alternately, or not yet), then takes the next ones: their numbers
        (none when the reply is lost), and whether unread messages remain."""
        statuses = {SUCCESSFUL: [SUCCESSFUL], FAILED: [FAILED], "mixed": [SUCCESSFUL, FAILED]}
        ran = []
        if report in statuses:
            cycle = statuses[report]
            ran = [(n, cycle[i % len(cycle)]) for i, n in enumerate(self.to_report[worker])]
        t0 = self.clock()
        received: Received | None = None
        try:
            received = self.broker.receive(worker, queues, ran, most=most)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected, more = self.m_receive(worker, queues, ran, most, (t0, t1))
        if ran:
            self.to_report[worker] = []
        if lost:
            return [], False  # the worker never learns what it took: it does not run them
        assert received is not None
        got = [n for n, _ in received.messages]
        assert got == expected, f"{worker} received {got} from {queues}, model {expected}"
        assert received.more == more, f"{worker}: more {received.more}, model {more}"
        assert all(payload == self.payload for _, payload in received.messages)
        self.to_report[worker] += got
        RUN["messages received"] += len(got)
        RUN["receives past other queues' messages"] += bool(more and not got)
        return got, more

    def op_receive_loop(
        self, worker: str, order, report: str, most: int, memory_fills: bool
    ) -> None:
        """A worker's broadcast loop (Worker._receive_broadcasts): it takes the messages
        it has not read, runs them, and reports how they ended in its next call, until
        a call takes nothing and says none remain (``report`` 'not yet': it stops after
        one call). ``memory_fills``: Redis is out of memory from the second call on
        (each call is refused whole, or runs whole)."""
        taken, more = self.op_receive(worker, order, report, most)
        if report == "not yet":
            return
        while taken or more:
            call = partial(self.op_receive, worker, order, report, most)
            if memory_fills:
                reply = self.out_of_memory(call, snapshot(self.r))
                if reply is None:  # refused: the worker backs off and tries later
                    return
                taken, more = reply
            else:
                taken, more = call()
        # Its loop is over: nothing sent for its queues since it registered is left.
        cursor = self.cursors.get(worker)
        if cursor is not None:
            missed = [
                n for n in self.unread if n > cursor and self.messages[n].queue in ("", *order)
            ]
            assert not missed, f"{worker} stopped receiving before messages {missed}"

    def op_unregister(self, worker: str) -> None:
        self.broker.unregister_worker(worker)
        self.heartbeats.discard(worker)
        self.silent.discard(worker)
        self.records.discard(worker)
        self.message_wakes.discard(worker)
        self.cursors.pop(worker, None)
        self.to_report[worker] = []

    def op_claim(self, worker: str, order, outcome: Outcome | None, woken_by: str = "") -> None:
        """``woken_by``: the worker took that queue's wake-up token (BLPOP) first."""
        if woken_by:
            self.r.lpop(self.keys.wake(woken_by))
        # A ms of its own: starts of one key are then ordered as they were claimed.
        while self.clock() <= self.last_claim:
            time.sleep(0.0002)
        t0 = self.clock()
        stored, claimed = self.broker.claim(order, worker, outcome, woken_by=woken_by)
        t1 = self.last_claim = self.clock()
        expected_stored = self.m_finish(outcome, (t0, t1))
        job = self.m_claim(order, worker, (t0, t1))
        if woken_by in QUEUES and woken_by not in self.paused:
            waiting = any(j.queue == woken_by for j in self.job_list(QUEUED))
            tokens = self.r.llen(self.keys.wake(woken_by))
            assert tokens == int(waiting), f"wake:{woken_by}: {tokens} token(s) after a pass-on"
        if outcome is not None:
            self.drop_held(worker, outcome)
        assert stored is expected_stored, f"stored {stored}, model {expected_stored}"
        assert self.broker.last_broadcast == self.last_message, "the claim's broadcast number"
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
        assert fields.get("after") == job.after
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
        # Seen now; the workers last seen an hour (a lease) ago leave {P}:workers.
        self.heartbeats = (self.heartbeats - self.silent) | {worker}
        self.silent.clear()
        self.records.add(worker)
        self.cursors.setdefault(worker, self.last_message)

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
        # The next due time is read before the recovery, whose failures may release
        # jobs into a delayed set (each wakes the scheduler if it is the first due).
        later = [j.due for j in self.job_list(DELAYED) if j.queue in queues]
        recovered = failed = 0
        for job in expired:
            self.leave_running(job)
            self.m_free_slot(job)
            job.lost += 1
            if job.lost > LOST_LIMIT:
                self.end(job, FAILED, (t0, t1), Err(LEASE_LOST))
                failed += 1
            else:
                self.requeue(job)
                recovered += 1
        # Then the limits whose look is due; the next look counts for the next step.
        full = self.m_tick_looks(batch) or full
        later += [score for _, score in self.r.zrange(self.keys.limits, 0, 0, withscores=True)]
        self.m_trim_groups()
        # More cursors than live workers: a dead worker's cursor to drop.
        if recover and len(self.cursors) > len(self.heartbeats - self.silent):
            self.m_trim_broadcasts()
        model = (len(promoted), recovered, failed)
        assert (tick.promoted, tick.recovered, tick.failed) == model, f"{tick}, model {model}"
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
        elif self.m_cancel(job, Err(CANCELLED), (t0, t1)):
            expected = "CANCELLED"
        else:
            expected = "not cancellable" if via_api else job.status
        assert status == expected, f"cancel of job {job.n}: {status}, model {expected}"

    def op_operate(self, action: str, queue: str, ids: list[str], limit: int) -> None:
        t0 = self.clock()
        changed = self.broker.operate(action, queue, ids, limit)
        t1 = self.clock()
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
                        self.m_hold_unique_again(job)
                        self.push_ready(job)
                    expected += 1
                elif action == "run_now" and job.place == DELAYED:
                    self.push_ready(job)
                    expected += 1
                elif action == "empty" and job.place == QUEUED:
                    if job.group is not None or job.then or job.unique:
                        # It ends first: its group still completes, its dependents fail,
                        # its unique key is free.
                        job.cancelled = True
                        self.end(job, FAILED, (t0, t1), Err(CANCELLED))
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
        ),
        workers=st.lists(WORKER, unique=True),
    )
    def backlog(self, batch, workers):
        """A few jobs to start with, and the workers already up (their first heartbeat
        registers their broadcast cursor)."""
        for queue, priority, delay in batch:
            self.op_enqueue(queue, priority, DELAYS[delay], via_api=False)
        for worker in workers:
            self.op_heartbeat(worker, {})

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
        job = self.pick(self.job_list(QUEUED, DELAYED, WAITING, PARKED, RUNNING, FINISHED), pick)
        if job is None:
            return
        before = snapshot(self.r)
        payload = self.backend.prepare(tasks.noop, (), {})._payload
        assert self.broker.enqueue([NewJob(job.id, "low", 5, payload)]) == [None]
        assert snapshot(self.r) == before

    # Rules: fan-out producers.

    @rule(
        steps=st.lists(LINKED, min_size=2, max_size=4),
        first=st.sampled_from(["none", "none", "job", "job", "unknown"]),
        pick=PICK,
        via_api=st.booleans(),
    )
    def enqueue_a_chain(self, steps, first, pick, via_api):
        """Jobs that run one after the other, the first after nothing, after a job of
        the model, or after one that does not exist (then nothing is queued). Through
        the broker a step may wait for another job than the one before it (LINK)."""
        if via_api:
            self.op_chain_api(steps, self.link(first, pick, ""))
        else:
            self.op_linked([(*steps[0][:3], first, pick), *steps[1:]])

    @rule(
        step=LINKED,
        parent=st.sampled_from(["job", "job", "job", "job", "unknown"]),
        pick=PICK,
        via_api=st.booleans(),
    )
    def enqueue_after_a_job(self, step, parent, pick, via_api):
        """One job ``depends_on`` a job in any state (waiting, queued, delayed,
        running, ended SUCCESSFUL or FAILED, deleted) or one that never existed."""
        if via_api:
            self.op_chain_api([step], self.link(parent, pick, ""))
        else:
            self.op_linked([(*step[:3], parent, pick)])

    @rule(
        members=st.lists(MEMBER, max_size=5),
        callback=st.none() | st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY),
        via_api=st.booleans(),
    )
    def enqueue_a_group(self, members, callback, via_api):
        """A group of 0 to 5 members, with or without a callback, in calls of BATCH
        jobs. Through the broker a member may wait for another job (MEMBER_LINK)."""
        if via_api:
            self.op_group_api(members, callback)
        else:
            self.op_linked(members, gid=self.ids.new_job_id(), callback=callback)

    @rule(pick=PICK, then_cancel=st.booleans())
    def retry_a_failed_member(self, pick, then_cancel):
        """An operator retries a group member that failed (its end was counted); when
        it ends again (run, or cancelled at once), its group does not count it again."""
        job = self.pick([j for j in self.jobs.values() if j.group and j.indexed], pick)
        if job is not None:
            self.op_operate("retry_failed", job.queue, [job.id], 0)
            if then_cancel:
                self.op_cancel(job, via_api=False)

    @rule(
        picks=st.lists(PICK, min_size=1, max_size=3),
        expires=st.booleans(),
        then=st.sampled_from(["nothing", "a group", "a tick"]),
    )
    def groups_age(self, picks, expires, then):
        """A result TTL passes for groups: created that long ago (their index score
        moves to 0), and, for one that ended a result TTL ago, its record expires.
        Then a new group's enqueue, or the tick, trims the index of the groups gone,
        never of one that lives."""
        for pick in picks:
            indexed = [g for g in self.groups.values() if g.indexed]
            ended = [g for g in indexed if g.finished and not g.gone]
            group = self.pick(ended if expires and ended else indexed, pick)
            if group is None:
                break
            self.r.zadd(self.keys.groups, {group.id: 0}, xx=True)
            group.aged = True
            if expires and group.finished and not group.gone:
                k = self.keys
                self.r.delete(k.group(group.id), k.group_members(group.id), k.group_done(group.id))
                group.gone = True
        if then == "a group":
            self.op_linked([("default", 0, "now", "none", 0)], self.ids.new_job_id())
        elif then == "a tick":
            self.op_tick("s1", (), 100, False)

    @rule(pick=PICK, via_api=st.booleans(), slice_size=st.sampled_from([1, 2, 1000]))
    def cancel_a_group(self, pick, via_api, slice_size):
        """Cancel a group (or one that does not exist), in slices of members."""
        gid = self.pick([*self.groups, UNKNOWN_ID], pick)
        self.op_cancel_group(gid, via_api, slice_size)

    # Rules: broadcast.

    @rule(queues=st.lists(BROADCAST_QUEUE, min_size=1, max_size=2), via_api=st.booleans())
    def broadcast(self, queues, via_api):
        """One message or two, for every worker or for a queue's."""
        for queue in queues:
            self.op_broadcast(queue, via_api)

    @rule(
        worker=WORKER,
        order=ORDER,
        report=st.sampled_from(["not yet", SUCCESSFUL, FAILED, "mixed"]),
        most=st.sampled_from([1, 2, 100]),
        beat=st.booleans(),
        memory_fills=st.sampled_from([False, False, False, True]),
    )
    def receive(self, worker, order, report, most, beat, memory_fills):
        """A worker's broadcast loop (Worker._receive_broadcasts). ``beat``: its
        heartbeat ran just before, as a live worker's does every few seconds."""
        if beat:
            self.op_heartbeat(worker, {})
        self.op_receive_loop(worker, order, report, most, memory_fills)

    @rule(
        worker=WORKER,
        others=st.integers(1, 4),
        most=st.sampled_from([1, 2]),
        report=st.sampled_from([SUCCESSFUL, FAILED, "mixed"]),
    )
    def broadcasts_past_a_read(self, worker, others, most, report):
        """A worker of one queue is sent more messages for another queue than one
        receive reads, then one for every worker: its loop reads on past them."""
        self.op_heartbeat(worker, {})
        self.op_receive(worker, ("default",), "not yet", most)  # it has a cursor now
        for _ in range(others):
            self.op_broadcast("high", via_api=False)
        self.op_broadcast("", via_api=False)
        self.op_receive_loop(worker, ("default",), report, most, memory_fills=False)

    @rule(worker=WORKER, how=st.sampled_from(["falls silent", "unregisters"]))
    def worker_goes_away(self, worker, how):
        """A worker silent for a lease (its last heartbeat moves a lease into the
        past), or one that exits cleanly (unregister_worker)."""
        if how == "unregisters":
            self.op_unregister(worker)
        elif worker in self.heartbeats:
            self.r.zadd(self.keys.workers, {worker: 0}, xx=True)
            self.silent.add(worker)

    @rule(
        kind=st.sampled_from(["chain", "group", "cancel group", "broadcast", "receive"]),
        steps=st.lists(MEMBER, max_size=4),
        pick=PICK,
        worker=WORKER,
    )
    def fan_out_reply_lost(self, kind, steps, pick, worker):
        """The call runs but its reply is lost: what it did stands (a group its sender
        never learnt the id of, a receive whose messages the worker never runs)."""
        self.client.lose_reply = redis.exceptions.ConnectionError("Connection reset by peer")
        if kind == "chain":
            self.op_linked(steps or [("default", 0, "now", "none", pick)], lost=True)
        elif kind == "group":
            self.op_linked(steps, self.ids.new_job_id(), ("low", 0, "now"), lost=True)
        elif kind == "cancel group":
            gid = self.pick([*self.groups, UNKNOWN_ID], pick)
            self.op_cancel_group(gid, False, 1, lost=True)
        elif kind == "broadcast":
            self.op_broadcast("", via_api=False, lost=True)
        else:
            self.op_receive(worker, QUEUES, SUCCESSFUL, 2, lost=True)
        assert self.client.lose_reply is None, "no reply was lost"
        RUN["lost fan-out replies"] += 1

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
        self.out_of_memory(lambda: self.any_operation(*operation), before)

    def out_of_memory(self, operation, before: dict[str, object]):
        """Run ``operation`` while Redis is out of memory: each script it calls is
        refused whole (then nothing changed since ``before``, and this returns None)
        or runs whole (this returns what ``operation`` returned)."""
        self.r.config_set("maxmemory", 1)
        try:
            return operation()
        except redis.exceptions.ResponseError as exc:
            assert "maxmemory" in str(exc), exc
            assert snapshot(self.r) == before
            RUN["refused when out of memory"] += 1
            return None
        finally:
            self.r.config_set("maxmemory", 0)

    def any_operation(self, kind: int, worker: int, pick: int, status: int, other: int) -> None:
        """One broker call of any kind; the model moves only if it succeeds."""
        kinds = ["enqueue", "claim", "heartbeat", "tick", "abandon", "retry_failed"]
        kinds += ["finish"] if self.any_held() else []
        kinds += ["cancel", "watch"] if self.jobs else []
        kinds += ["chain", "group", "broadcast", "receive"]
        kinds += ["cancel group"] if self.groups else []
        kinds += ["unique", "limited"]
        kind_name = self.pick(kinds, kind)
        worker_id = self.pick(WORKERS, worker)
        if kind_name in ("chain", "group", "broadcast", "receive", "cancel group"):
            self.any_fan_out_operation(kind_name, worker_id, pick, other)
        elif kind_name == "enqueue":
            self.op_enqueue("default", 0, self.pick(DELAYS.values(), other), via_api=False)
        elif kind_name in ("unique", "limited"):
            unique = (
                (self.pick(UNIQUE_KEYS, other), bool(pick % 2)) if kind_name == "unique" else None
            )
            limit = self.pick(sorted(LIMITS), other)
            self.op_enqueue_options([("default", 0, "now", unique, limit)], via_api=False)
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

    def any_fan_out_operation(self, kind: str, worker: str, pick: int, other: int) -> None:
        step = ("default", 0, "now", "prev", pick)
        if kind == "chain":  # three jobs: two calls
            self.op_linked([step] * 3)
        elif kind == "group":  # three members and a callback: two calls
            self.op_linked([step] * 3, self.ids.new_job_id(), ("default", 0, "now"))
        elif kind == "broadcast":
            self.op_broadcast(self.pick(["", *QUEUES], other), via_api=False)
        elif kind == "receive":  # by a worker with outcomes to report, if there is one
            reporting = [w for w in WORKERS if self.to_report[w]]
            self.op_receive(self.pick(reporting, pick) or worker, QUEUES, SUCCESSFUL, 100)
        else:
            self.op_cancel_group(self.pick(self.groups, pick), False, 1)

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
            pipe.lrange(k.dependents(job.id), 0, -1)
        groups = list(self.groups.values())
        for group in groups:
            pipe.hgetall(k.group(group.id))
            pipe.lrange(k.group_members(group.id), 0, -1)
            pipe.lrange(k.group_done(group.id), 0, -1)
        pipe.zrange(k.groups, 0, -1, withscores=True)
        pipe.get(k.broadcast_seq)
        pipe.zrange(k.broadcast_unread, 0, -1, withscores=True)
        pipe.zrange(k.broadcast_cursors, 0, -1, withscores=True)
        pipe.zrange(k.broadcast_sent, 0, -1, withscores=True)
        messages = list(self.messages.values())
        for message in messages:
            pipe.hgetall(k.broadcast_message(message.n))
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
            fields, ttl, done, then = (next(replies) for _ in range(4))
            self.check_job(job, fields, ttl, done, where.get(job.id, []), queue_scores)
            assert then == job.then, f"job {job.n}: then {self.names(then)}, {job.then}"
        untracked = set(where) - set(self.jobs)
        assert not untracked, f"sets hold jobs nobody enqueued: {untracked}"

        for group in groups:
            self.check_group(group, next(replies), next(replies), next(replies))
        index = dict(next(replies))
        indexed = [g for g in groups if g.indexed]
        assert set(index) == {g.id for g in indexed}, f"{k.groups}: {index}"
        assert all(
            index[g.id] == 0 if g.aged else in_window(index[g.id], g.created) for g in indexed
        ), index
        self.check_broadcasts(messages, replies)
        self.check_limits()
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
        self.check_errors(name, json.loads(fields.get("errors", "[]")), job.errors)
        assert fields.get("result") == job.result, f"{name}: result {fields.get('result')}"
        assert ("cancelled" in fields) == job.cancelled, f"{name}: cancelled, {job}"
        assert ("waiters" in fields) == job.waiters, f"{name}: waiters, {job}"
        assert "payload" in fields and "enqueued_at" in fields
        assert fields.get("group") == job.group, f"{name}: group {fields.get('group')}, {job}"
        assert ("counted" in fields) == bool(job.counted), f"{name}: counted, {job}"
        assert fields.get("after") == job.after, f"{name}: after {fields.get('after')}"
        assert fields.get("waiting") == ("1" if job.place == WAITING else None), (
            f"{name}: waiting {fields.get('waiting')}, model {job.place}"
        )
        stored_due = fields.get("due")
        assert (stored_due and int(float(stored_due))) == job.run_after, f"{name}: due"
        count = str(len(job.then)) if job.then else None
        assert fields.get("then") == count, f"{name}: then {fields.get('then')}, {job.then}"
        if job.place == FINISHED:
            assert 0 < ttl <= RESULT_TTL, f"{name}: finished with TTL {ttl}"
            assert int(fields["finished_at"]) == job.finished_at
        else:
            assert ttl == -1, f"{name}: {job.place} with TTL {ttl}"
            assert "finished_at" not in fields, f"{name}: {job.place} with a finished_at"
        if job.place == QUEUED:
            assert int(fields["score"]) == queue_scores[job.id], f"{name}: stored score"
        self.check_job_options(name, job, fields)

    def check_errors(self, name: str, stored: list[dict], model: list[Err]) -> None:
        """The error classes in order; a DependencyFailed names the job it ran after and,
        down a chain, the job whose end started the failure."""
        got = [error.get("exception_class_path") for error in stored]
        assert got == [error.kind for error in model], f"{name}: errors {got}, model {model}"
        for error, expected in zip(stored, model, strict=True):
            if expected.kind != DEPENDENCY:
                continue
            traceback = error.get("traceback", "")
            assert f"job {expected.parent}, which this job runs after" in traceback, (
                f"{name}: {traceback!r} does not name job {self.names([expected.parent])}"
            )
            origin = f"without running: job {expected.root} failed"
            assert (origin in traceback) == (expected.root != expected.parent), (
                f"{name}: {traceback!r}, model: started by job {self.names([expected.root])}"
            )

    def check_group(self, group: Group, fields, members, done) -> None:
        """The group's hash and lists, and the promises: each member's end counted
        once, finished when sealed and every member ended, the callback waiting until
        then and let go at the end (or cancelled, with the group)."""
        name = f"group {group.n} ({group.id})"
        if group.gone:
            assert not fields and not members and not done, f"{name}: expired, yet {fields}"
            return
        counted = [self.jobs[m].counted for m in group.members]
        assert group.ended == len([c for c in counted if c]), f"{name}: ended, model"
        assert group.failed == counted.count(FAILED), f"{name}: failed, model"
        sealed = group.total is not None
        assert bool(group.finished) == (sealed and group.ended == group.total), name
        assert fields, f"{name}: its hash is gone"
        assert int(fields["size"]) == len(group.members), f"{name}: size {fields}"
        assert fields.get("total") == (str(group.total) if sealed else None), f"{name}: total"
        ended = (int(fields["ended"]), int(fields["failed"]))
        assert ended == (group.ended, group.failed), f"{name}: ended, failed {ended}, {group}"
        assert fields.get("callback") == group.callback, f"{name}: callback"
        assert ("cancelled" in fields) == group.cancelled, f"{name}: cancelled"
        assert in_window(fields.get("created_at"), group.created), f"{name}: created_at"
        if group.finished:
            assert in_window(fields.get("finished_at"), group.finished), f"{name}: finished_at"
        else:
            assert "finished_at" not in fields, f"{name}: finished, {group}"
        assert members == group.members, f"{name}: members {self.names(members)}"
        assert done == (["done"] if group.finished else []), f"{name}: done {done}"
        if group.callback is None:
            return
        callback = self.jobs[group.callback]
        stopped = callback.final == FAILED and callback.cancelled
        if not group.finished:
            assert callback.place == WAITING or stopped, f"{name}: callback {callback}"
        else:
            assert callback.place != WAITING, f"{name} ended; its callback still waits"

    def check_broadcasts(self, messages: list[Message], replies) -> None:
        """The message counter, the unread set, the cursors, and each message with the
        outcome per worker; no live cursor misses a message it has not read."""
        last, unread, cursors, sent = (next(replies) for _ in range(4))
        assert int(last or 0) == self.last_message, f"broadcast:seq {last}"
        unread_numbers = {int(n) for n, score in unread if int(n) == score}
        assert unread_numbers == self.unread and len(unread) == len(self.unread), (
            f"unread {unread}, model {sorted(self.unread)}"
        )
        assert dict(cursors) == self.cursors, f"cursors {cursors}, model {self.cursors}"
        live = self.heartbeats - self.silent
        assert live <= set(self.cursors), f"live workers without a cursor: {live}"
        for worker, cursor in self.cursors.items():
            lost = set(range(cursor + 1, self.last_message + 1)) - self.unread
            assert not lost, f"{worker} has not read messages {lost}, gone from unread"
        assert {int(n) for n, _ in sent} == set(self.messages), f"sent {sent}"
        assert all(in_window(at, self.messages[int(n)].sent) for n, at in sent), sent
        for message in messages:
            fields = next(replies)
            name = f"message {message.n}"
            assert fields.get("payload") == self.payload, f"{name}: {fields}"
            assert fields.get("queue") == message.queue, f"{name}: queue {fields}"
            assert in_window(fields.get("sent_at"), message.sent), f"{name}: sent_at"
            ran = {f.removeprefix("ran:"): v for f, v in fields.items() if f.startswith("ran:")}
            assert set(ran) == set(message.ran), f"{name}: ran {ran}, model {message.ran}"
            for worker, (status, t0, t1) in message.ran.items():
                stored, at = ran[worker].split(" ")
                assert stored == status and t0 <= int(at) <= t1, f"{name}: {worker} {ran}"

    def check_counts(self) -> None:
        counts = self.queries.counts(QUEUES)
        for queue in QUEUES:
            expected = {
                "ready": len(self.queue_order(queue)),
                "delayed": sum(j.queue == queue for j in self.job_list(DELAYED)),
                "failed": len(self.failed_order(queue)),
                "paused": queue in self.paused,
            }
            assert counts[queue] == expected, f"counts of {queue}: {counts[queue]}, {expected}"

    def expected_keys(self) -> tuple[dict[str, bool], set[str]]:
        """Every key the model allows, with whether it must expire; and the keys that
        must exist. Only the infrastructure (counters, sets of names, the queues, the
        running set, the cursors), jobs that have not ended and groups sealed but not
        ended live without a TTL."""
        k = self.keys
        kept = [k.seq, k.running, k.scheduler_wake, k.paused, k.workers, k.schedulers]
        kept += [k.known_queues, k.broadcast_seq, k.broadcast_cursors]
        for queue in QUEUES:
            kept += [k.queue(queue), k.wake(queue), k.delayed(queue)]
        expires = dict.fromkeys(kept, False)
        expires |= {k.failed(queue): True for queue in QUEUES}
        expires |= {k.worker(w): True for w in self.records}
        for job in self.jobs.values():
            if job.place != DELETED:
                expires[k.job(job.id)] = job.place == FINISHED
            if job.done:
                expires[k.done(job.id)] = True
            if job.then:
                expires[k.dependents(job.id)] = False
        required: set[str] = set()
        for group in self.groups.values():
            if group.gone:
                continue
            ongoing = group.total is not None and not group.finished
            expires[k.group(group.id)] = not ongoing
            required.add(k.group(group.id))
            if group.members:
                expires[k.group_members(group.id)] = not ongoing
            if group.finished:
                expires[k.group_done(group.id)] = True
        if any(g.indexed for g in self.groups.values()):
            expires[k.groups] = False
        if self.unread:
            expires[k.broadcast_unread] = True
        if self.messages:
            expires[k.broadcast_sent] = True
        expires |= {k.broadcast_message(n): True for n in self.messages}
        expires |= {k.broadcast_wake(w): True for w in self.message_wakes}
        required |= {k.broadcast_wake(w) for w in self.message_wakes}
        self.expected_limit_keys(expires, required)
        return expires, required

    def check_keys(self) -> None:
        """Every key is one the schema names, with a TTL unless the schema keeps it (no
        key left without one); the stats count every finish."""
        k = self.keys
        expires, required = self.expected_keys()
        keys = self.r.keys("*")
        stats_keys = [
            key
            for key in keys
            if key.startswith(k.stats_prefix) and key[len(k.stats_prefix) :].isdigit()
        ]
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(k.workers, 0, -1)
        pipe.zrange(k.schedulers, 0, -1)
        for key in keys:
            pipe.pttl(key)
        for key in stats_keys:
            pipe.hgetall(key)
        workers, schedulers, *replies = pipe.execute()
        assert set(workers) == self.heartbeats, f"workers {workers}, model {self.heartbeats}"
        assert set(schedulers) == self.schedulers, f"schedulers {schedulers}"
        stats: Counter[str] = Counter()
        for counts in replies[len(keys) :]:
            stats.update({f: int(v) for f, v in counts.items()})
        for key, ttl in zip(keys, replies, strict=False):
            if key in stats_keys:
                assert ttl > 0, f"{key} never expires"
                continue
            assert key in expires, f"unexpected key {key}"
            assert (ttl > 0) == expires[key], (
                f"{key}: TTL {ttl} ms; model: {'expires' if expires[key] else 'kept'}"
            )
        assert required <= set(keys), f"missing keys: {required - set(keys)}"
        assert stats == self.stats, f"stats {dict(stats)}, model {dict(self.stats)}"

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
                    len(j.errors),
                    j.group is not None,
                    j.counted,
                    len(j.then),
                )
                for j in self.jobs.values()
            ),
            tuple(
                (len(g.members), g.total, g.ended, g.failed, bool(g.finished), g.cancelled)
                for g in self.groups.values()
            ),
            tuple(sorted(self.paused)),
            tuple(tuple(sorted(self.held[w].values())) for w in WORKERS),
            tuple(self.last_message - self.cursors.get(w, -1) for w in WORKERS),
            len(self.unread),
            self.limits_state(),
        )


# About 13,000 steps in 80 s on two cores; REDISQUEUE_MODEL_EXAMPLES=3000 for a long
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

    def make_broker(client: FaultyRedis) -> Broker:
        broker = Broker(client, backend.keys, lease=LEASE, result_ttl=RESULT_TTL)
        if pipelined:
            broker._run = lambda script, *args, acked=False: broker._run_many([(script, args)])[0]
        return broker

    env = model_env(r, backend, redis_server.url, make_broker, tasks.noop)
    env["queries"] = Queries(env["client"], backend.keys, result_ttl=RESULT_TTL)
    seconds = run_model(
        ProtocolMachine,
        env,
        examples=examples,
        steps=50,
        patches=[mock.patch("django_redisqueue.store.broker.ENQUEUE_BATCH_JOBS", BATCH)],
    )
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
            "groups completed",
            "released",
            "failed waiting jobs",
            "refused linked enqueues",
            "groups trimmed from the index",
            "messages received",
            "receives past other queues' messages",
            "lost fan-out replies",
            "parked",
            "limited jobs ended",
            "starts forgotten past a window",
            "unparked by a freed slot",
            "unparked by the tick",
            "parked jobs cancelled",
            "unique enqueues refused",
            "unique keys freed",
            "unique keys kept for their window",
            "unique keys taken again",
            "unique windows passed",
        )
    )
    report(
        f"protocol model{' (pipelined)' if pipelined else ''}: {steps} steps in "
        f"{RUN['examples']} sequences, "
        f"{len(STATES)} distinct states, {seconds:.1f} s ({extra})"
    )
