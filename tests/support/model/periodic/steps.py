"""The periodic model's steps, which Hypothesis chooses among: syncs of changing
settings (to every scheduler or one: a rolling deploy), edits, syncs again, schedulers'
own calls and whole steps, pause, resume, run now, a job that ends, time passing, and
state spoilt by hand or left by an older version; with the operations they make."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from django_redisqueue.core.schedules import Due
from django_redisqueue.runtime.periodic import PeriodicTaskError, run_now
from django_redisqueue.store.wire import NewJob
from tests.support.model.harness import FAR, RESULT_TTL, RUN
from tests.support.model.periodic.schedules import (
    CALL_QUEUE,
    INVALID,
    NAME,
    OPTIONS,
    POOL,
    SCHEDULERS,
    SETTINGS,
    SPOILT_LAST,
    SPOILT_SKIPPED,
    TAKEN_FIELDS,
    grid,
    occurrence_id,
    period,
    times,
)


class PeriodicSteps:
    """The schedulers', the dashboard's and time's steps, over the calls of calls.py."""

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
            due = schedule.due(last, now) if last is not None else Due([], 0, 0)
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
