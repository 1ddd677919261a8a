"""What the protocol's moves take and give back: job statuses and outcomes, a job to
store, a claimed job, a scheduler step's summary, a periodic step's reply, the broadcast
messages received. The values only; ``broker.py`` makes the moves. (The statuses an
outcome shares with a job, SUCCESSFUL and FAILED, are ``core.jobs``'.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django_redisqueue.core.jobs import QUEUE_NAME_RE

# What cancel answers for a job it cancelled (otherwise, the status that prevents it).
CANCELLED = "CANCELLED"
RETRY = "RETRY"  # an outcome only: the job goes back to the delayed set, READY
RELEASE = "RELEASE"  # an outcome only: given back unfinished to its queue, READY
# NewJob.after of a group's callback: it waits for every member of its group to end
# (no job id has a '*').
AFTER_GROUP = "*"
# How a callback's job hash names its group in its ``after`` field: ``group:<gid>``.
AFTER_GROUP_PREFIX = "group:"
# Most jobs, and most payload bytes, one enqueue script call stores: Redis runs
# nothing else during a script, so a large batch is cut into calls of this size (all
# sent in one round trip).
ENQUEUE_BATCH_JOBS = 1000
ENQUEUE_BATCH_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to store: READY now, or in its queue's delayed set until ``due_ms``."""

    job_id: str
    queue: str
    priority: int
    payload: str  # the JSON envelope
    due_ms: int = 0  # ms since the epoch by Redis's clock; 0 (or passed): ready now
    # The job it runs after: '' (none), a job id, or AFTER_GROUP (a group's callback).
    after: str = ""
    # '' or JSON: its unique key and limits (lua/lib/new_jobs.lua's job_options).
    options: str = ""

    def as_args(self) -> list[Any]:
        return [self.job_id, self.payload, self.queue, self.priority, self.due_ms, self.options]

    def as_linked_args(self) -> list[Any]:
        return [*self.as_args(), self.after]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job taken by a worker: it owns it until it finishes or the lease runs out."""

    job_id: str
    owner: str  # the fencing token: only this owner may finish the job
    fields: dict[str, str]  # the job's hash, as jobs.JobRecord reads it

    @property
    def payload(self) -> str:
        return self.fields.get("payload", "")


def _texts(items: Sequence[Any]) -> list[str]:
    """A script's reply items as strings (Lua numbers arrive as integers)."""
    return [i.decode("utf-8", "replace") if isinstance(i, bytes) else str(i) for i in items]


def claimed_from_reply(reply: Any) -> Claimed | None:
    """A claim's reply: {id, owner, field, value, ...}, or its JSON for a job handed
    over (lua/lib/handoff.lua); None for an entry of a hand-off list that is no such
    JSON (written by hand: it names no job)."""
    if isinstance(reply, bytes | str):
        try:  # (bytes that are not UTF-8 decode as the claim's reply does: replaced)
            reply = json.loads(_texts([reply])[0])
        except ValueError:
            return None
        if not isinstance(reply, list) or len(reply) < 2:
            return None
    values = _texts(reply)
    return Claimed(values[0], values[1], dict(zip(values[2::2], values[3::2], strict=False)))


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended, as the worker hands it back to finish it."""

    job_id: str
    owner: str
    status: str  # SUCCESSFUL, FAILED, RETRY or RELEASE
    result: str = ""  # JSON return value
    error: str = ""  # JSON {"exception_class_path": ..., "traceback": ...}
    retry_in_ms: int = 0  # for RETRY, and a RELEASE for later
    # '' or where the attempt was traced (tracing.py), kept in the job's hash for the
    # next attempt or a group's callback to link to.
    trace: str = ""

    def as_args(self) -> list[Any]:
        return [
            self.job_id,
            self.owner,
            self.status,
            self.result,
            self.error,
            self.retry_in_ms,
            self.trace,
        ]


@dataclass(frozen=True, slots=True)
class Tick:
    """What one scheduler step did, and how long until the next step is due."""

    promoted: int
    recovered: int
    failed: int
    next_in: float | None  # seconds; None when nothing is delayed or running; 0: again
    now_ms: int  # Redis's clock when the step ran
    held: bool = False  # it ran past recover_until_ms, so it recovered no lease
    overdue: bool = False  # a lease that ran out is left for a later step
    handed_back: int = 0  # jobs handed to idle workers that did not take them in time


@dataclass(frozen=True, slots=True)
class PeriodicReply:
    """What a periodic step did for one schedule (lua/periodic.lua, mode 'run')."""

    # ok, stale (compute again from ``last``), edited (another timetable is in force:
    # nothing done), new, paused, invalid
    status: str
    last: int  # the schedule's last occurrence (ms), as Redis now holds it (0: none)
    enqueued: int  # jobs stored
    last_job: str  # the id of the last job stored ('' if none)


@dataclass(frozen=True, slots=True)
class Received:
    """What one receive took: the broadcast messages to run (number, payload), and
    whether unread messages remain past those it read."""

    messages: list[tuple[int, str]]
    more: bool


class MissingJob(LookupError):
    """A job named to run after (``depends_on``) does not exist, or has expired."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def enqueue_batches(jobs: Sequence[NewJob], *, linked: bool = False) -> Iterator[list[Any]]:
    """The enqueue script's arguments for ``jobs`` (``linked``: enqueue_linked's),
    cut into batches of ENQUEUE_BATCH_JOBS jobs or ENQUEUE_BATCH_BYTES of payloads (the
    last job may pass it). A linked batch is cut earlier where it must to keep each job
    in the call of the job it runs after: each call is atomic, so the two are stored
    together or not at all, however the calls are cut short (a chain longer than a
    call is cut where it must)."""
    if not jobs:
        yield []  # a call all the same: a group without members is made and sealed
        return
    safe = _safe_cuts(jobs) if linked else None
    start = 0
    while start < len(jobs):
        end, size = start, 0
        while end < len(jobs) and (
            end == start or (end - start < ENQUEUE_BATCH_JOBS and size < ENQUEUE_BATCH_BYTES)
        ):
            size += len(jobs[end].payload)
            end += 1
        if safe is not None and end < len(jobs):
            end = next((cut for cut in range(end, start, -1) if safe[cut]), end)
        yield [
            arg
            for job in jobs[start:end]
            for arg in (job.as_linked_args() if linked else job.as_args())
        ]
        start = end


def chains_together(jobs: Sequence[NewJob]) -> list[int]:
    """The places of ``jobs`` reordered so that each chain (jobs linked by what they
    run after, among these) is in one piece: chains in the order of their first job,
    each job's place among its chain's kept. Only a chain's first job can be ready
    at the enqueue (the others wait), so no ready job passes another."""
    place = {job.job_id: i for i, job in enumerate(jobs)}
    head = list(range(len(jobs)))  # each job's chain, named by its first job's place

    def root(i: int) -> int:
        while head[i] != i:
            head[i] = head[head[i]]
            i = head[i]
        return i

    for i, job in enumerate(jobs):
        if job.after in place:
            head[i] = root(place[job.after])
    chains: dict[int, list[int]] = {}
    for i in range(len(jobs)):
        chains.setdefault(root(i), []).append(i)
    return [i for chain in chains.values() for i in chain]


def _safe_cuts(jobs: Sequence[NewJob]) -> list[bool]:
    """For each place ``i``, whether cutting before ``jobs[i]`` parts no job from the
    one it runs after (none from i on waits for one before i)."""
    position = {job.job_id: i for i, job in enumerate(jobs)}
    safe = [True] * (len(jobs) + 1)
    lowest = len(jobs)  # the lowest place waited for from place i on
    for i in range(len(jobs) - 1, -1, -1):
        lowest = min(lowest, position.get(jobs[i].after, lowest))
        safe[i] = lowest >= i
    return safe


def enqueue_reply(reply: Any) -> int | str | None:
    """One job's enqueue reply: its enqueue time (ms), None (its id was taken), or the
    id of the job holding its unique key."""
    if isinstance(reply, bytes | str):
        return reply.decode() if isinstance(reply, bytes) else reply
    return int(reply) or None


# A fresh job kept as an entry in its bucket (KeySchema.entries), as lua/lib/values.lua
# reads it: '<enqueued_at>|<priority>|<queue>|<payload>'. ASCII digits, as Lua's %d: a
# Python \d would take others the scripts refuse.
_ENTRY = re.compile(rf"([0-9]+)\|(-?[0-9]+)\|({QUEUE_NAME_RE.pattern})\|(.+)", re.DOTALL)


def entry_fields(entry: str | None) -> dict[str, str] | None:
    """The fields a job's hash would hold for its entry, as expand_entry writes them
    (None for no entry, or one that does not parse)."""
    match = _ENTRY.fullmatch(entry) if entry else None
    if match is None:
        return None
    enqueued_at, priority, queue, payload = match.groups()
    fields = {"payload": payload, "queue": queue, "enqueued_at": enqueued_at, "status": "READY"}
    if int(priority) != 0:
        fields["priority"] = priority
    return fields
