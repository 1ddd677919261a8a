"""The periodic model's vocabulary: the schedules a sync may declare (POOL, by name),
what the steps draw names and settings from, the bounds patched for the test, the
options a scheduler's own call sends, the values spoilt state holds, and the arithmetic
of periods and occurrences the model counts with."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from hypothesis import strategies as st

from django_redisqueue.core.schedules import Schedule

TASK = "tests.support.tasks.noop_any"
# The settings a sync may declare: per name, its variants (None: not in settings).
POOL: dict[str, tuple[Schedule, ...]] = {
    "beat": (
        Schedule("beat", TASK, every_ms=1000, catch_up="all"),
        Schedule("beat", TASK, every_ms=1000, catch_up="latest"),
        Schedule("beat", TASK, every_ms=2000, args=(1,), catch_up="all"),
        # A unique task (its key by its arguments): its runs never overlap.
        Schedule(
            "beat", "tests.support.tasks.unique_report", every_ms=1000, args=("x",), catch_up="all"
        ),
        # The same name by cron: another timetable.
        Schedule("beat", TASK, cron="* * * * *", catch_up="all"),
    ),
    "minutely": (
        Schedule("minutely", TASK, cron="* * * * *", catch_up="latest"),
        Schedule("minutely", TASK, cron="* * * * *", catch_up="all"),
        Schedule("minutely", TASK, cron="*/2 * * * *", catch_up="all"),
        # unique="rebuild", unique_for=3600: a window from each enqueue.
        Schedule("minutely", "tests.support.tasks.rebuild_once_an_hour", cron="* * * * *"),
        # The same instants as "*/2 * * * *" by interval: another timetable all the same.
        Schedule("minutely", TASK, every_ms=120_000, catch_up="all"),
    ),
    "fast": (
        Schedule("fast", TASK, every_ms=1000, catch_up="all"),
        Schedule("fast", TASK, every_ms=1000, catch_up="latest"),
    ),
}
# Each variant by its name and spec, as a sync stores it.
BY_SPEC = {(x.name, x.spec()): x for kinds in POOL.values() for x in kinds}
INVALID = "bad name"  # refused by the script: not a valid schedule name
# Names a step acts on: the invalid one now and then.
NAME = st.sampled_from([*POOL, *POOL, INVALID])
# Settings: per name, absent (one time in seven) or one of its variants.
SETTINGS = st.tuples(
    *[
        st.sampled_from([None, *[i for i in range(len(v)) for _ in range(4 // len(v) + 1)]])
        for v in POOL.values()
    ]
)
# A cron expression's period (UTC, whole minutes divide the hour: a regular grid).
CRON_PERIOD = {"* * * * *": 60_000, "*/2 * * * *": 120_000}
BATCH = 4  # periodic.BATCH, patched
MAX_BACKLOG = 10  # periodic.MAX_BACKLOG, patched
# The queue and priority of the jobs a scheduler's own call stores (a PeriodicStep
# stores its task's: "default", 0).
CALL_QUEUE = {"beat": ("default", 0), "minutely": ("low", 5), "fast": ("default", -3)}
CALL_QUEUE[INVALID] = ("default", 0)
# A job's options (lib/new_jobs.lua's job_options), as a scheduler's own call sends them.
OPTIONS = (
    "",
    '{"limit":"p","max_running":2}',
    '{"limit":"p","rate":3,"per":1000}',
    '{"unique":"u"}',
    '{"unique":"u","unique_ms":5000}',
    '{"unique":"rebuild","unique_ms":3600000}',
)
SCHEDULERS = 3
# Values written by hand in ``last``, and what the script reads (lua's tonumber, then
# lib/values.lua's number(): a finite number or nothing; periodic.lua floors it).
SPOILT_LAST: dict[str, float | None] = {
    "abc": None,
    "": None,
    "nan": None,
    "-inf": None,
    "1e400": None,
    "99999999999999999999": 1e20,  # in the future: read as none
    "0x10": 16,  # far in the past: the backlog bound
    "1.5": 1.5,  # far in the past, floored
    "-5": -5,  # before the epoch: read as none
}
SPOILT_SKIPPED = ("abc", "1e400", "-3", "7")
TAKEN_FIELDS = {"status": "SUCCESSFUL", "payload": "mine"}


class Window(NamedTuple):
    """A time the script stamps with its clock: between the readings around its call."""

    lo: int
    hi: int


def period(schedule: Schedule) -> int:
    return schedule.every_ms or CRON_PERIOD[schedule.cron or ""]


def grid(p: int, after: int, until: int) -> tuple[int, int]:
    """The first multiple of ``p`` after ``after``, and how many lie in (after, until]."""
    first = (after // p + 1) * p
    return first, max(0, (until // p * p - first) // p + 1)


def occurrence_id(name: str, at: int) -> str:
    return f"periodic:{name}:{at}"


def lua_number(raw: str | None) -> float | None:
    """What lib/values.lua's number() reads in a field the scripts or this test wrote."""
    if raw is None:
        return None
    if raw in SPOILT_LAST:
        return SPOILT_LAST[raw]
    if raw in SPOILT_SKIPPED:
        return {"abc": None, "1e400": None}.get(raw, float(raw))
    return int(raw)


def job_options(raw: str) -> dict[str, Any]:
    """lib/new_jobs.lua's job_options: the JSON object, its keys non-empty strings."""
    options = json.loads(raw) if raw else {}
    for name in ("unique", "limit"):
        if not isinstance(options.get(name), str) or not options[name]:
            options.pop(name, None)
    return options


def variants(pick: int) -> tuple[int | None, ...]:
    """Settings from a number: per name, absent or one of its variants."""
    choice = []
    for kinds in POOL.values():
        pick, i = divmod(pick, len(kinds) + 1)
        choice.append(i - 1 if i else None)
    return tuple(choice)


def times(schedule: Schedule | None) -> str | None:
    """When a schedule runs, as a sync stores it (None: no schedule)."""
    return None if schedule is None else schedule.timetable()


def valid_name(name: str) -> bool:
    return name != INVALID
