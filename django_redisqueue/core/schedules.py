"""Periodic schedules as timetables: ``OPTIONS["PERIODIC"]`` parsed, and the
occurrences of each, pure of Redis.

An occurrence is an instant in ms since the epoch (UTC); an interval's are the whole
multiples of it since the epoch, so every scheduler finds the same ones without talking
to the others (docs/protocol.md, "Periodic jobs"). ``runtime/periodic.py`` enqueues them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.utils.timezone import get_default_timezone

from django_redisqueue.core.jobs import to_json

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
