"""A model-based test of periodic jobs: ``lua/periodic.lua`` driven through ``Broker``
and ``PeriodicStep`` against the suite's real redis-server, step by step, while a
Python model says what every schedule's hash, every job and every queue must hold.

Hypothesis' stateful testing chooses the steps among: syncs of changing settings
(schedules added, removed, or changed: interval, cron expression, catch-up, args, a
unique task with or without a ``unique_for`` window; sometimes with an invalid name),
given to every scheduler or to one only (a rolling deploy: the schedulers' settings
differ); edits of one schedule to another timetable (an interval to another, a cron
expression to another, a cron expression to an interval and back, the same instants
by cron and by interval), made some periods after its last run, given to one
scheduler or to all, and followed at once by a step; a scheduler that syncs its
settings again, old ones included (the timetable in force flips back and forth
between schedulers that disagree); three schedulers that each keep the ``last``
Redis last told them and the ``now`` of their last tick, and either make ``run``
calls from what they know and their own settings (a stale ``last`` or ``now``: they
race; with a job's limits or unique key in its options) or take a whole
``PeriodicStep.step``; pause, resume (of a paused schedule or not), run now (as the
dashboard does, with a unique key, or with an id taken); a job that ends (its unique
key freed, left behind, or kept for a window); time passing; spoilt state (garbage
in ``last`` or ``skipped``, a ``last`` in the future, far in the past or before the
epoch, a schedule key or the names set of another type, a job id taken ahead by a
finished job, a state without ``timetable`` as an older version wrote it); Redis
errors injected before a script runs, a call whose reply is lost after it ran, a
real out-of-memory Redis, and SCRIPT FLUSH.

Every script call goes through a broker whose periodic methods report to the model:
it checks what the caller sends (the occurrences ``Schedule.due`` found, against an
independent count of the multiples of the period, with both catch-ups, batches and
the backlog bound; the skipped count; the next occurrence), applies the call to the
model as the header of periodic.lua describes it, and compares the reply. A call
refused (injected error, OOM) must change nothing; a call whose reply is lost
changes what it would have. After each call: ``last`` of no schedule moved backwards
(a valid one: garbage and future values are spoilt state, reset as documented), a
paused schedule stored no job, a sync left no key of a schedule it removed, and the
jobs a run stored are for occurrences of the timetable in force (what the last sync
stored; a caller with other settings stores none) after the moment it was
registered (the sync that brought it, or for a state lost, the ``last`` its caller
went on from): no edit replays a run from before it, whichever scheduler steps. After
every step the invariants read Redis whole: exactly the keys the model expects, each
with its contents and without a TTL (but finished jobs, and a unique key in its
window); each
stored job once (the arrival counter equals the jobs stored, none rewritten: its
score and ``enqueued_at`` are those of its store); each queue exactly its jobs in
order; ``last_job`` an existing job; and for every "all" schedule in force, every
occurrence from its start (or its last reset: resume, a pass while paused, an edit
or any other change of the schedule in force, a caller's catch-up "latest", spoilt
state, the backlog bound) up to ``last`` has a job,
but those skipped while a job of its unique task held the key (counted in
``skipped``).

How the test controls time
--------------------------
The script reads Redis's clock, which the test cannot move. The schedules are small
(every 1 or 2 s, the shortest interval allowed; cron every minute or two, UTC), so
real time makes a few occurrences due during a run, and the rule ``time_passes``
makes many: it moves
a schedule's ``last`` back by k periods (HSET), as if k periods had passed since the
last step, which is all the script and the scheduler look at (the job model moves
scores to 0 the same way); the moment its timetable was registered moves back with
it. The jobs already stored for occurrences in that span
stay: the script must not store them again (their ids are taken), and store the
others, which a bound shorter than the real one (``BATCH`` and ``MAX_BACKLOG`` are
patched to 4 and 10) turns into batches, then into skipped occurrences. No sleep: a
caller's ``now`` is Redis's clock read before its call (or an older one, for a
stale scheduler), so the occurrences it sends are due whatever the script's clock;
what the script stamps with its own clock (a start, a resume, ``last_at``,
``enqueued_at``) is checked to lie between the clock readings around the call.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple
from unittest import mock

import redis
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    rule,
)

from django_redisqueue import periodic as periodic_module
from django_redisqueue.periodic import (
    COUNT_LIMIT,
    PeriodicStep,
    PeriodicTaskError,
    Schedule,
    run_now,
)
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.wire import NewJob
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

TASK = "tests.tasks.noop_any"
# The settings a sync may declare: per name, its variants (None: not in settings).
POOL: dict[str, tuple[Schedule, ...]] = {
    "beat": (
        Schedule("beat", TASK, every_ms=1000, catch_up="all"),
        Schedule("beat", TASK, every_ms=1000, catch_up="latest"),
        Schedule("beat", TASK, every_ms=2000, args=(1,), catch_up="all"),
        # A unique task (its key by its arguments): its runs never overlap.
        Schedule("beat", "tests.tasks.unique_report", every_ms=1000, args=("x",), catch_up="all"),
        # The same name by cron: another timetable.
        Schedule("beat", TASK, cron="* * * * *", catch_up="all"),
    ),
    "minutely": (
        Schedule("minutely", TASK, cron="* * * * *", catch_up="latest"),
        Schedule("minutely", TASK, cron="* * * * *", catch_up="all"),
        Schedule("minutely", TASK, cron="*/2 * * * *", catch_up="all"),
        # unique="rebuild", unique_for=3600: a window from each enqueue.
        Schedule("minutely", "tests.tasks.rebuild_once_an_hour", cron="* * * * *"),
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
# A job's options (common.lua's job_options), as a scheduler's own call sends them.
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
# common.lua's number(): a finite number or nothing; periodic.lua floors it).
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


class ModelBroker(Broker):
    """A broker whose periodic calls are checked by the model, whoever makes them."""

    model: PeriodicMachine

    def periodic_sync(self, schedules):
        entries = list(schedules)
        return self.model.checked(
            "sync", lambda: Broker.periodic_sync(self, entries), entries=entries
        )

    def periodic_run(self, name, **kwargs):
        return self.model.checked(
            "run", lambda: Broker.periodic_run(self, name, **kwargs), name=name, **kwargs
        )

    def periodic_pause(self, name, paused=True):
        return self.model.checked(
            "pause" if paused else "resume",
            lambda: Broker.periodic_pause(self, name, paused),
            name=name,
        )

    def periodic_run_now(self, name, job, *, record_queues=False):
        return self.model.checked(
            "run_now",
            lambda: Broker.periodic_run_now(self, name, job, record_queues=record_queues),
            name=name,
            job=job,
            record_queues=record_queues,
        )


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
    """What common.lua's number() reads in a field the scripts or this test wrote."""
    if raw is None:
        return None
    if raw in SPOILT_LAST:
        return SPOILT_LAST[raw]
    if raw in SPOILT_SKIPPED:
        return {"abc": None, "1e400": None}.get(raw, float(raw))
    return int(raw)


def job_options(raw: str) -> dict[str, Any]:
    """common.lua's job_options: the JSON object, its keys non-empty strings."""
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


class PeriodicMachine(ModelMachine):
    def __init__(self, env: dict) -> None:
        super().__init__(env)
        self.broker: ModelBroker
        self.broker.model = self
        self.oom = False  # Redis is out of memory (maxmemory 1)
        self.failure: AssertionError | None = None  # a script call that went wrong
        self.rogue = False  # a caller sends occurrences that are not due
        # The model of Redis.
        self.names: set[str] | None = set()  # None: the key is spoilt (a string)
        self.states: dict[str, dict[str, Any] | str] = {}  # a string: spoilt
        self.jobs: dict[str, dict[str, Any]] = {}  # stored by the scripts
        self.ended: set[str] = set()  # among them, those a worker ran (TTL)
        # Unique keys: the job holding each, and whether the key has a TTL (a window).
        self.unique: dict[str, tuple[str, bool]] = {}
        # Per schedule, the occurrences skipped while its unique key was held.
        self.overlapping: dict[str, set[int]] = {}
        self.taken: dict[str, dict[str, str]] = {}  # finished jobs written by hand
        self.queues: dict[str, dict[str, int]] = {}  # queue -> {job id: score}
        self.wakes: set[str] = set()
        self.known_queues: set[str] = set()
        # Limit keys' rate windows (common.lua's rate_window): the largest rate and the
        # longest period of the jobs with a rate stored; they expire.
        self.windows: dict[str, tuple[int, int]] = {}
        self.seq = 0
        # Each scheduler's settings (a rolling deploy gives some of them new ones), the
        # scheduler making the call in hand, per name the schedule of the sync Redis
        # holds (the one in force) and when its timetable was registered, and per "all"
        # schedule the start of the span (base, last] in which every occurrence has a job.
        self.settings: list[dict[str, Schedule]] = [{} for _ in range(SCHEDULERS)]
        self.caller = 0
        self.in_force: dict[str, Schedule] = {}
        self.registered: dict[str, int] = {}
        self.steppers = [PeriodicStep(self.backend) for _ in range(SCHEDULERS)]
        self.ticks: list[int | None] = [None] * SCHEDULERS
        self.base: dict[str, int] = {}
        self.reset: set[str] = set()  # names whose base is their new last, once settled

    # Redis's clock.

    def tick(self, s: int, fresh: bool) -> int:
        """Scheduler ``s``'s now: Redis's clock, or the one of its previous tick."""
        now = self.ticks[s]
        if fresh or now is None:
            now = self.ticks[s] = self.clock()
        else:
            RUN["stale nows"] += 1
        return now

    # The model's reads.

    def schedule_of(self, name: str, s: int | None = None) -> Schedule:
        """The schedule scheduler ``s`` (by default, the caller) uses: of its settings,
        or of older settings."""
        settings = self.settings[self.caller if s is None else s]
        if name in settings:
            return settings[name]
        if name in POOL:
            return POOL[name][0]
        return Schedule(name, TASK, every_ms=1000)

    def in_force_or_any(self, name: str) -> Schedule:
        """The schedule in force, or else the one of the first scheduler's settings."""
        return self.in_force.get(name) or self.schedule_of(name, 0)

    def state(self, name: str) -> dict[str, Any] | None:
        state = self.states.get(name)
        return state if isinstance(state, dict) else None

    def valid_last(self, name: str, clock: int) -> int | None:
        """The schedule's ``last`` as the script reads it (read_last)."""
        state = self.state(name)
        value = lua_number(state.get("last")) if state else None
        if value is None or value < 0 or value > clock:
            return None
        return int(value // 1)

    def exists(self, job_id: str) -> bool:
        return job_id in self.jobs or job_id in self.taken

    # The model's moves, as periodic.lua makes them.

    def m_names(self) -> set[str]:
        if self.names is None:  # another type: deleted, rebuilt by what follows
            self.names = set()
        return self.names

    def m_state_key(self, name: str) -> dict[str, Any]:
        if isinstance(self.states.get(name), str):
            del self.states[name]
            self.forget(name)
        return self.states.setdefault(name, {})

    def forget(self, name: str) -> None:
        """A schedule's state is gone: what the model knew of it goes with it."""
        for known in (self.base, self.in_force, self.registered):
            known.pop(name, None)

    def m_store(self, job_id: str, payload: str, queue: str, priority: int, options: dict):
        """store_job, and hold_unique for a unique task's job."""
        self.seq += 1
        p = min(max(priority, -100), 100)
        score = (100 - p) * 17592186044416 + self.seq
        job = self.jobs[job_id] = {
            "payload": payload,
            "queue": queue,
            "priority": str(priority),
            "enqueued_at": self.window,
            "status": "READY",
            "score": str(score),
        }
        if "limit" in options:
            job["limit"] = options["limit"]
            if "max_running" in options:
                job["max_running"] = str(options["max_running"])
            if "rate" in options and "per" in options:
                job["rate"] = f"{options['rate']}/{options['per']}"
                starts, ms = self.windows.get(options["limit"], (0, 0))
                window = (max(starts, options["rate"]), max(ms, options["per"]))
                self.windows[options["limit"]] = window
        if "unique" in options:
            self.unique[options["unique"]] = (job_id, False)
            job["unique"] = options["unique"]
            window_ms = options.get("unique_ms", 0)
            if window_ms > 0:
                job["unique_until"] = Window(
                    self.window.lo + window_ms, self.window.hi + window_ms
                )
        self.queues.setdefault(queue, {})[job_id] = score
        self.wakes.add(queue)

    def unique_holder(self, options: dict) -> str | None:
        """common.lua's unique_holder: the job holding the task's key, if any."""
        if "unique" not in options or options["unique"] not in self.unique:
            return None
        holder, window = self.unique[options["unique"]]
        if holder not in self.jobs:
            return None
        return holder if window or holder not in self.ended else None

    def apply_sync(self, entries: list[tuple[str, str, str, int]]) -> Callable[[], Any]:
        names = self.m_names()
        given: list[str | None] = []
        edited: list[str] = []
        for name, spec, timetable, next_ms in entries:
            if not valid_name(name):
                given.append(None)
                continue
            last = self.valid_last(name, self.window.lo)
            state = self.m_state_key(name)
            schedule = BY_SPEC[name, spec]
            assert timetable == times(schedule)
            held = state.get("timetable")
            if held is None and state.get("spec") == spec:  # of before, the same spec
                held = timetable
                RUN["states of before adopted"] += 1
            if last is not None and held != timetable:  # edited (or of before): from now
                last = None
                if held is not None:
                    edited.append(name)
                RUN["syncs of another timetable"] += 1
            if last is None:  # its timetable registered now
                self.registered[name] = self.window.lo
            if last is None or schedule != self.in_force.get(name):  # a span starts again
                self.base.pop(name, None)
                self.reset.add(name)
            self.in_force[name] = schedule
            state.update(
                last=str(last) if last is not None else self.window,
                spec=spec,
                timetable=timetable,
                next=str(next_ms),
            )
            names.add(name)
            given.append(name)
        removed = sorted(names - set(n for n in given if n))
        for name in removed:
            self.states.pop(name, None)
            self.forget(name)
            names.discard(name)

        def reply():
            lasts = [int(self.states[n]["last"]) if n else None for n in given]
            return lasts, removed, edited

        return reply

    def apply_run(
        self,
        name: str,
        *,
        timetable: str,
        expected_last: int | None,
        now_ms: int,
        next_ms: int,
        skipped: int,
        queue: str,
        priority: int,
        payload: str,
        jobs: list[tuple[int, str]],
        record_queues: bool = False,
        options: str = "",
    ) -> Callable[[], Any]:
        if not valid_name(name):
            return lambda: ("invalid", 0, 0, "")
        clock = self.window.lo
        assert now_ms <= clock  # a caller's now is Redis's clock, read before
        state = self.m_state_key(name)
        self.m_names().add(name)
        last = self.valid_last(name, clock)
        held = state.get("timetable")
        if held != timetable and (held is not None or last is not None):
            # Not the timetable in force (or none, beside a last): the caller's settings
            # are not those of the last sync.
            return lambda: ("edited", last or 0, 0, "")
        if last is None:  # from the last the caller knew (its state was lost), or now
            last = now_ms
            if expected_last is not None and expected_last >= 0:
                assert expected_last <= clock  # a last Redis answered before
                last = expected_last
                RUN["runs going on from a lost state"] += 1
            state.update(last=str(last), next=str(next_ms), timetable=timetable)
            self.base[name] = self.registered[name] = last
            self.in_force[name] = self.schedule_of(name)
            return lambda: ("new", last, 0, "")
        if expected_last != last:
            return lambda: ("stale", last, 0, "")
        if "paused" in state:
            last = max(last, now_ms)
            state.update(last=str(last), next=str(next_ms))
            self.base[name] = last
            return lambda: ("paused", last, 0, "")
        stored, last_job, missed = 0, "", skipped
        opts = job_options(options)
        RUN["calls with occurrences"] += bool(jobs)
        for at, job_id in jobs:
            # Not due: ahead of Redis's clock (a rogue caller's, an hour ahead; a due one
            # is at or before its now, read before the call: the script must take it).
            if at > self.window.hi:
                continue
            assert at <= clock
            if at > last:
                if self.unique_holder(opts):  # runs of a unique task never overlap
                    missed += 1
                    self.overlapping.setdefault(name, set()).add(at)
                    RUN["runs skipped: unique key held"] += 1
                elif not self.exists(job_id):
                    self.m_store(job_id, payload, queue, priority, opts)
                    stored, last_job = stored + 1, job_id
                    RUN["occurrences stored"] += 1
                else:
                    RUN["occurrences already taken"] += 1
                last = at
        state.update(last=str(last), next=str(next_ms))
        if stored:
            if record_queues:
                self.known_queues.add(queue)
            state.update(last_job=last_job, last_at=self.window)
        if missed > 0:
            total = (lua_number(state.get("skipped")) or 0) + missed
            state["skipped"] = f"{total:.0f}"
        if skipped and jobs and name in self.base:  # older ones were skipped: the bound
            self.base[name] = max(self.base[name], jobs[0][0] - 1)
        if self.schedule_of(name).catch_up == "latest":
            self.base[name] = last
        return lambda: ("ok", last, stored, last_job)

    def apply_pause(self, name: str) -> Callable[[], Any]:
        if valid_name(name):
            self.m_state_key(name)["paused"] = "1"
            self.m_names().add(name)
        return lambda: None

    def apply_resume(self, name: str) -> Callable[[], Any]:
        if valid_name(name):
            state = self.m_state_key(name)
            self.m_names().add(name)
            if state.pop("paused", None) is not None:  # from now: the pause not caught up
                state["last"] = self.window
                self.reset.add(name)
            if not state:
                del self.states[name]
        return lambda: None

    def apply_run_now(self, name: str, job: NewJob, record_queues: bool) -> Callable[[], Any]:
        if not valid_name(name):
            return lambda: None
        state = self.m_state_key(name)
        self.m_names().add(name)
        opts = job_options(job.options)
        holder = None if self.exists(job.job_id) else self.unique_holder(opts)
        if self.exists(job.job_id) or holder:
            RUN["run now refused: " + ("id taken" if holder is None else "unique key held")] += 1
            if not state:
                del self.states[name]
            return lambda: holder
        self.m_store(job.job_id, job.payload, job.queue, job.priority, opts)
        if record_queues:
            self.known_queues.add(job.queue)
        state.update(last_job=job.job_id, last_at=self.window)
        return lambda: int(state["last_at"])

    def settle(self) -> None:
        """The times the script stamped: in the window of its call; adopted."""
        window = self.window
        for name, state in self.states.items():
            if isinstance(state, dict):
                for field, value in state.items():
                    if isinstance(value, Window):
                        stamped = self.r.hget(self.keys.periodic_schedule(name), field)
                        assert stamped is not None and value.lo <= int(stamped) <= value.hi
                        state[field] = stamped
        for job_id, job in self.jobs.items():
            for field, value in job.items():
                if isinstance(value, Window):
                    stamped = self.r.hget(self.keys.job_prefix + job_id, field)
                    assert stamped is not None and value.lo <= int(stamped) <= value.hi
                    job[field] = stamped
        for name in self.reset:
            last = self.valid_last(name, window.hi)
            if last is not None:
                self.base[name] = last
        self.reset.clear()

    # The oracle of what a caller sends.

    def check_due(self, name: str, kw: dict[str, Any]) -> None:
        """The occurrences, skipped count and next occurrence a scheduler sends for
        what it knows (``expected_last``, ``now_ms``), counted independently."""
        schedule = self.schedule_of(name)
        p, now, last = period(schedule), kw["now_ms"], kw["expected_last"]
        cron = schedule.cron is not None
        jobs = [at for at, _ in kw["jobs"]]
        assert [job_id for _, job_id in kw["jobs"]] == [occurrence_id(name, at) for at in jobs]
        assert kw["timetable"] == times(schedule)
        if last is None:
            assert jobs == [] and kw["skipped"] == 0
            assert kw["next_ms"] == grid(p, now, now)[0]
            return
        first, n = grid(p, last, now)
        after = max(now, last)
        if schedule.catch_up == "latest":
            want = [first + (n - 1) * p] if n else []
            skipped = min(n, COUNT_LIMIT if cron else n) - 1 if n else 0
            more = False
        elif n > MAX_BACKLOG:
            start = first + (n - MAX_BACKLOG) * p
            want = [start + i * p for i in range(BATCH)]
            skipped = min(n - MAX_BACKLOG + 1, COUNT_LIMIT if cron else n) - 1
            more = True
            RUN["backlog bound"] += 1
        else:
            want = [first + i * p for i in range(min(n, BATCH))]
            skipped = 0
            more = n > BATCH
        assert jobs == want, (name, last, now, jobs, want)
        assert kw["skipped"] == skipped, (kw["skipped"], skipped)
        assert kw["next_ms"] == (want[-1] + p if more else grid(p, after, after)[0])

    # Every script call, checked.

    def redis_lasts(self, clock: int) -> dict[str, int]:
        """The valid ``last`` of every schedule hash Redis holds (read directly)."""
        found = {}
        for name in POOL:
            key = self.keys.periodic_schedule(name)
            if self.r.type(key) == "hash":
                value = lua_number(self.r.hget(key, "last"))
                if value is not None and 0 <= value <= clock:
                    found[name] = int(value // 1)
        return found

    def checked(self, mode: str, call: Callable[[], Any], **kw: Any) -> Any:
        """A script call, checked; a mismatch is kept for the invariants too, as a
        PeriodicStep logs what one schedule raises and goes on with the others."""
        try:
            return self.checked_call(mode, call, **kw)
        except AssertionError as exc:
            self.failure = self.failure or exc
            raise

    def checked_call(self, mode: str, call: Callable[[], Any], **kw: Any) -> Any:
        if mode == "run" and valid_name(kw["name"]) and not self.rogue:
            self.check_due(kw["name"], kw)
        refused = self.client.fault is not None
        losing = self.client.lose_reply is not None
        before = snapshot(self.r)
        t0 = self.clock()
        lasts = self.redis_lasts(t0)
        names_before = None if self.names is None else set(self.names)
        paused = mode == "run" and "paused" in (self.state(kw["name"]) or {})
        seq = self.seq
        try:
            reply = call()
        except redis.RedisError as exc:
            oom = self.oom and "maxmemory" in str(exc)
            if refused or oom:  # refused whole, before its first write
                assert snapshot(self.r) == before
                RUN["refused calls"] += 1
                raise
            assert losing, exc
            self.window = Window(t0, self.clock())
            self.apply(mode, kw)
            self.settle()
            RUN["lost replies"] += 1
            self.after_call(mode, kw, lasts, names_before, paused, seq, before)
            raise
        self.window = Window(t0, self.clock())
        expected = self.apply(mode, kw)
        self.settle()
        got = reply
        if mode == "run":
            got = (reply.status, reply.last, reply.enqueued, reply.last_job)
            RUN[f"run: {reply.status}"] += 1
        elif mode == "sync":
            got = (reply[0], sorted(reply[1]), reply[2])
            RUN["syncs"] += 1
        else:
            RUN[mode] += 1
        assert got == expected(), (mode, got, expected())
        self.after_call(mode, kw, lasts, names_before, paused, seq, before)
        return reply

    def apply(self, mode: str, kw: dict[str, Any]) -> Callable[[], Any]:
        if mode == "sync":
            return self.apply_sync(kw["entries"])
        if mode == "run":
            args = dict(kw)
            return self.apply_run(args.pop("name"), **args)
        if mode == "run_now":
            return self.apply_run_now(kw["name"], kw["job"], kw["record_queues"])
        return getattr(self, f"apply_{mode}")(kw["name"])

    def after_call(self, mode, kw, lasts, names_before, paused, seq, before) -> None:
        """What holds after any call, read from Redis: no valid ``last`` went back, a
        paused schedule stored nothing, a sync left no key of what it removed, and a
        run stored only occurrences of the timetable in force after it was registered."""
        if mode == "run" and kw["name"] in self.registered:
            self.stored_for_the_timetable_in_force(kw["name"], kw["jobs"], before)
        clock = self.clock()
        now = self.redis_lasts(clock)
        for name, last in lasts.items():
            assert now.get(name, last) >= last, (mode, name, last, now.get(name))
            if name not in now:  # its state is gone: a sync removed it
                assert mode == "sync" and name not in [e[0] for e in kw["entries"]]
        if paused:
            assert self.seq == seq and int(self.r.get(self.keys.seq) or 0) == seq
            RUN["calls on paused schedules"] += 1
        if mode == "sync" and names_before is not None:
            given = {entry[0] for entry in kw["entries"]}
            for name in names_before - given:
                assert not self.r.exists(self.keys.periodic_schedule(name))
                RUN["schedules removed"] += 1

    def stored_for_the_timetable_in_force(
        self, name: str, jobs: list[tuple[int, str]], before: dict[str, object]
    ) -> None:
        """The jobs a run stored (read from Redis: of the ids it sent, those it made)
        are for occurrences of the timetable in force, after it was registered: an edit
        replays nothing, and a scheduler with other settings enqueues none of its own."""
        schedule, registered = self.in_force[name], self.registered[name]
        keys = [self.keys.job_prefix + job_id for _, job_id in jobs]
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        for (at, _), key, exists in zip(jobs, keys, pipe.execute(), strict=True):
            if not exists or key in before:
                continue
            assert at > registered, (name, at, "before", registered, schedule)
            assert at % period(schedule) == 0, (name, at, "not of", schedule)
            RUN["occurrences after their timetable's registration"] += 1

    # Steps

    @initialize(choice=st.tuples(*[st.integers(0, len(v) - 1) for v in POOL.values()]))
    def start(self, choice):
        self.op_sync(tuple(choice), 0, True, False)

    def op_sync(
        self,
        choice: tuple[int | None, ...],
        s: int,
        via_step: bool,
        invalid: bool,
        everyone: bool = True,
    ):
        """New settings (each name absent or one of its variants) for every scheduler,
        or for scheduler ``s`` only (a rolling deploy), synced by ``s``."""
        new = {name: POOL[name][i] for name, i in zip(POOL, choice, strict=True) if i is not None}
        for t in range(SCHEDULERS) if everyone else [s]:
            self.settings[t] = new
            self.steppers[t].schedules = list(new.values())
        self.op_resync(s, via_step, invalid)

    def op_resync(self, s: int, via_step: bool, invalid: bool = False):
        """Scheduler ``s`` syncs its settings: new ones, or those of before (a
        scheduler not yet deployed, syncing as it does every minute)."""
        self.caller = s
        if via_step:
            self.steppers[s].sync(self.clock(), 0.0)
        else:
            now = self.clock()
            entries = [
                (x.name, x.spec(), x.timetable(), x.next_after(now))
                for x in self.settings[s].values()
            ]
            if invalid:
                entries.insert(len(entries) // 2, (INVALID, "{}", "every 1000 ms", now))
            self.broker.periodic_sync(entries)

    def op_call(
        self,
        s: int,
        name: str,
        fresh: bool,
        record: bool,
        options: str,
        tries: int = 1,
        rogue: bool = False,
    ):
        """Scheduler ``s`` calls for ``name`` from what it knows, and again from what
        Redis answered while it answers "stale", ``tries`` calls at most. A ``rogue``
        one also sends an occurrence at or before the ``last`` it knows and one an
        hour ahead, which the script must pass over."""
        step = self.steppers[s]
        now = self.tick(s, fresh)
        self.caller = s
        schedule = self.schedule_of(name)
        for _ in range(tries):
            last = step.last.get(name)
            due = schedule.due(last, now) if last is not None else periodic_module.Due([], 0, 0)
            occurrences = due.occurrences
            if rogue and last is not None:
                p = period(schedule)
                occurrences = [last // p * p, *occurrences, (now + FAR) // p * p]
                RUN["rogue calls"] += 1
            queue, priority = CALL_QUEUE[name]
            self.rogue = rogue
            reply = self.broker.periodic_run(
                name,
                timetable=schedule.timetable(),
                expected_last=last,
                now_ms=now,
                next_ms=due.next_ms or schedule.next_after(now),
                skipped=due.skipped,
                queue=queue,
                priority=priority,
                payload=self.payload,
                jobs=[(at, occurrence_id(name, at)) for at in occurrences],
                record_queues=record,
                options=options,
            )
            self.rogue = False
            step.last[name] = None if reply.status == "edited" else reply.last
            if reply.status != "stale":
                break

    def op_step(self, s: int, fresh: bool, forget: bool, again: int = 0):
        """Scheduler ``s`` takes a whole step (``forget``: its next occurrences
        forgotten, as after a restart without a sync), and up to ``again`` more at
        once while it says a backlog remains (its loop's "step again at once")."""
        step = self.steppers[s]
        if forget:
            step.next.clear()
        now = self.tick(s, fresh)
        self.caller = s
        wait = step.step(now)
        for _ in range(again):
            if wait != 0:
                break
            RUN["steps again at once"] += 1
            wait = step.step(now)

    def op_pause(self, name: str, paused: bool):
        self.broker.periodic_pause(name, paused)

    def op_run_now(self, name: str, taken: int | None, record: bool, options: str = ""):
        """Run now: as the dashboard does (``options`` ''), or a job with ``options``
        and a fresh id, or one with an id taken (a job of the model)."""
        if taken is not None and (self.jobs or self.taken):
            ids = sorted(self.jobs) + sorted(self.taken)
            job = NewJob(ids[taken % len(ids)], "default", 0, self.payload)
            assert self.broker.periodic_run_now(name, job, record_queues=record) is None
        elif options:
            job = NewJob(self.ids.new_job_id(), "default", 0, self.payload, options=options)
            self.broker.periodic_run_now(name, job, record_queues=record)
        else:
            try:
                run_now(self.backend, self.schedule_of(name, 0))  # backend.broker: the model's
            except PeriodicTaskError as exc:
                assert "is unique" in str(exc)

    @rule(
        s=st.integers(0, SCHEDULERS - 1),
        name=NAME,
        fresh=st.booleans(),
        record=st.booleans(),
        options=st.sampled_from(list(OPTIONS)),
        tries=st.integers(1, 3),
        rogue=st.sampled_from([False, False, False, True]),
    )
    def scheduler_call(self, s, name, fresh, record, options, tries, rogue):
        self.op_call(s, name, fresh, record, options, tries, rogue)

    @rule(
        s=st.integers(0, SCHEDULERS - 1),
        fresh=st.booleans(),
        forget=st.booleans(),
        again=st.sampled_from([0, 0, 3]),
    )
    def scheduler_step(self, s, fresh, forget, again):
        self.op_step(s, fresh, forget, again)

    @rule(
        choice=SETTINGS,
        s=st.integers(0, SCHEDULERS - 1),
        via_step=st.booleans(),
        invalid=st.booleans(),
        everyone=st.sampled_from([True, True, False]),
    )
    def sync(self, choice, s, via_step, invalid, everyone):
        self.op_sync(choice, s, via_step, invalid, everyone)

    @rule(
        name=st.sampled_from(list(POOL)),
        pick=st.integers(0, 1 << 16),
        s=st.integers(0, SCHEDULERS - 1),
        everyone=st.booleans(),
        back=st.sampled_from([0, 1, 10]),
        then=st.sampled_from([None, *range(SCHEDULERS)]),
    )
    def edit(self, name, pick, s, everyone, back, then):
        """A schedule edited: scheduler ``s`` (or every one) gets another variant of it,
        of another timetable if one is left, ``back`` periods after its last run, and
        syncs; ``then`` a scheduler (if any) steps at once."""
        settings = dict(self.settings[s])
        current = self.in_force.get(name) or settings.get(name)
        others = [x for x in POOL[name] if times(x) != times(current)]
        others = others or [x for x in POOL[name] if x != current]
        settings[name] = others[pick % len(others)]
        if back:
            self.op_time_passes(name, back)
        choice = tuple(POOL[n].index(settings[n]) if n in settings else None for n in POOL)
        RUN["edits"] += 1
        self.op_sync(choice, s, bool(pick % 2), False, everyone)
        if then is not None:
            self.op_step(then, True, True, 3)

    @rule(
        s=st.integers(0, SCHEDULERS - 1),
        via_step=st.booleans(),
        then=st.sampled_from([None, *range(SCHEDULERS)]),
    )
    def resync(self, s, via_step, then):
        """Scheduler ``s`` syncs its settings again, as it does every minute: those of
        before if a rolling deploy has not reached it yet (they are in force again);
        ``then`` a scheduler (if any) steps at once."""
        RUN["syncs again"] += 1
        self.op_resync(s, via_step)
        if then is not None:
            self.op_step(then, True, True, 3)

    @rule(name=NAME, paused=st.sampled_from([True, True, False]))
    def pause_or_resume(self, name, paused):
        self.op_pause(name, paused)

    @rule(
        name=NAME,
        taken=st.none() | st.integers(0, 1 << 16),
        record=st.booleans(),
        options=st.sampled_from(["", "", *OPTIONS[1:]]),
    )
    def run_now(self, name, taken, record, options):
        self.op_run_now(name, taken, record, options)

    @rule(pick=st.integers(0, 1 << 16), key=st.sampled_from(["freed", "kept", "window"]))
    def job_ends(self, pick, key):
        """A worker ran a job: it leaves its queue, SUCCESSFUL, with the result TTL.
        Its unique key, if it holds one, is freed (a task without a window), kept
        pointing at it (a key left by hand: its job ended, so it holds nothing), or
        kept with a TTL (a ``unique_for`` window that lasts: it still holds)."""
        ready = sorted(set(self.jobs) - self.ended)
        if not ready:
            return
        job_id = ready[pick % len(ready)]
        job = self.jobs[job_id]
        job_key = self.keys.job_prefix + job_id
        self.r.hset(job_key, "status", "SUCCESSFUL")
        self.r.expire(job_key, RESULT_TTL)
        self.r.zrem(self.keys.queue_prefix + job["queue"], job_id)
        job["status"] = "SUCCESSFUL"
        self.ended.add(job_id)
        del self.queues[job["queue"]][job_id]
        unique = job.get("unique")
        if unique and self.unique.get(unique, ("",))[0] == job_id:
            unique_key = f"{self.keys.prefix}:unique:{unique}"
            if key == "freed":
                self.r.delete(unique_key)
                del self.unique[unique]
            elif key == "window":
                self.r.expire(unique_key, FAR // 1000)
                self.unique[unique] = (job_id, True)
            RUN[f"unique keys {key}"] += 1
        RUN["jobs ended"] += 1

    @rule(
        name=st.sampled_from(list(POOL)),
        k=st.sampled_from([1, 1, 2, 3, 5, 12, 40]),
        then=st.sampled_from([None, *range(SCHEDULERS)]),
    )
    def time_passes(self, name, k, then):
        """k periods pass for a schedule; and ``then`` a scheduler (if any) calls for
        it at once, until not stale."""
        if self.op_time_passes(name, k) and then is not None:
            self.op_call(then, name, True, False, "", tries=3)

    def op_time_passes(self, name: str, k: int) -> bool:
        """k periods of the timetable in force pass for a schedule: its ``last`` moves
        back by k periods, and so does the time its timetable was registered."""
        last = self.valid_last(name, self.clock())
        if last is None:
            return False
        shift = k * period(self.in_force_or_any(name))
        last -= shift
        self.r.hset(self.keys.periodic_schedule(name), "last", last)
        self.states[name]["last"] = str(last)
        if name in self.base:
            self.base[name] = min(self.base[name], last)
        if name in self.registered:
            self.registered[name] -= shift
        RUN["time passed"] += 1
        return True

    @rule(
        name=st.sampled_from(list(POOL)),
        how=st.sampled_from(
            ["last", "future", "skipped", "wrong type", "names set", "taken", "taken", "of before"]
        ),
        pick=st.integers(0, 1 << 16),
    )
    def spoil(self, name, how, pick):
        """State spoilt by hand (or by a bug of an older version), or written by an
        older version (``of before``: no timetable)."""
        key = self.keys.periodic_schedule(name)
        state = self.state(name)
        if how == "of before" and state is not None and "timetable" in state:
            self.r.hdel(key, "timetable")
            del state["timetable"]
            RUN["states of an older version"] += 1
        elif how in ("last", "future", "skipped") and state is not None:
            if how == "skipped":
                value = SPOILT_SKIPPED[pick % len(SPOILT_SKIPPED)]
                self.r.hset(key, "skipped", value)
                state["skipped"] = value
                return
            if how == "future":
                value = str(self.clock() + FAR)
            else:
                value = list(SPOILT_LAST)[pick % len(SPOILT_LAST)]
            self.r.hset(key, "last", value)
            state["last"] = value
            last = self.valid_last(name, self.clock())
            if last is None:
                self.base.pop(name, None)
            else:  # by hand far in the past: runs of before may be enqueued, as it says
                for known in (self.base, self.registered):
                    if name in known:
                        known[name] = min(known[name], last)
            RUN["spoilt"] += 1
        elif how == "wrong type" and (name in self.states or name in (self.names or ())):
            self.r.delete(key)
            self.r.set(key, "spoilt")
            self.states[name] = "spoilt"
            self.forget(name)
            RUN["spoilt"] += 1
        elif how == "names set" and self.names is not None:
            self.r.delete(self.keys.periodic)
            self.r.set(self.keys.periodic, "spoilt")
            self.names = None
            RUN["spoilt"] += 1
        elif how == "taken":
            last = self.valid_last(name, self.clock())
            if last is None:
                return
            p = period(self.in_force_or_any(name))
            at = grid(p, last, last)[0] + (pick % 3) * p
            job_id = occurrence_id(name, at)
            if not self.exists(job_id):
                self.r.hset(self.keys.job_prefix + job_id, mapping=TAKEN_FIELDS)
                self.r.expire(self.keys.job_prefix + job_id, RESULT_TTL)
                self.taken[job_id] = dict(TAKEN_FIELDS)
                RUN["ids taken ahead"] += 1

    @rule(
        trouble=st.sampled_from(["lost reply", "out of memory", "script flush", *INJECTED]),
        operation=st.integers(0, 5),
        s=st.integers(0, SCHEDULERS - 1),
        name=st.sampled_from(list(POOL)),
        pick=st.integers(0, 1 << 16),
    )
    def redis_trouble(self, trouble, operation, s, name, pick):
        """A Redis error before the next script call (nothing changes), its reply lost
        after it ran (the model moves, the caller does not learn), a real OOM
        (maxmemory below what is used: a script is refused before its first write, or
        runs whole), or SCRIPT FLUSH (the broker loads its scripts again)."""
        if trouble == "script flush":
            self.r.script_flush()
            return
        ops: list[Callable[[], Any]] = [
            lambda: self.op_call(s, name, bool(pick % 2), False, ""),
            lambda: self.op_step(s, bool(pick % 2), True),
            lambda: self.op_sync(variants(pick), s, bool(pick % 2), False),
            lambda: self.op_pause(name, True),
            lambda: self.op_pause(name, False),
            lambda: self.op_run_now(name, None, False),
        ]
        if trouble == "out of memory":
            self.r.config_set("maxmemory", 1)
            self.oom = True
            try:
                ops[operation]()
            except redis.exceptions.ResponseError as exc:
                assert "maxmemory" in str(exc), exc
                RUN["refused when out of memory"] += 1
            finally:
                self.oom = False
                self.r.config_set("maxmemory", 0)
            return
        exc = INJECTED["connection"]() if trouble == "lost reply" else INJECTED[trouble]()
        if trouble == "lost reply":
            self.client.lose_reply = exc
        else:
            self.client.fault = exc
        try:
            with contextlib.suppress(type(exc)):
                ops[operation]()
        finally:
            self.client.fault = self.client.lose_reply = None  # not used: no call made

    # Invariants

    def expected_keys(self) -> dict[str, object]:
        keys = self.keys
        want: dict[str, object] = {}
        if self.names is None:
            want[keys.periodic] = ("string", "spoilt", False)
        elif self.names:
            want[keys.periodic] = ("set", sorted(self.names), False)
        for name, state in self.states.items():
            if isinstance(state, str):
                want[keys.periodic_schedule(name)] = ("string", state, False)
            else:
                want[keys.periodic_schedule(name)] = ("hash", state, False)
        for job_id, job in self.jobs.items():
            want[keys.job_prefix + job_id] = ("hash", job, job_id in self.ended)
        for unique, (holder, window) in self.unique.items():
            want[f"{keys.prefix}:unique:{unique}"] = ("string", holder, window)
        for key, (starts, ms) in self.windows.items():
            record = {"starts": str(starts), "ms": str(ms)}
            want[keys.limit(key, "window")] = ("hash", record, True)
        for job_id, job in self.taken.items():
            want[keys.job_prefix + job_id] = ("hash", job, True)
        for queue, members in self.queues.items():
            if not members:
                continue
            order = sorted(members.items(), key=lambda item: (item[1], item[0]))
            want[keys.queue_prefix + queue] = ("zset", [(i, float(s)) for i, s in order], False)
        for queue in self.wakes:
            want[keys.wake_prefix + queue] = ("list", ["1"], False)
        if self.known_queues:
            want[keys.known_queues] = ("set", sorted(self.known_queues), False)
        if self.seq:
            want[keys.seq] = ("string", str(self.seq), False)
        return want

    @invariant()
    def redis_holds_the_model(self):
        """Every key, its contents, and no TTL but on finished jobs and on a unique key
        in its window."""
        assert self.failure is None, self.failure
        RUN["checks"] += 1
        STATES.add(hash(self.abstract_state()))
        got = snapshot(self.r)
        want = self.expected_keys()
        assert got.keys() == want.keys(), (
            sorted(got.keys() - want.keys()),
            sorted(want.keys() - got.keys()),
        )
        for key, value in want.items():
            assert got[key] == value, (key, got[key], value)

    @invariant()
    def each_occurrence_once_and_none_missed(self):
        """One store per job (the arrival counter); every last job exists; and every
        occurrence of an "all" schedule in force in (base, last] has a job, but those
        skipped while a job of its unique task held the key."""
        assert self.seq == len(self.jobs)
        for state in self.states.values():
            if isinstance(state, dict) and "last_job" in state:
                assert self.exists(state["last_job"])
        clock = self.clock()
        for name, schedule in self.in_force.items():
            last = self.valid_last(name, clock)
            if schedule.catch_up != "all" or last is None or name not in self.base:
                continue
            p = period(schedule)
            first, n = grid(p, self.base[name], last)
            assert n <= 10_000, (name, self.base[name], last)
            overlapping = self.overlapping.get(name, set())
            missed = [
                at
                for at in range(first, first + n * p, p)
                if not self.exists(occurrence_id(name, at)) and at not in overlapping
            ]
            assert not missed, (name, self.base[name], last, missed)
            RUN["occurrences checked"] += n

    def abstract_state(self) -> tuple:
        return (
            tuple(
                tuple((name, POOL[name].index(x)) for name, x in sorted(settings.items()))
                for settings in [self.in_force, *self.settings]
            ),
            tuple(
                (n, s if isinstance(s, str) else tuple(sorted(k for k in s if k != "last")))
                for n, s in sorted(self.states.items())
            ),
            None if self.names is None else tuple(sorted(self.names)),
            min(len(self.jobs), 20),
            len(self.taken),
        )


# About a minute on two cores; REDISQUEUE_PERIODIC_EXAMPLES=2000 for a long local run.
EXAMPLES = int(os.environ.get("REDISQUEUE_PERIODIC_EXAMPLES", "250"))


def test_periodic_jobs_follow_their_model(r, redis_server, backend, report):
    def make_broker(client: FaultyRedis) -> ModelBroker:
        return ModelBroker(client, backend.keys, lease=60, result_ttl=RESULT_TTL)

    env = model_env(r, backend, redis_server.url, make_broker, tasks.noop_any)
    seconds = run_model(
        PeriodicMachine,
        env,
        examples=EXAMPLES,
        steps=40,
        patches=[
            mock.patch.object(periodic_module, "BATCH", BATCH),
            mock.patch.object(periodic_module, "MAX_BACKLOG", MAX_BACKLOG),
            mock.patch.object(backend, "broker", env["broker"]),
        ],
    )
    steps = RUN["checks"] - RUN["examples"]
    counted = ", ".join(
        f"{RUN[name]} {name}" for name in sorted(RUN) if name not in ("checks", "examples")
    )
    report(
        f"periodic model: {steps} steps in {RUN['examples']} sequences, {len(STATES)} "
        f"distinct states, {seconds:.1f} s ({counted})"
    )
