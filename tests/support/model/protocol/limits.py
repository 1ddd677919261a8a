"""Unique jobs and limits in the protocol model: the model's moves, operations and
rules for them, mixed into ProtocolMachine (machine.py); what is checked of them after
every step is in invariants.py, an enqueue whose reply is lost in trouble.py.

Unique jobs: enqueues (``Broker.enqueue`` with options, one job or a batch, and the
task API: ``using(unique_key=...)``, or ``unique_for``) of jobs under a few unique
keys. While the key is held, an enqueue returns the holder's id and stores nothing.
A key is held while its job has not ended; the job's end in any way (finish, failure,
cancel, lost for good, an operator's "empty") frees it, or, with ``unique_for``, keeps
it for the rest of its window (a TTL); a retry, a give-back or a recovery do not. An
operator's retry of a failed unique job takes its key again if it is free. Windows
last an hour: ``unique_window_passes`` ends one, deleting the key (its TTL ran out) or
moving the job's ``unique_until`` into the past, as ``becomes_due`` does for a delay.

Limits: jobs under two limit keys, each job with limits of its own (LIMITS: at most
1 or 2 RUNNING, a rate of a few starts an hour or two hours, or both), so that jobs
of one key carry different kinds of limit and different periods, as two tasks sharing
a key or a deploy that changed a limit make them, whatever state the jobs of the old
limits are in. Every job of a key counts against every job's limits: each RUNNING job
holds a slot; each start is a start, kept while the key's ``:window`` (the largest
rate and longest period its rated jobs brought, by enqueue or start) can count it.
A claim parks a job over its limit (a new place: READY, in no queue and no delayed
set, in ``{P}:limit:<key>:parked`` at its queue score) and takes the next; a slot
holder's finish (any outcome), give-back or recovery puts back the parked jobs that
have room by their own limits, counting those put back before them, and so does the
tick when the key's ``{P}:limits`` entry is due (a job in a paused queue takes no
room). Real time never frees a start nor makes an entry due (both are an hour or a
lease ahead): ``rate_window_passes`` moves starts an hour and a half into the past
(out of a one-hour period, still in a two-hour one) or three hours (out of both), and
``limit_look_comes_due`` moves the entry's score to 0.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import redis
from hypothesis import strategies as st
from hypothesis.stateful import rule

from django_redisqueue.core.jobs import FAILED
from django_redisqueue.store.wire import NewJob
from tests.support import tasks
from tests.support.model.harness import RUN
from tests.support.model.protocol.records import (
    AGES,
    BATCH,
    DELAY_MS,
    DELETED,
    FINISHED,
    FREED_LOOKS_AT,
    HOUR,
    LIMIT_KEYS,
    LIMITS,
    PARKED,
    PASSED,
    QUEUED,
    QUEUES,
    RUNNING,
    STATUSES,
    UNIQUE_KEYS,
    Start,
    options_json,
)
from tests.support.model.protocol.strategies import LIMITED_STEP, OPTION_QUEUE, OPTIONED, PICK


def task_with(unique: tuple[str, bool] | None, limit: str | None):
    """tasks.noop with these options, the way an application sets them: a unique key
    through ``using(unique_key=...)`` (held until the end) or ``unique_for`` (a
    window); limits as the task's ``concurrency_limit`` / ``rate_limit``."""
    task, changes = tasks.noop, {}
    if unique is not None and unique[1]:
        changes |= {"unique": unique[0], "unique_for": HOUR / 1000}
    if limit is not None:
        settings = LIMITS[limit]
        changes |= {"concurrency_limit": settings.running, "limit_key": settings.key}
        hours = settings.per // HOUR
        changes["rate_limit"] = f"{settings.rate}/{hours}h" if settings.rate else None
    task = replace(task, **changes) if changes else task
    if unique is not None and not unique[1]:
        task = task.using(unique_key=unique[0])
    return task


class LimitsModel:
    """The unique keys and limits of ProtocolMachine: it provides the jobs, the
    clock, the Redis client and the moves these build on."""

    def init_limits(self) -> None:
        # {P}:unique:<key> as it is: (the id it holds, whether it has a TTL).
        self.unique_keys: dict[str, tuple[str, bool]] = {}
        # Per limit key: its starts (all, even those Redis no longer keeps), and its
        # ``:window`` record (most starts kept, longest period), once a rate came.
        self.starts: dict[str, list[Start]] = {key: [] for key in LIMIT_KEYS}
        self.windows: dict[str, tuple[int, int]] = {}
        # The entries of {P}:limits: True once due (score 0), False while ahead.
        self.looks: dict[str, bool] = {}
        self.claims = 0  # claims so far: the order in which jobs started

    # The model's moves, as the shared Lua files (store/lua/lib/) make them.

    def running_under(self, key: str) -> list:
        """Its RUNNING jobs; not one leaving RUNNING (its owner gone) in this step."""
        running = self.job_list(RUNNING)
        return [j for j in running if j.limit and LIMITS[j.limit].key == key and j.owner]

    def parked_under(self, key: str) -> list:
        """Its parked jobs, in the order of their queue scores (ZPOPMIN's)."""
        parked = [j for j in self.job_list(PARKED) if LIMITS[j.limit].key == key]
        return sorted(parked, key=lambda j: (-j.priority, j.seq))

    def in_period(self, key: str, per: int) -> list[Start]:
        return [s for s in self.starts[key] if s.age < per]

    def m_limit_room(self, name: str) -> int:
        """limit_room: how many jobs under a job's limits may start now, counting every
        job of its key."""
        limit, room = LIMITS[name], 1 << 30
        if limit.running:
            room = limit.running - len(self.running_under(limit.key))
        if limit.rate:
            room = min(room, limit.rate - len(self.in_period(limit.key, limit.per)))
        return max(room, 0)

    def m_rate_window(self, name: str) -> None:
        """rate_window: a job with a rate (enqueued, or starting) adds it to its key's
        record of the starts to keep."""
        limit = LIMITS[name]
        if limit.rate:
            starts, ms = self.windows.get(limit.key, (0, 0))
            self.windows[limit.key] = (max(starts, limit.rate), max(ms, limit.per))

    def m_take_limit(self, job, window: tuple[int, int]) -> None:
        """take_limit: the slot is the job's being RUNNING; its start is kept when the
        key has a rate to count it, and the key keeps the newest of its starts, as many
        as its largest rate (by score, then member: ``<id>@<ms>``)."""
        self.m_rate_window(job.limit)
        key = LIMITS[job.limit].key
        if key not in self.windows:
            return
        starts = [*self.starts[key], Start(job.id, window, job.claim_order)]
        # Starts of this step (their ms not read back yet) are the newest, in order.
        starts.sort(key=lambda s: (0, s.score, s.job_id) if s.at is not None else (1, s.seq, ""))
        keep = self.windows[key][0]
        if len(starts) > keep:
            self.count("starts forgotten past a window")
        self.starts[key] = starts[-keep:]

    def m_park(self, job) -> None:
        job.place, job.scored = PARKED, True
        # A look already asked for stays (sooner, or due); real time never reaches one.
        self.looks.setdefault(LIMITS[job.limit].key, False)
        self.count("parked")

    def m_unpark(self, key: str, most: int, by: str) -> None:
        """unpark: of the first ``most`` parked jobs (in queue order), those with room
        by their own limits go back to their places in their queues; each takes a room
        of every kind, unless its queue is paused (it cannot start). A key that still
        has parked jobs keeps a look: a due one if every job looked at had room (those
        past ``most`` are next)."""
        rooms: dict[tuple, int] = {}
        starting, stayed = 0, 0
        for job in self.parked_under(key)[:most]:
            limit = LIMITS[job.limit]
            kind = (limit.running, limit.rate, limit.per if limit.rate else None)
            if kind not in rooms:
                rooms[kind] = self.m_limit_room(job.limit)
            if rooms[kind] - starting > 0:
                self.requeue(job)
                self.count(f"unparked by {by}")
                starting += job.queue not in self.paused
            else:
                stayed += 1
        left = len(self.parked_under(key))
        if left:
            if by == "a freed slot" and left > stayed:  # some it did not look at
                self.looks[key] = True
                self.count("looks at once past the first looked at")
            elif stayed:
                self.looks.setdefault(key, False)
            else:  # all it looked at had room: the rest are looked at at once
                self.looks[key] = True
                self.count("looks at once past the first looked at")

    def m_free_slot(self, job) -> None:
        """free_slot: a job of a key leaves RUNNING; the key's parked jobs with room go
        back."""
        if job.limit:
            self.m_unpark(LIMITS[job.limit].key, FREED_LOOKS_AT, "a freed slot")

    def m_tick_looks(self, batch: int) -> bool:
        """The tick's look at the due entries of {P}:limits (by score, then name): the
        first ``batch`` parked jobs of each are looked at. Returns whether the batch
        of looks was full."""
        due = sorted(key for key, is_due in self.looks.items() if is_due)[:batch]
        for key in due:
            del self.looks[key]
            self.m_unpark(key, batch, "the tick")
        return len(due) == batch

    def m_unique_holder(self, key: str) -> str | None:
        """unique_holder: the job holding ``key``: one that has not ended, or one that
        ended within its window (the key has a TTL then); never a job gone."""
        entry = self.unique_keys.get(key)
        if entry is None:
            return None
        holder, ttl = entry
        job = self.jobs.get(holder)
        if job is None or job.place == DELETED:
            return None
        return holder if ttl or job.place != FINISHED else None

    def m_release_unique(self, job) -> None:
        """store_outcome: the job's unique key is free again, or, within its window,
        held for the rest of it (a TTL); unless another job holds it now."""
        if job.unique and self.unique_keys.get(job.unique, ("",))[0] == job.id:
            if job.unique_until not in (None, PASSED):
                self.unique_keys[job.unique] = (job.id, True)
                self.count("unique keys kept for their window")
            else:
                del self.unique_keys[job.unique]
                self.count("unique keys freed")

    def m_hold_unique_again(self, job) -> None:
        """An operator's retry of a failed unique job: it takes its key again (with no
        TTL: it is live, whatever is left of its window), unless another job holds it
        now."""
        if job.unique and self.m_unique_holder(job.unique) in (None, job.id):
            self.unique_keys[job.unique] = (job.id, False)
            self.count("unique keys taken again")

    def m_enqueue_one(
        self, job_id: str, spec, window: tuple[int, int], hand: bool = True, fair=None
    ) -> str | None:
        """enqueue.lua for one job with options: the holder's id when its unique key is
        held (nothing stored), else None, the job stored (and holding its key).
        ``hand``: by a call of its own, which may hand it over (else the caller hands
        the call's jobs once all are stored)."""
        queue, priority, due, unique, limit = spec
        if unique is not None:
            holder = self.m_unique_holder(unique[0])
            if holder is not None:
                self.count("unique enqueues refused")
                return holder
        fresh = unique is None and limit is None and fair is None  # options '': an entry
        self.place_new(
            job_id, queue, priority, due, *window, limit=limit, hand=hand, fair=fair, fresh=fresh
        )
        job = self.jobs[job_id]
        if limit is not None:
            self.m_rate_window(limit)
        if unique is not None:
            self.unique_keys[unique[0]] = (job_id, False)
            job.unique = unique[0]
            if unique[1]:
                job.unique_until = (window[0] + HOUR, window[1] + HOUR)
        return None

    # Operations.

    def op_enqueue_options(self, specs, via_api: bool, lost: bool = False, fair=None) -> None:
        """Jobs (queue, priority, delay, unique, limit) with options: through the task
        API (one job), or in one Broker.enqueue call. ``lost``: its reply is lost.
        ``fair``: each job's fairness key (fairness.py), for a call."""
        fair = fair or [None] * len(specs)
        t0 = self.clock()
        dues = []
        for _, _, delay, _, _ in specs:
            ms = DELAY_MS[delay]
            when = None if ms is None else datetime.fromtimestamp((t0 + ms) / 1000, tz=UTC)
            dues.append((when, 0 if when is None else int(when.timestamp() * 1000)))
        full = [
            (q, p, due, u, lim) for (q, p, _, u, lim), (_, due) in zip(specs, dues, strict=True)
        ]
        if via_api:
            (queue, priority, _, unique, limit), (when, _) = specs[0], dues[0]
            holder = unique and self.m_unique_holder(unique[0])
            task = task_with(unique, limit).using(
                queue_name=queue, priority=priority, run_after=when
            )
            result = task.enqueue()
            window = (t0, self.clock())
            if holder:
                assert result.id == holder, f"unique enqueue: {result.id}, model {holder}"
                assert self.m_enqueue_one("", full[0], window) == holder
                held = self.jobs[holder]
                if held.place != DELETED:
                    assert result.status == held.status, f"{result.status}, {held}"
            else:
                assert self.m_enqueue_one(result.id, full[0], window) is None
                assert result.enqueued_at is not None
            return
        prepared = [self.backend.prepare(tasks.noop, (), {}) for _ in specs]
        jobs = [
            NewJob(r.id, q, p, r._payload, due, options=options_json(u, lim, key))
            for r, (q, p, due, u, lim), key in zip(prepared, full, fair, strict=True)
        ]
        refused = len(specs) == 1 and specs[0][3] and self.m_unique_holder(specs[0][3][0])
        before = self.take_snapshot() if refused and not lost else None
        replies = None
        try:
            replies = self.broker.enqueue(jobs)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        window = (t0, self.clock())
        expected = []
        for at in range(0, len(jobs), BATCH):  # each call of the batch in turn
            part = slice(at, at + BATCH)
            chunk = list(zip(jobs[part], full[part], fair[part], strict=True))
            expected += [
                self.m_enqueue_one(j.job_id, s, window, hand=False, fair=key)
                for j, s, key in chunk
            ]
            stored = [self.jobs[j.job_id] for j, _, _ in chunk if j.job_id in self.jobs]
            RUN["handed over"] += self.m_hand_queued(stored, window)
        if replies is None:
            return
        for reply, holder in zip(replies, expected, strict=True):
            if holder is not None:
                assert reply == holder, f"enqueue replied {reply}; model: held by {holder}"
            else:
                assert isinstance(reply, int) and t0 <= reply <= window[1], reply
        if before is not None:
            assert self.take_snapshot() == before, "a refused unique enqueue stored something"

    # Rules.

    @rule(spec=OPTIONED, via_api=st.booleans())
    def enqueue_with_options(self, spec, via_api):
        """One job with a unique key, a limit, both or neither."""
        self.op_enqueue_options([spec], via_api)

    @rule(queue=OPTION_QUEUE, unique=st.sampled_from(UNIQUE_KEYS), timed=st.booleans())
    def enqueue_unique_twice(self, queue, unique, timed):
        """The same unique job twice in a row (a double click): the second gets the
        first's id, or the id of the job already holding the key."""
        spec = (queue, 0, "now", (unique, timed), None)
        self.op_enqueue_options([spec], via_api=False)
        self.op_enqueue_options([spec], via_api=True)

    @rule(specs=st.lists(OPTIONED, min_size=2, max_size=4))
    def enqueue_with_options_in_a_batch(self, specs):
        """Several in one call: a later job under an earlier one's unique key gets its
        id."""
        self.op_enqueue_options(specs, via_api=False)

    @rule(limit=st.sampled_from(sorted(LIMITS)), count=st.integers(2, 4), queue=OPTION_QUEUE)
    def enqueue_a_limited_burst(self, limit, count, queue):
        """Several jobs under one limit at once, more than it lets start together."""
        self.op_enqueue_options([(queue, 0, "now", None, limit)] * count, via_api=False)

    @rule(
        limits=st.lists(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=3),
        workers=st.lists(st.sampled_from(["w1", "w2", "w3"]), min_size=1, max_size=3),
    )
    def limited_rush(self, limits, workers):
        """Urgent jobs under limits of any kind (mostly of one key) arrive at the head
        of their queue, and workers claim one after the other: those over their limits,
        by every job of their key, are parked, the others run."""
        specs = [("default", 100, "now", None, limit) for limit in limits]
        self.op_enqueue_options(specs, via_api=False)
        for worker in workers:
            self.op_claim(worker, ("default", "low"), None)

    @rule(
        picks=st.lists(PICK, min_size=1, max_size=3),
        status=st.sampled_from(STATUSES),
    )
    def limited_jobs_end(self, picks, status):
        """RUNNING jobs of a key end (or retry, or are given back), each freeing its
        slot: the parked jobs of the key with room by their own limits go back."""
        for pick in picks:
            running = [j for j in self.job_list(RUNNING) if j.limit and j.owner]
            job = self.pick(running, pick)
            if job is None:
                return
            worker = job.owner.split("/")[0]
            self.op_finish(worker, self.outcome(job.id, job.owner, status, 0))
            self.count("limited jobs ended")

    @rule(
        steps=st.lists(LIMITED_STEP, min_size=1, max_size=3),
        first=st.sampled_from(["none", "job"]),
        pick=PICK,
    )
    def enqueue_a_limited_chain(self, steps, first, pick):
        """A chain (enqueue_linked.lua keeps limits) of jobs under limits, released
        into their queues one by one, and parked there like any other."""
        links = [first] + ["prev"] * (len(steps) - 1)
        linked = [(q, p, d, link, pick) for (q, p, d, _), link in zip(steps, links, strict=True)]
        self.op_linked(linked, limits=[limit or "" for *_, limit in steps])

    @rule(pick=PICK)
    def unique_window_passes(self, pick):
        """Time passes for a unique key held with a window: the key's TTL runs out,
        once its job ended; before, the job's ``unique_until`` moves into the past."""
        timed = [
            (key, holder)
            for key, (holder, _) in sorted(self.unique_keys.items())
            if self.jobs[holder].unique_until not in (None, PASSED)
        ]
        chosen = self.pick(timed, pick)
        if chosen is None:
            return
        key, holder = chosen
        if self.unique_keys[key][1]:
            self.r.delete(self.keys.unique(key))
            del self.unique_keys[key]
        else:
            self.r.hset(self.keys.job(holder), "unique_until", 0)
            self.jobs[holder].unique_until = PASSED
        self.count("unique windows passed")

    @rule(
        key=st.sampled_from(LIMIT_KEYS),
        oldest=st.integers(1, 3),
        age=st.sampled_from(sorted(AGES)),
        look=st.sampled_from(["no", "due", "due and tick", "due and tick"]),
    )
    def rate_window_passes(self, key, oldest, age, look):
        """Time passes for the starts of a key: its oldest starts Redis keeps move an
        hour and a half, or three hours, into the past (out of the one-hour periods, or
        of every period); its look may come due too, as it would at that time, and the
        scheduler's step follow."""
        shift = AGES[age]
        kept = self.r.zrange(self.keys.limit(key, "starts"), 0, -1, withscores=True)
        young = [(member, score) for member, score in kept if self.start(key, member).age < shift]
        moved = young[:oldest]
        if moved:
            self.r.zadd(
                self.keys.limit(key, "starts"),
                {m: self.start(key, m).at - shift for m, _ in moved},
                xx=True,
            )
        for member, _ in moved:
            self.start(key, member).age = shift
        if look != "no":
            self.make_look_due(key)
        if look == "due and tick":
            self.op_tick("s2", (), 100, True)

    def start(self, key: str, member: str) -> Start:
        """The model's start that a member of a key's starts (``<job id>@<ms>``) is."""
        job_id, at = member.rsplit("@", 1)
        return next(s for s in self.starts[key] if s.job_id == job_id and s.at == int(at))

    def make_look_due(self, key: str) -> None:
        if key in self.looks:
            self.r.zadd(self.keys.limits, {key: 0}, xx=True)
            self.looks[key] = True

    @rule(picks=st.lists(PICK, min_size=1, max_size=2), tick=st.sampled_from([None, 1, 100, 100]))
    def limit_look_comes_due(self, picks, tick):
        """The time the tick should look at a limit's parked jobs comes (for one limit
        or two); with ``tick``, the scheduler's next step (its batch) follows."""
        for pick in picks:
            self.make_look_due(self.pick(sorted(self.looks), pick) or "")
        if tick is not None:
            self.op_tick("s1", ("default",), tick, True)

    @rule(
        key=st.sampled_from(UNIQUE_KEYS),
        status=st.sampled_from(STATUSES),
        retry=st.sampled_from([False, True, True]),
    )
    def a_unique_job_goes_on(self, key, status, retry):
        """The job holding a unique key moves: its worker sends ``status`` (it runs),
        or it is cancelled (it waits); ``retry``: if it failed, an operator retries it
        (it fails first, then)."""
        holder = self.m_unique_holder(key)
        job = self.jobs.get(holder or "")
        if job is None:
            return
        if job.place == QUEUED:  # a worker of its queue claims (it, or one before it)
            self.op_claim("w3", (job.queue,), None)
        if job.place == RUNNING:
            worker = job.owner.split("/")[0]
            if self.handed.get(worker) == job.id:  # its worker takes it first
                self.op_wait(worker, QUEUES)
            status = FAILED if retry else status
            self.op_finish(worker, self.outcome(job.id, job.owner, status, 0))
        else:
            self.op_cancel(job, via_api=False)
        if retry and job.indexed:
            self.op_operate("retry_failed", job.queue, [job.id], 0)

    @rule(pick=PICK, via_api=st.booleans())
    def cancel_a_parked_job(self, pick, via_api):
        job = self.pick(self.job_list(PARKED), pick)
        if job is not None:
            self.op_cancel(job, via_api)
            self.count("parked jobs cancelled")

    # Reading back what a script decided with its own clock.

    def settle_starts(self) -> None:
        """Learn the claim ms of each new start from the key's starts in Redis (within
        the window of its claim)."""
        for key, starts in self.starts.items():
            new = [s for s in starts if s.at is None]
            if not new:
                continue
            members = self.r.zrange(self.keys.limit(key, "starts"), 0, -1)
            taken = {(s.job_id, s.at) for s in starts if s.at is not None}
            for start in new:
                found = [
                    int(at)
                    for job_id, at in (m.rsplit("@", 1) for m in members)
                    if job_id == start.job_id and (job_id, int(at)) not in taken
                ]
                assert len(found) == 1, f"{key}: start of {start.job_id}: {found} in {members}"
                lo, hi = start.window
                assert lo <= found[0] <= hi, f"{key}: start {found[0]} not in {start.window}"
                start.at = found[0]
                taken.add((start.job_id, start.at))
