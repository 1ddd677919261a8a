"""Fan-out: groups with a completion callback, chains, and broadcast to every worker.

``task.job(*args, **kwargs)`` is a task with its arguments, not queued yet; these
functions queue such jobs together, each step in Redis an atomic script like every other
move of a job (docs/protocol.md, "Fan-out").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, cast

from django_redisqueue.compat import TaskResultDoesNotExist, task_backends
from django_redisqueue.core.tasks import (
    Chain,
    Job,
    RedisTaskResult,
    checked_jobs,
    fan_out_backend,
)


def _backend_of(jobs: Iterable[Job]) -> _FanOutBackend:
    return cast(_FanOutBackend, fan_out_backend(jobs))


class Progress(NamedTuple):
    ended: int  # members that ended, successful or failed
    failed: int
    total: int  # members in the group


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group as Redis holds it: how many members it has and how many have ended."""

    group_id: str
    size: int  # members stored so far
    total: int | None  # the final size, once its last batch was stored (sealed)
    ended: int
    failed: int
    callback_id: str
    created_at_ms: int
    finished_at_ms: int | None
    cancelled: bool


class _FanOutBackend(Protocol):
    alias: str

    def enqueue_group(self, members: Sequence[Job], callback: Job | None) -> GroupResult: ...

    def enqueue_chain(self, jobs: Sequence[Job]) -> list[RedisTaskResult]: ...

    def send_broadcast(self, job: Job, queue: str) -> int: ...

    def group_state(self, group_id: str) -> GroupState: ...

    def group_results(self, group_id: str) -> list[Any]: ...

    def wait_group(self, group_id: str, timeout: float | None = None) -> None: ...

    def cancel_group(self, group_id: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs that run in parallel, and a callback queued once when all have ended."""

    members: tuple[Job, ...]
    callback: Job | None = None

    def enqueue(self) -> GroupResult:
        """Queue the members, a batch of up to 1,000 per atomic call, all batches in
        one round trip; every job is checked first, and a bad one queues none."""
        everyone = [*self.members, *([self.callback] if self.callback else [])]
        return _backend_of(everyone).enqueue_group(self.members, self.callback)


def group(jobs: Iterable[Job], *, callback: Job | None = None) -> Group:
    """Jobs that run in parallel; ``callback`` runs once when every one has ended,
    with their return values (None for a failed member) as its first argument."""
    members = checked_jobs(jobs, "group()")
    if not members and callback is None:
        raise ValueError("A group needs at least one job, or a callback.")
    if callback is not None:
        checked_jobs([callback], "group(callback=...)")
    return Group(tuple(members), callback)


def chain(*jobs: Job) -> Chain:
    """Jobs that run in the order given, each once the one before succeeded; if one
    fails, the rest end FAILED with ``DependencyFailed``."""
    jobs_ = checked_jobs(jobs, "chain()")
    if not jobs_:
        raise ValueError("A chain needs at least one job.")
    return Chain(tuple(jobs_))


def broadcast(job: Job, *, queue: str = "") -> int:
    """Run ``job`` once on every live worker (with ``queue``: on every worker serving
    it); return the message's number. Workers that start later do not run it."""
    return _backend_of(checked_jobs([job], "broadcast()")).send_broadcast(job, queue)


@dataclass(slots=True)
class GroupResult:
    """A handle on a queued group: its progress, its members' results, its callback."""

    id: str
    backend: str
    member_ids: list[str]
    callback_id: str | None
    state: GroupState | None = None

    def _backend(self) -> _FanOutBackend:
        return cast(_FanOutBackend, task_backends[self.backend])

    def refresh(self) -> None:
        """Read the group's counts again."""
        self.state = self._backend().group_state(self.id)

    @property
    def progress(self) -> Progress:
        """How many members ended (and failed) of how many, as of the last refresh."""
        state = self._state()
        total = state.total if state.total is not None else len(self.member_ids)
        return Progress(state.ended, state.failed, total)

    @property
    def finished(self) -> bool:
        """True once every member has ended (as of the last refresh)."""
        return self._state().finished_at_ms is not None

    def _state(self) -> GroupState:
        if self.state is None:
            self.refresh()
        assert self.state is not None
        return self.state

    @property
    def results(self) -> list[Any]:
        """The members' return values, in order; None for one that failed or has not
        ended (or whose result expired)."""
        return self._backend().group_results(self.id)

    @property
    def members(self) -> list[RedisTaskResult | None]:
        """The members' results, in order; None for one whose record is gone (deleted
        by an operator, or expired with its result)."""
        backend = task_backends[self.backend]
        members: list[RedisTaskResult | None] = []
        for job_id in self.member_ids:
            try:
                members.append(cast("RedisTaskResult", backend.get_result(job_id)))
            except TaskResultDoesNotExist:
                members.append(None)
        return members

    @property
    def callback(self) -> RedisTaskResult | None:
        if self.callback_id is None:
            return None
        return cast("RedisTaskResult", task_backends[self.backend].get_result(self.callback_id))

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every member has ended; return ``results``. Raise
        ``ResultTimeout`` if they have not within ``timeout`` seconds. Redis errors
        (a restart, a failover) are waited out, with backoff, until the timeout."""
        self._backend().wait_group(self.id, timeout)
        self.refresh()
        return self.results

    def cancel(self) -> int:
        """Cancel every member that has not started, and the callback; return how
        many jobs were cancelled. Running members finish; the callback never runs."""
        cancelled = self._backend().cancel_group(self.id)
        self.refresh()
        return cancelled
