"""Periodic jobs: the scheduler's step that enqueues each occurrence of the schedules
(``core/schedules.py``) once, and an operator's "run now".

The scheduler computes the occurrences due, and ``lua/periodic.lua`` enqueues them
atomically, compare-and-setting the schedule's ``last`` occurrence: see
docs/protocol.md, "Periodic jobs" (and its "Edits").
"""

from __future__ import annotations

import logging
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string
from django.utils.timezone import get_default_timezone

from django_redisqueue.backends.base import new_job
from django_redisqueue.compat import Task
from django_redisqueue.core.registry import registry
from django_redisqueue.core.schedules import Due, Schedule, parse_schedules
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS

if TYPE_CHECKING:
    from django_redisqueue.backends.redis import RedisQueueBackend
    from django_redisqueue.core.tasks import RedisTaskResult

logger = logging.getLogger(__name__)

# After three calls that found `last` moved by another scheduler, wait this long (ms).
RACED_WAIT_MS = 100
# Seconds between two syncs of the schedules with Redis (register, spec, clean up).
SYNC_EVERY = 60.0


class PeriodicTaskError(LookupError):
    """A schedule's task cannot be used: not importable, not a task, or refused by its
    backend."""


def job_id(name: str, occurrence_ms: int) -> str:
    """The id of the job of a schedule's occurrence: the same in every scheduler."""
    return f"periodic:{name}:{occurrence_ms}"


def resolve_task(backend: RedisQueueBackend, schedule: Schedule) -> Task:
    """The task a schedule names, for ``backend``; raise PeriodicTaskError saying why
    it cannot be used. Registered tasks (installed apps' ``tasks`` modules) first:
    the worker runs no other."""
    task = registry.get(schedule.task_path)
    if task is None:
        try:
            task = import_string(schedule.task_path)
        except Exception as exc:  # ImportError, or whatever the module raised as it loaded
            raise PeriodicTaskError(
                f"Periodic job {schedule.name!r}: task {schedule.task_path!r} cannot be "
                f"imported ({type(exc).__name__}: {exc})."
            ) from None
        if not isinstance(task, Task):
            raise PeriodicTaskError(
                f"Periodic job {schedule.name!r}: {schedule.task_path!r} is not a task "
                "(decorate the function with @task)."
            )
    try:
        if task.backend != backend.alias:
            task = task.using(backend=backend.alias)
        backend.validate_once(task)
    except Exception as exc:  # InvalidTask and the like: the backend refuses it
        raise PeriodicTaskError(
            f"Periodic job {schedule.name!r}: backend {backend.alias!r} refuses task "
            f"{schedule.task_path!r}: {exc}"
        ) from None
    return task


def schedules_of(backend: RedisQueueBackend) -> list[Schedule]:
    return parse_schedules(backend.config.periodic)


class PeriodicStep:
    """The scheduler's part for periodic jobs: sync the schedules with Redis, then at
    each step enqueue the occurrences due. Remembers each schedule's ``last`` as Redis
    answered it, so that a step with nothing due sends Redis nothing."""

    def __init__(self, backend: RedisQueueBackend) -> None:
        self.backend = backend
        self.schedules = schedules_of(backend)
        self.last: dict[str, int | None] = {}  # as Redis said; None: unknown
        self.next: dict[str, int] = {}  # next occurrence to look at (ms)
        self.tasks: dict[str, Task] = {}
        # Schedules whose timetable in Redis is another since the last sync (logged once).
        self.refused: set[str] = set()
        self.synced_at: float | None = None

    @property
    def broker(self) -> Broker:
        return self.backend.broker

    def due_for_sync(self, monotonic_now: float) -> bool:
        return self.synced_at is None or monotonic_now - self.synced_at >= SYNC_EVERY

    def sync(self, now_ms: int, monotonic_now: float) -> None:
        """Register the schedules, store their specs and timetables (a schedule whose
        timetable is not the one in force starts now), and delete the state of
        schedules no longer in settings."""
        tz = get_default_timezone()
        entries = [
            (s.name, s.spec(), s.timetable(tz), self._next_or_none(s, now_ms, tz))
            for s in self.schedules
        ]
        lasts, removed, edited = self.broker.periodic_sync(entries)
        for schedule, last in zip(self.schedules, lasts, strict=True):
            self.last[schedule.name] = last
            self.next.pop(schedule.name, None)
        for name in removed:
            logger.info("Periodic job %r is no longer in settings: its state is deleted", name)
        for name in edited:
            logger.info(
                "Periodic job %r runs at other times than Redis held: it starts again from "
                "now, and no run of before is enqueued",
                name,
            )
        self.refused.clear()
        self.synced_at = monotonic_now

    def _next_or_none(self, schedule: Schedule, now_ms: int, tz: tzinfo) -> int | str:
        """The schedule's next run after ``now_ms``, or '' (none: logged) when it has
        none that cronsim can find, so that one schedule cannot stop the sync."""
        try:
            return schedule.next_after(now_ms, tz)
        except Exception as exc:
            logger.error("Periodic job %r has no next run: %s", schedule.name, exc)
            return ""

    def step(self, now_ms: int) -> float | None:
        """Enqueue what is due at ``now_ms`` (Redis's clock); return the seconds until
        the next occurrence (0: step again at once; None: no schedule)."""
        tz = get_default_timezone()
        soonest: int | None = None
        for schedule in self.schedules:
            try:
                next_ms = self._step_one(schedule, now_ms, tz)
            except REDIS_ERRORS:
                raise
            except Exception as exc:
                # One schedule's fault (its task, its arguments) must not stop the others.
                if isinstance(exc, PeriodicTaskError):
                    logger.error("%s Nothing is enqueued for it.", exc)
                else:
                    logger.exception("Periodic job %r: %s", schedule.name, exc)
                next_ms = now_ms + int(SYNC_EVERY * 1000)
                self.next[schedule.name] = next_ms
            soonest = next_ms if soonest is None else min(soonest, next_ms)
        if soonest is None:
            return None
        return max(soonest - now_ms, 0) / 1000

    def _step_one(self, schedule: Schedule, now_ms: int, tz: tzinfo) -> int:
        """One schedule's step; returns its next occurrence (ms)."""
        known = self.next.get(schedule.name)
        if known is not None and known > now_ms:
            return known
        for _ in range(3):  # another scheduler may move `last` between our read and call
            last = self.last.get(schedule.name)
            due = schedule.due(last, now_ms, tz) if last is not None else Due([], 0, 0)
            task, prepared = self._job(schedule) if due.occurrences else (None, None)
            reply = self.broker.periodic_run(
                schedule.name,
                timetable=schedule.timetable(tz),
                expected_last=last,
                now_ms=now_ms,
                next_ms=due.next_ms or schedule.next_after(now_ms, tz),
                skipped=due.skipped,
                queue=task.queue_name if task else "",
                priority=task.priority if task else 0,
                payload=prepared._payload if prepared else "",
                jobs=[(at, job_id(schedule.name, at)) for at in due.occurrences],
                record_queues=not self.backend.queue_names,
                options=prepared._options if prepared else "",
            )
            if reply.status == "edited":
                return self._refused(schedule, now_ms, tz)
            self.last[schedule.name] = reply.last
            if reply.status == "stale" or (reply.status == "new" and due.occurrences):
                continue  # compute again from the `last` Redis holds now
            if reply.enqueued:
                logger.info(
                    "Periodic job %r: enqueued %d occurrence(s), the last at %s (job %s)%s",
                    schedule.name,
                    reply.enqueued,
                    datetime.fromtimestamp(reply.last / 1000, tz).isoformat(),
                    reply.last_job,
                    f"; skipped {due.skipped} missed" if due.skipped else "",
                )
            if reply.status == "ok" and due.occurrences and due.next_ms <= now_ms:
                return now_ms  # a backlog remains: step again at once
            next_ms = schedule.next_after(max(now_ms, reply.last), tz)
            self.next[schedule.name] = next_ms
            return next_ms
        return now_ms + RACED_WAIT_MS  # raced three times: try again shortly

    def _refused(self, schedule: Schedule, now_ms: int, tz: tzinfo) -> int:
        """Another timetable is in force for the schedule: this scheduler's settings are
        older or newer than those synced last. It enqueues none of its runs, and looks
        again at its next one; its own sync makes its timetable the one in force."""
        if schedule.name not in self.refused:
            self.refused.add(schedule.name)
            logger.warning(
                "Periodic job %r: Redis holds another timetable for it, synced by a "
                "scheduler with other settings; this one enqueues none of its runs until "
                "its next sync (a deploy under way, or schedulers that disagree)",
                schedule.name,
            )
        self.last[schedule.name] = None  # unknown: the next call sends no occurrence
        next_ms = schedule.next_after(now_ms, tz)
        self.next[schedule.name] = next_ms
        return next_ms

    def _job(self, schedule: Schedule) -> tuple[Task, RedisTaskResult]:
        """The schedule's task and a job of it, prepared as any enqueue's (the envelope,
        checked and size-limited; its limits): every occurrence's job has its payload."""
        task = self.tasks.get(schedule.name)
        if task is None:
            task = resolve_task(self.backend, schedule)
            self.tasks[schedule.name] = task
        return task, self.backend.prepare_valid(task, schedule.args, schedule.kwargs)


def run_now(backend: RedisQueueBackend, schedule: Schedule) -> str:
    """Enqueue a job of the schedule's task at once (not an occurrence: ``last`` stays)
    and record it as the schedule's last job; return its id. Raises PeriodicTaskError
    when the task is unique and the job holding its key has not ended."""

    task = resolve_task(backend, schedule)
    result = backend.prepare_valid(task, schedule.args, schedule.kwargs)
    stored = backend.broker.periodic_run_now(
        schedule.name, new_job(result), record_queues=not backend.queue_names
    )
    if isinstance(stored, str):
        raise PeriodicTaskError(
            f"Periodic job {schedule.name!r}: not run now, as its task is unique and job "
            f"{stored}, which holds its key, has not ended."
        )
    return result.id
