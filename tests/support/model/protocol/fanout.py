"""Chains, ``depends_on`` and groups in the protocol model: the moves the scripts
make (a waiting job released when the job it runs after succeeds, failed down the chain
when it does not; a member's end counted once; a group completed once sealed and every
member ended, its callback let go or cancelled; the groups index trimmed), the
operations through ``Broker.enqueue_linked``, ``cancel_group`` and the task API, and
their rules."""

from __future__ import annotations

import json

import redis
from hypothesis import strategies as st
from hypothesis.stateful import rule

from django_redisqueue import Job as WorkflowJob
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.jobs import FAILED, JOB_ID_RE
from django_redisqueue.store.wire import AFTER_GROUP, MissingJob, NewJob
from tests.support import tasks
from tests.support.model.harness import RUN, snapshot
from tests.support.model.protocol.records import (
    BATCH,
    CANCEL_ERROR,
    CANCELLED,
    DELAYS,
    DELETED,
    DEPENDENCY,
    FINISHED,
    UNKNOWN_ID,
    WAITING,
    Err,
    Group,
    Job,
    Pending,
    Spec,
    options_json,
    run_after,
)
from tests.support.model.protocol.strategies import (
    JOB_QUEUE,
    LINKED,
    LINKED_DELAY,
    MEMBER,
    PICK,
    PRIORITY,
)


class FanOutModel:
    """Waiting jobs and groups, over the core moves of core_model.py."""

    # The model's moves, as the scripts make them.

    def fail_pending(self, pending: list[Pending], window: tuple[int, int]) -> None:
        """Last in, first out, as the script's worklist (the order decides the FIFO
        places of the callbacks the failures release)."""
        while pending:
            item = pending.pop()
            job = self.jobs[item.job_id]
            if job.place == WAITING:
                job.cancelled = job.cancelled or item.cancelled
                self.store_outcome(job, FAILED, window, item.error, pending, root=item.root)
                RUN["failed waiting jobs"] += 1

    def release(self, job: Job, window: tuple[int, int]) -> None:
        """A waiting job goes to its queue, or its delayed set while its run_after is
        ahead; any other job stays as it is."""
        if job.place != WAITING:
            return
        self.place(job, job.run_after or 0, window)
        RUN["released"] += 1

    def count_in_group(
        self, job: Job, status: str, window: tuple[int, int], pending: list[Pending]
    ) -> None:
        """Once per member, whatever happens to it later."""
        if job.counted:
            return
        job.counted = status
        group = self.groups[job.group or ""]
        group.ended += 1
        group.failed += status == FAILED
        self.complete_group(group, window, pending)

    def complete_group(
        self, group: Group, window: tuple[int, int], pending: list[Pending]
    ) -> None:
        if group.total is None or group.ended < group.total or group.finished:
            return
        group.finished = window
        RUN["groups completed"] += 1
        if group.callback is None:
            return
        if group.cancelled:
            pending.append(Pending(group.callback, Err(CANCELLED), cancelled=True))
        else:
            self.release(self.jobs[group.callback], window)

    def m_enqueue_linked(self, specs: list[Spec], gid: str, window: tuple[int, int]) -> None:
        """enqueue_linked.lua, one call per BATCH jobs (the last sealing the group), for
        jobs that wait for nothing missing (see ``missing``)."""
        batches = [specs[i : i + BATCH] for i in range(0, len(specs), BATCH)] or [[]]
        for i, batch in enumerate(batches):
            self.m_linked_call(batch, gid, i == len(batches) - 1, window)

    def m_linked_call(
        self, batch: list[Spec], gid: str, seal: bool, window: tuple[int, int]
    ) -> None:
        pending: list[Pending] = []
        group = None
        if gid:
            group = self.groups.get(gid)
            if group is None:
                group = self.groups[gid] = Group(gid, len(self.groups), window)
                self.m_trim_groups()
        for spec in batch:
            job = Job(spec.job_id, len(self.jobs), spec.queue, spec.priority)
            job.limit = spec.limit or None
            if job.limit:
                self.m_rate_window(job.limit)
            self.jobs[job.id] = job
            before = ""  # what the job it runs after is: 'waits' (not ended), or its end
            if spec.after == AFTER_GROUP:
                assert group is not None
                before, group.callback = "waits", job.id
            elif spec.after:
                parent = self.jobs[spec.after]
                before = parent.final if parent.place == FINISHED else "waits"
                if before == "waits":
                    parent.then.append(job.id)
            if before in ("waits", FAILED):
                job.place, job.run_after = WAITING, spec.due
                job.after = f"group:{gid}" if spec.after == AFTER_GROUP else spec.after
                if before == FAILED:
                    # It and its own dependents name the job whose failure started it
                    # all: the failed job, or the one its own DependencyFailed names (a
                    # chain cut over calls says the same as one in one call).
                    root = self.failure_root(self.jobs[spec.after])
                    error = Err(DEPENDENCY, spec.after, root)
                    pending.append(Pending(job.id, error, root=root))
            else:
                self.place(job, spec.due, window)
                job.after = spec.after or None
            if group is not None and spec.after != AFTER_GROUP:
                job.group = gid
                group.members.append(job.id)
        if group is not None and seal:
            group.total = len(group.members)
            self.complete_group(group, window, pending)
        self.fail_pending(pending, window)

    def m_cancel_group(
        self, gid: str, slice_size: int, window: tuple[int, int], calls: int = 0
    ) -> int:
        """cancel_group.lua, slice by slice (``calls``: only that many calls ran)."""
        group = self.groups.get(gid)
        if group is None or group.gone:
            return 0
        cancelled, start, made = 0, 0, 0
        while start >= 0 and not (calls and made == calls):
            made += 1
            error = Err(CANCELLED)
            if start == 0:
                group.cancelled = True
                if group.callback is not None:
                    cancelled += self.m_cancel(self.jobs[group.callback], error, window)
            ids = group.members[start : start + slice_size]
            for job_id in ids:
                cancelled += self.m_cancel(self.jobs[job_id], error, window)
            start = start + slice_size if len(ids) == slice_size else -1
        return cancelled

    def m_trim_groups(self) -> None:
        """trim_groups: of the groups created over a result TTL ago (their index score
        is 0: ordered by id), the first 100 are looked at, and those whose record is
        gone leave the index."""
        old = sorted((g for g in self.groups.values() if g.indexed and g.aged), key=lambda g: g.id)
        for group in old[:100]:
            if group.gone:
                group.indexed = False
                RUN["groups trimmed from the index"] += 1

    # Operations.

    def link(self, kind: str, pick: int, previous: str) -> str:
        """The job a linked job runs after: see LINK."""
        if kind == "prev":
            return previous
        if kind == "job":
            return self.pick(self.jobs, pick) or ""
        return UNKNOWN_ID if kind == "unknown" else ""

    def op_linked(
        self, steps, gid: str = "", callback=None, lost: bool = False, limits=()
    ) -> None:
        """Jobs (queue, priority, delay, link, pick) through Broker.enqueue_linked, in
        one call per BATCH jobs: with ``gid``, a group of them (and ``callback``, a
        (queue, priority, delay), its callback); ``limits``: the steps' limit keys."""
        prepared = [self.backend.prepare(tasks.noop, (), {}) for _ in range(len(steps) + 1)]
        t0 = self.clock()
        specs, previous = [], ""
        limits = [*limits, *[""] * len(steps)]
        for result, (queue, priority, delay, link, pick), limit in zip(
            prepared, steps, limits, strict=False
        ):
            due = 0 if DELAYS[delay] is None else t0 + DELAYS[delay]
            after = self.link(link, pick, previous)
            specs.append(Spec(result.id, queue, priority, due, after, limit))
            previous = result.id
        if callback is not None:
            queue, priority, delay = callback
            due = 0 if DELAYS[delay] is None else t0 + DELAYS[delay]
            specs.append(Spec(prepared[-1].id, queue, priority, due, AFTER_GROUP))
        jobs = [
            NewJob(
                s.job_id,
                s.queue,
                s.priority,
                self.payload,
                s.due,
                s.after,
                options_json(None, s.limit or None),
            )
            for s in specs
        ]
        missing = self.missing(specs)
        before = snapshot(self.r) if missing else None
        named: str | None = None
        try:
            enqueued = self.broker.enqueue_linked(jobs, group_id=gid)
        except MissingJob as exc:
            named, enqueued = exc.job_id, []
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
            enqueued = []
        t1 = self.clock()
        if missing:  # refused whole: one call or several, nothing is stored
            assert lost or named in missing, f"MissingJob({named}), model: one of {missing}"
            assert snapshot(self.r) == before, "a refused linked enqueue stored something"
            RUN["refused linked enqueues"] += 1
            return
        assert named is None, f"MissingJob({named}) for jobs that all exist"
        self.m_enqueue_linked(specs, gid, (t0, t1))
        if not lost:
            assert len(enqueued) == len(specs)
            assert all(at is not None and t0 <= at <= t1 for at in enqueued), enqueued

    def failure_root(self, job) -> str:
        """The job whose failure a FAILED job's end goes back to: itself, or the origin
        its last error, a DependencyFailed, names, if that is a job id (an error
        written by hand may name anything)."""
        last = job.errors[-1] if job.errors else None
        if last is not None and last.kind == DEPENDENCY and JOB_ID_RE.fullmatch(last.root):
            return last.root
        return job.id

    def missing(self, specs: list[Spec]) -> set[str]:
        """The jobs these wait for that neither exist nor come earlier among them:
        MissingJob names one, and nothing at all is stored, as Broker.enqueue_linked
        promises (however many calls the jobs take)."""
        stored = {j.id for j in self.jobs.values() if j.place != DELETED}
        missing = set()
        for i, spec in enumerate(specs):
            earlier = {s.job_id for s in specs[:i]}
            if spec.after not in ("", AFTER_GROUP) and spec.after not in earlier | stored:
                missing.add(spec.after)
        return missing

    def op_chain_api(self, steps, parent: str) -> None:
        """A chain through the task API: ``a.then(b, ...)`` (one step: ``enqueue()``),
        the first step ``depends_on`` ``parent`` (if any)."""
        t0 = self.clock()
        dues, jobs = [], []
        for queue, priority, delay, *_ in steps:
            when, due = (None, 0) if DELAYS[delay] is None else run_after(t0 + DELAYS[delay])
            task = tasks.noop.using(queue_name=queue, priority=priority, run_after=when)
            if parent and not jobs:
                task = task.using(depends_on=parent)
            jobs.append(WorkflowJob(task))
            dues.append(due)
        missing = bool(parent and self.missing([Spec("", "", 0, 0, parent)]))
        before = snapshot(self.r) if missing else None
        try:
            if len(jobs) == 1:
                results = [jobs[0].task.enqueue()]
            else:
                results = jobs[0].then(*jobs[1:]).enqueue()
        except TaskResultDoesNotExist:
            assert missing, "TaskResultDoesNotExist for a job that exists"
            assert snapshot(self.r) == before, "a refused chain stored something"
            RUN["refused linked enqueues"] += 1
            return
        t1 = self.clock()
        assert not missing, f"a chain after {parent}, which does not exist, was queued"
        if len(jobs) == 1 and not parent:  # a plain enqueue (enqueue.lua): it may hand over
            (queue, priority, *_), result = steps[0], results[0]
            self.place_new(result.id, queue, priority, dues[0], t0, t1, fresh=True)
            assert result.enqueued_at is not None
            return
        specs, previous = [], parent
        for result, (queue, priority, *_), due in zip(results, steps, dues, strict=True):
            specs.append(Spec(result.id, queue, priority, due, previous))
            previous = result.id
        self.m_enqueue_linked(specs, "", (t0, t1))
        for result in results:
            assert result.enqueued_at is not None

    def op_group_api(self, members, callback) -> None:
        """A group through the task API: ``group(jobs, callback=...).enqueue()``."""
        t0 = self.clock()
        jobs, specs_in = [], []
        for queue, priority, delay, *_ in [*members, *([callback] if callback else [])]:
            when, due = (None, 0) if DELAYS[delay] is None else run_after(t0 + DELAYS[delay])
            jobs.append(
                WorkflowJob(tasks.noop.using(queue_name=queue, priority=priority, run_after=when))
            )
            specs_in.append((queue, priority, due))
        callback_job = jobs.pop() if callback else None
        result = self.backend.enqueue_group(jobs, callback_job)
        t1 = self.clock()
        ids = [*result.member_ids, *([result.callback_id] if callback else [])]
        afters = [""] * len(members) + [AFTER_GROUP] * bool(callback)
        specs = [
            Spec(job_id, queue, priority, due, after)
            for job_id, (queue, priority, due), after in zip(ids, specs_in, afters, strict=True)
        ]
        self.m_enqueue_linked(specs, result.id, (t0, t1))

    def op_cancel_group(self, gid: str, via_api: bool, slice_size: int, lost=False) -> None:
        t0 = self.clock()
        cancelled: int | None = None
        try:
            if via_api:
                cancelled = self.backend.cancel_group(gid)
                slice_size = 1000
            else:
                cancelled = self.broker.cancel_group(gid, CANCEL_ERROR, slice_size=slice_size)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected = self.m_cancel_group(gid, slice_size, (t0, t1), calls=1 if lost else 0)
        if not lost:
            assert cancelled == expected, f"cancel_group: {cancelled}, model {expected}"

    # Rules: fan-out producers.

    @rule(
        steps=st.lists(LINKED, min_size=2, max_size=4),
        first=st.sampled_from(["none", "none", "job", "job", "unknown"]),
        pick=PICK,
        via_api=st.booleans(),
    )
    def enqueue_a_chain(self, steps, first, pick, via_api):
        """Jobs that run one after the other, the first after nothing, after a job of
        the model, or after one that does not exist (then nothing is queued). Through
        the broker a step may wait for another job than the one before it (LINK)."""
        if via_api:
            self.op_chain_api(steps, self.link(first, pick, ""))
        else:
            self.op_linked([(*steps[0][:3], first, pick), *steps[1:]])

    @rule(
        step=LINKED,
        parent=st.sampled_from(["job", "job", "job", "job", "unknown"]),
        pick=PICK,
        via_api=st.booleans(),
    )
    def enqueue_after_a_job(self, step, parent, pick, via_api):
        """One job ``depends_on`` a job in any state (waiting, queued, delayed,
        running, ended SUCCESSFUL or FAILED, deleted) or one that never existed."""
        if via_api:
            self.op_chain_api([step], self.link(parent, pick, ""))
        else:
            self.op_linked([(*step[:3], parent, pick)])

    @rule(
        pick=PICK,
        length=st.sampled_from([1, 26, 128, 129, 1000]),
        alone=st.booleans(),
        step=LINKED,
    )
    def enqueue_after_an_origin_written_by_hand(self, pick, length, alone, step):
        """A FAILED job whose last error, written by hand, is a DependencyFailed naming
        an origin of any length (``alone``: as its parent only, as a job failed where it
        waited names it), then a job enqueued after it: that job names the origin if it
        is a job id, else the FAILED job itself."""
        failed = [j for j in self.jobs.values() if j.place == FINISHED and j.final == FAILED]
        job = self.pick(failed, pick)
        if job is None:
            return
        origin = ("origin-" * (length // 7 + 1))[:length]
        parent = origin if alone else UNKNOWN_ID
        why = f"job {parent}, which this job runs after, ended FAILED"
        if not alone:
            why += f" without running: job {origin} failed"
        error = {"exception_class_path": DEPENDENCY, "traceback": f"{DEPENDENCY}: {why}\n"}
        key = self.keys.job(job.id)
        errors = json.loads(self.r.hget(key, "errors") or "[]")
        self.r.hset(key, "errors", json.dumps([*errors, error]))
        job.errors.append(Err(DEPENDENCY, parent, origin))
        RUN["origins written by hand"] += 1
        self.op_linked([(*step[:3], "job", list(self.jobs).index(job.id))])

    @rule(
        members=st.lists(MEMBER, max_size=5),
        callback=st.none() | st.tuples(JOB_QUEUE, PRIORITY, LINKED_DELAY),
        via_api=st.booleans(),
    )
    def enqueue_a_group(self, members, callback, via_api):
        """A group of 0 to 5 members, with or without a callback, in calls of BATCH
        jobs. Through the broker a member may wait for another job (MEMBER_LINK)."""
        if via_api:
            self.op_group_api(members, callback)
        else:
            self.op_linked(members, gid=self.ids.new_job_id(), callback=callback)

    @rule(pick=PICK, then_cancel=st.booleans())
    def retry_a_failed_member(self, pick, then_cancel):
        """An operator retries a group member that failed (its end was counted); when
        it ends again (run, or cancelled at once), its group does not count it again."""
        job = self.pick([j for j in self.jobs.values() if j.group and j.indexed], pick)
        if job is not None:
            self.op_operate("retry_failed", job.queue, [job.id], 0)
            if then_cancel:
                self.op_cancel(job, via_api=False)

    @rule(
        picks=st.lists(PICK, min_size=1, max_size=3),
        expires=st.booleans(),
        then=st.sampled_from(["nothing", "a group", "a tick"]),
    )
    def groups_age(self, picks, expires, then):
        """A result TTL passes for groups: created that long ago (their index score
        moves to 0), and, for one that ended a result TTL ago, its record expires.
        Then a new group's enqueue, or the tick, trims the index of the groups gone,
        never of one that lives."""
        for pick in picks:
            indexed = [g for g in self.groups.values() if g.indexed]
            ended = [g for g in indexed if g.finished and not g.gone]
            group = self.pick(ended if expires and ended else indexed, pick)
            if group is None:
                break
            self.r.zadd(self.keys.groups, {group.id: 0}, xx=True)
            group.aged = True
            if expires and group.finished and not group.gone:
                k = self.keys
                self.r.delete(k.group(group.id), k.group_members(group.id), k.group_done(group.id))
                group.gone = True
        if then == "a group":
            self.op_linked([("default", 0, "now", "none", 0)], self.ids.new_job_id())
        elif then == "a tick":
            self.op_tick("s1", (), 100, False)

    @rule(pick=PICK, via_api=st.booleans(), slice_size=st.sampled_from([1, 2, 1000]))
    def cancel_a_group(self, pick, via_api, slice_size):
        """Cancel a group (or one that does not exist), in slices of members."""
        gid = self.pick([*self.groups, UNKNOWN_ID], pick)
        self.op_cancel_group(gid, via_api, slice_size)
