"""The periodic model's reads and moves: what Redis holds for each schedule and job as
periodic.lua changes it (sync, run, pause, resume, run now), and the times the script
stamped with its own clock, read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_redisqueue.core.schedules import Schedule
from django_redisqueue.store.wire import NewJob
from tests.support.model.harness import RUN
from tests.support.model.periodic.schedules import (
    BY_SPEC,
    POOL,
    TASK,
    Window,
    job_options,
    lua_number,
    times,
    valid_name,
)


class PeriodicModel:
    """The moves of what PeriodicMachine (machine.py) keeps, as periodic.lua makes them."""

    # Redis's clock, as each scheduler last read it.

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
        self.seq += 2  # the counter's pair: a hash takes its even place
        p = min(max(priority, -100), 100)
        score = (100 - p) * 17592186044416 + self.seq
        # A waiting job's hash: no score (its queue holds it), no priority when 0.
        job = self.jobs[job_id] = {
            "payload": payload,
            "queue": queue,
            "enqueued_at": self.window,
            "status": "READY",
        }
        if priority:
            job["priority"] = str(priority)
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
        """lib/unique.lua's unique_holder: the job holding the task's key, if any."""
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
        # The occurrences the script may take: after the last, and due (a rogue caller
        # also sends one at or before the last, which the script must refuse).
        takeable = [at for at, _ in jobs if last < at <= self.window.hi]
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
        if skipped and takeable and name in self.base:  # older ones were skipped: the bound
            self.base[name] = max(self.base[name], min(takeable) - 1)
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
