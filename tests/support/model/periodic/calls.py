"""Every periodic script call of the periodic model, checked, whoever makes it (a
step's own call, or PeriodicStep's, run_now's): what a caller sends against an
independent count of the occurrences due, the reply against the model's move, a call
refused or whose reply is lost, and what holds after any call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from django_redisqueue.core.schedules import COUNT_LIMIT
from django_redisqueue.store.broker import Broker
from tests.support.model.harness import RUN, snapshot
from tests.support.model.periodic.schedules import (
    BATCH,
    MAX_BACKLOG,
    POOL,
    Window,
    grid,
    lua_number,
    occurrence_id,
    period,
    times,
    valid_name,
)

if TYPE_CHECKING:
    from tests.support.model.periodic.machine import PeriodicMachine


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


class CheckedCalls:
    """The checks around each script call ModelBroker passes on."""

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
