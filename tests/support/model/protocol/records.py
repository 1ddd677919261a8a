"""The protocol model's vocabulary: the queues, workers, times and errors its steps
use, the places a job can be in, the limits jobs carry, and the records the model
keeps (a job, a group, a broadcast message, a start of a limited job), with the
helpers that turn times and options into what the broker is sent and Redis stores."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.store.wire import RELEASE, RETRY
from tests.support.model.harness import FAR

QUEUES = ("high", "default", "low")
# Orders in which a worker (or a scheduler) serves queues.
ORDERS = (
    ("high", "default", "low"),
    ("low", "default", "high"),
    ("default",),
    ("low", "high"),
    ("high",),
)
# A worker of more queues than it registers on as idle (handoff.lua's IDLE_QUEUES, 16):
# empty queues of its own first, so that its last two are past its registration.
IDLE_QUEUES = 16
WIDE_ORDER = (*(f"spare{i}" for i in range(IDLE_QUEUES - 1)), *QUEUES)
TICK_QUEUES = (QUEUES, ("low", "default", "high"), ("default",), ())
WORKERS = ("w1", "w2", "w3")
PRIORITIES = (-100, 0, 5, 100)
SOON = 20  # ms: a due time that real time reaches (between two steps)
DELAYS = {"now": None, "past": -1000, "soon": SOON, "an hour": FAR}
RETRY_IN = (0, SOON, FAR)
LEASE = 3600.0  # s: leases pass only when a step says so
LOST_LIMIT = 2
GRACE_MS = 5000  # a tick's grace for leases that ran out after its earlier step
# How long a claim that finds nothing registers its worker as idle (ms): as leases,
# registrations end only when a step says so (a hand-off, a claim, a give-back).
IDLE_MS = 3_600_000
# Jobs per enqueue call (ENQUEUE_BATCH_JOBS, patched): a group of three members and a
# callback takes two calls, the second sealing it.
BATCH = 2
UNKNOWN_ID = "0" * 26  # an id no job has
# Most turns and entries without a job one claim looks through (lib/queues.lua's).
FAIR_LOOKS = 100

ERROR = '{"exception_class_path":"builtins.ValueError","traceback":"boom"}'
LOST_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.LeaseLost","traceback":""}'
CANCEL_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.JobCancelled"}'
# The error classes a job's errors can name.
VALUE_ERROR = "builtins.ValueError"
LEASE_LOST = "django_redisqueue.exceptions.LeaseLost"
STOPPED = "django_redisqueue.exceptions.JobStopped"
STOP_ERROR = '{"exception_class_path":"django_redisqueue.exceptions.JobStopped","traceback":""}'
CANCELLED = "django_redisqueue.exceptions.JobCancelled"
DEPENDENCY = "django_redisqueue.exceptions.DependencyFailed"

STATUSES = (SUCCESSFUL, FAILED, RETRY, RELEASE)

# The places of a job in the model.
QUEUED, DELAYED, RUNNING, FINISHED, DELETED = "queue", "delayed", "running", "finished", "deleted"
WAITING = "waiting"  # READY, in no set: for the job it runs after, or its group
PARKED = "parked"  # READY, over its limit: in its limit's parked set only

HOUR = 3_600_000  # ms: a rate's period, a unique window; longer than any run


class Limit(NamedTuple):
    """A job's limits: its key, max_running, and a rate of starts per period."""

    key: str
    running: int | None
    rate: int | None
    per: int = HOUR


# Jobs pick their limits by name. Key "a" mixes every kind and two periods; "b" is a
# key of its own, so that keys are seen to limit each other not at all.
LIMITS = {
    "a-one": Limit("a", 1, None),
    "a-two": Limit("a", 2, None),
    "a-rate": Limit("a", None, 2),
    "a-both": Limit("a", 2, 3),
    "a-slow": Limit("a", None, 3, 2 * HOUR),
    "b-one": Limit("b", 1, None),
    "b-rate": Limit("b", None, 2),
}
LIMIT_KEYS = sorted({limit.key for limit in LIMITS.values()})
# Most parked jobs a freed slot looks through (lib/running.lua).
FREED_LOOKS_AT = 20
# How long a key remembers its rates past the longest period (lib/limits.lua, ms).
RATE_MEMORY = 86_400_000
# How far rate_window_passes moves starts into the past: out of an hour, or of two.
AGES = {"past an hour": 3 * HOUR // 2, "past two hours": 3 * HOUR}
UNIQUE_KEYS = ("u1", "u2")
# The delays of jobs with options (ms), drawn by OPTION_DELAY.
DELAY_MS = {"now": None, "past": -1000, "an hour": HOUR}

# A job's ``unique_until`` once the step that ends windows moved it into the past.
PASSED = (0, 0)


class Err(NamedTuple):
    """An error in a job's list: its class, and for a DependencyFailed the job it ran
    after and the job whose end started the failure down the chain."""

    kind: str
    parent: str = ""
    root: str = ""


class Pending(NamedTuple):
    """A waiting job to fail (lib/outcome.lua's worklist ``pending``)."""

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
    # Claimed or parked once: its hash holds the queue score it goes back to. A job
    # never claimed nor parked keeps none (its queue holds it): waiting jobs are lean.
    scored: bool = False
    due: int | None = None  # when DELAYED: the due time (ms), None until read back
    due_window: tuple[int, int] = (0, 0)
    deadline: int | None = None  # when RUNNING: the lease deadline (ms)
    deadline_window: tuple[int, int] = (0, 0)
    # RUNNING, handed to an idle worker and not yet taken: in the handed set, its
    # deadline the hand-off's; the window of the enqueue that handed it.
    handed: bool = False
    handed_window: tuple[int, int] = (0, 0)
    owner: str | None = None  # its fencing token while RUNNING, else None
    # The token of its last claim: its hash keeps it once the job leaves RUNNING (one
    # command less a finish), where it fences nothing, as only a RUNNING job is owned.
    token: str | None = None
    attempts: int = 0
    lost: int = 0
    trace: str | None = None  # the trace record of its last attempt that sent one
    progress: str | None = None  # the progress record its owner wrote last, unforgotten
    stop: bool = False  # asked to stop while RUNNING: it never goes back, it ends FAILED
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
    # Unique jobs and limits (limits.py): its unique key, the window of
    # its ``unique_until`` (PASSED once the window ended), and its limit key.
    unique: str | None = None
    unique_until: tuple[int, int] | None = None
    limit: str | None = None  # the name of its limits in LIMITS
    fair: str | None = None  # its fairness key (fairness.py), None: not fair
    claim_order: int = 0  # when RUNNING: the order of its claim among every claim
    # Kept as an entry, as the enqueue stores a fresh job, until a script makes it its
    # hash (a claim, or any that asks whether it is a job): then never again.
    entry: bool = False

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


@dataclass
class Start:
    """A start of a job of a key: the job, the window of its claim, its claim ms once
    read back (``at``), and how far the step that ages starts moved it into the past."""

    job_id: str
    window: tuple[int, int]
    seq: int  # its claim's order: each claim of a step has a ms of its own
    at: int | None = None
    age: int = 0

    @property
    def score(self) -> int:
        assert self.at is not None
        return self.at - self.age


def run_after(due_ms: int) -> tuple[datetime, int]:
    """A run_after for a due time, and the due time (ms) the backend derives from it."""
    when = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
    return when, int(when.timestamp() * 1000)


def in_window(value: str | float | None, window: tuple[int, int]) -> bool:
    """A time Redis stored (a field, or a score) lies in the window of its call."""
    return value is not None and window[0] <= int(float(value)) <= window[1]


def options_json(
    unique: tuple[str, bool] | None, limit: str | None, fair: str | None = None
) -> str:
    """A job's options as the enqueue sends them (RedisTask.job_options)."""
    options: dict[str, object] = {} if fair is None else {"fair": fair}
    if unique is not None:
        options["unique"] = unique[0]
        if unique[1]:
            options["unique_ms"] = HOUR
    if limit is not None:
        settings = LIMITS[limit]
        options["limit"] = settings.key
        if settings.running:
            options["max_running"] = settings.running
        if settings.rate:
            options["rate"], options["per"] = settings.rate, settings.per
    return json.dumps(options) if options else ""
