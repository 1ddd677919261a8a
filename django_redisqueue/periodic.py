"""Periodic jobs: schedules declared in ``OPTIONS["PERIODIC"]``, their occurrences, and
the scheduler's step that enqueues each occurrence once.

An occurrence is an instant in ms since the epoch (UTC). A cron schedule's
occurrences are read by ``cronsim`` (Debian cron's rules, DST included) in the
project's ``TIME_ZONE``; an interval's are the whole multiples of the interval since
the epoch, so every scheduler finds the same ones without talking to the others.
The scheduler computes the occurrences due, and ``lua/periodic.lua`` enqueues them
atomically, compare-and-setting the schedule's ``last`` occurrence: see
docs/protocol.md, "Periodic jobs". A schedule edited so that it runs at other times
starts again from the sync that brings the edit: the runs of its new timetable
before then are never enqueued.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string
from django.utils.timezone import get_default_timezone

from django_redisqueue.compat import Task
from django_redisqueue.core.jobs import to_json
from django_redisqueue.core.registry import registry
from django_redisqueue.preparation import new_job
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS

if TYPE_CHECKING:
    from django_redisqueue.backend import RedisQueueBackend
    from django_redisqueue.core.tasks import RedisTaskResult

logger = logging.getLogger(__name__)

# Most occurrences one step enqueues for a schedule that catches up "all"; a full
# batch makes the scheduler step again at once.
BATCH = 100
# Most missed occurrences "all" replays: older ones are counted as skipped (a `last`
# written by hand far in the past must not flood the queues).
MAX_BACKLOG = 10_000
# Occurrences counted one by one at most (a skipped count above it reads "at least").
COUNT_LIMIT = 10_000
# Windows (ms) looked through, the smallest first, for the latest occurrences of a
# cron schedule that missed many: counting from a far `last` would take long.
TAIL_WINDOWS = (3_600_000, 86_400_000, 7 * 86_400_000, 32 * 86_400_000, 367 * 86_400_000)
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


def interval_words(every_ms: int) -> str:
    """An interval in words: "every 30 seconds", "every 5 minutes", "every hour"."""
    for unit, ms in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if every_ms % ms == 0:
            count = every_ms // ms
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    seconds = every_ms / 1000
    if seconds == 1:
        return "every second"
    return f"every {seconds:g} seconds"


def cron_words(expression: str) -> str:
    """A cron expression in words (cron-descriptor: "At 03:00"), or the expression if
    it cannot."""
    try:
        from cron_descriptor import Options, get_description

        # English, 24-hour times: its default follows the process's locale, which
        # would make the words differ from one host (or process) to the next.
        options = Options(use_24hour_time_format=True, locale_code="en_US")
        return str(get_description(expression, options))
    except Exception:  # not installed, or an expression it does not read: show it as is
        return expression


@dataclass(frozen=True)
class Schedule:
    """One entry of ``PERIODIC``, checked by ``conf.validate``."""

    name: str
    task_path: str
    cron: str | None = None
    every_ms: int | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    catch_up: str = "latest"

    @classmethod
    def parse(cls, name: str, raw: Mapping[str, Any]) -> Schedule:
        every = raw.get("every")
        if isinstance(every, timedelta):
            every = every.total_seconds()
        return cls(
            name=name,
            task_path=raw["task"],
            cron=raw.get("cron"),
            every_ms=None if every is None else round(every * 1000),
            args=tuple(raw.get("args") or ()),
            kwargs=dict(raw.get("kwargs") or {}),
            catch_up=raw.get("catch_up", "latest"),
        )

    @property
    def expression(self) -> str:
        """The cron expression, or the interval as "every 30s"."""
        return self.cron if self.cron is not None else f"every {(self.every_ms or 0) / 1000:g}s"

    @property
    def words(self) -> str:
        return (
            cron_words(self.cron) if self.cron is not None else interval_words(self.every_ms or 1)
        )

    def spec(self) -> str:
        """The definition as JSON, stored for the dashboard."""
        data: dict[str, Any] = {"task": self.task_path}
        if self.cron is not None:
            data["cron"] = self.cron
        else:
            data["every"] = (self.every_ms or 0) / 1000
        if self.args:
            data["args"] = list(self.args)
        if self.kwargs:
            data["kwargs"] = dict(self.kwargs)
        data["catch_up"] = self.catch_up
        return to_json(data)

    def timetable(self, tz: tzinfo | None = None) -> str:
        """When it runs, as text: the interval, or the cron expression and the time zone
        it is read in. A sync that brings another one under the same name is an edit:
        the schedule starts again from then. Its task, arguments and catch-up are not
        part of it: the runs due stay due when those change."""
        if self.every_ms is not None:
            return f"every {self.every_ms} ms"
        return f"cron {' '.join((self.cron or '').split())} {tz or get_default_timezone()}"

    # Occurrences

    def after(self, after_ms: int, tz: tzinfo | None = None) -> Iterator[int]:
        """The occurrences after ``after_ms``, strictly increasing, for ever."""
        if self.every_ms is not None:
            at = (after_ms // self.every_ms + 1) * self.every_ms
            while True:
                yield at
                at += self.every_ms
        yield from self._cron_after(after_ms, tz or get_default_timezone())

    def _cron_after(self, after_ms: int, tz: tzinfo) -> Iterator[int]:
        from cronsim import CronSim

        start = datetime.fromtimestamp(after_ms / 1000, tz)
        latest = after_ms
        for moment in CronSim(self.cron or "", start):
            at = int(moment.timestamp() * 1000)
            # cronsim reads the start as a wall-clock time: in the hour a fall-back
            # repeats it may answer an instant before the start. Instants only go up.
            if at > latest:
                latest = at
                yield at

    def next_after(self, after_ms: int, tz: tzinfo | None = None) -> int:
        return next(self.after(after_ms, tz))

    def scan(
        self, after_ms: int, until_ms: int, limit: int, tz: tzinfo | None = None
    ) -> list[int]:
        """The first ``limit`` occurrences in (after, until]."""
        found: list[int] = []
        if limit <= 0:
            return found
        for at in self.after(after_ms, tz):
            if at > until_ms:
                break
            found.append(at)
            if len(found) >= limit:
                break
        return found

    def count(
        self, after_ms: int, until_ms: int, tz: tzinfo | None = None, limit: int = COUNT_LIMIT
    ) -> int:
        """How many occurrences lie in (after, until]; at most ``limit`` are counted,
        except for an interval, counted exactly."""
        if until_ms <= after_ms:
            return 0
        if self.every_ms is not None:
            return max(until_ms // self.every_ms - after_ms // self.every_ms, 0)
        return len(self.scan(after_ms, until_ms, limit, tz))

    def tail(self, after_ms: int, until_ms: int, n: int, tz: tzinfo | None = None) -> list[int]:
        """The last ``n`` occurrences in (after, until], oldest first."""
        if self.every_ms is not None:
            last = until_ms // self.every_ms * self.every_ms
            first = max(after_ms // self.every_ms + 1, last // self.every_ms - n + 1)
            return list(range(first * self.every_ms, last + 1, self.every_ms))
        for window in (*TAIL_WINDOWS, None):
            start = after_ms if window is None else max(after_ms, until_ms - window)
            found: deque[int] = deque(maxlen=n)
            for at in self.after(start, tz):
                if at > until_ms:
                    break
                found.append(at)
            if len(found) >= n or start == after_ms:
                return list(found)
        return []  # pragma: no cover: the last window starts at after_ms

    def due(self, last_ms: int, now_ms: int, tz: tzinfo | None = None) -> Due:
        """What to enqueue now, the schedule's last occurrence being ``last_ms``."""
        tz = tz or get_default_timezone()
        if self.catch_up == "latest":
            latest = self.tail(last_ms, now_ms, 1, tz)
            skipped = self.count(last_ms, latest[0], tz) - 1 if latest else 0
            return Due(latest, skipped, self.next_after(max(now_ms, last_ms), tz))
        occurrences = self.scan(last_ms, now_ms, BATCH, tz)
        skipped = 0
        backlog_at_most = MAX_BACKLOG + 1
        if (
            len(occurrences) == BATCH
            and self.count(last_ms, now_ms, tz, backlog_at_most) > MAX_BACKLOG
        ):
            backlog = self.tail(last_ms, now_ms, MAX_BACKLOG, tz)
            skipped = self.count(last_ms, backlog[0], tz) - 1
            occurrences = backlog[:BATCH]
        more = len(occurrences) == BATCH and occurrences[-1] < now_ms
        next_ms = self.next_after(occurrences[-1] if more else max(now_ms, last_ms), tz)
        return Due(occurrences, skipped, next_ms)


@dataclass(frozen=True)
class Due:
    """Occurrences to enqueue (oldest first), how many older ones are skipped, and the
    next occurrence after them (ms; at or before now while a backlog remains)."""

    occurrences: list[int]
    skipped: int
    next_ms: int


def parse_schedules(raw: Mapping[str, Mapping[str, Any]] | None) -> list[Schedule]:
    """``PERIODIC`` (already validated) as schedules, in settings order."""
    return [Schedule.parse(name, spec) for name, spec in (raw or {}).items()]


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
