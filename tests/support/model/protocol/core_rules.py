"""The core protocol's steps, which Hypothesis chooses among: enqueues, workers'
claims and finishes (by the owner or by a wrong one), heartbeats, give-backs, ticks,
cancels, watches, dashboard actions, a lease or a due time that passes; and how a step
picks what it acts on."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.store.wire import RETRY, NewJob, Outcome
from tests.support import tasks
from tests.support.entries import keep_as_entry, keep_as_hash
from tests.support.model.harness import snapshot
from tests.support.model.protocol.records import (
    DELAYED,
    DELAYS,
    ERROR,
    FINISHED,
    PARKED,
    QUEUED,
    QUEUES,
    RUNNING,
    TICK_QUEUES,
    WAITING,
    WIDE_ORDER,
    WORKERS,
    Job,
)
from tests.support.model.protocol.strategies import (
    JOB_QUEUE,
    ORDER,
    PICK,
    PRIORITY,
    RETRY_DELAY,
    SLOTS,
    STATUS,
    WORKER,
    WRONG,
)


class CoreRules:
    """The core protocol's rules, over the operations of core_operations.py."""

    # Choosing what a step acts on. Every rule draws all its arguments from fixed
    # strategies and picks jobs and workers by index, with no preconditions: the shape
    # of the choices must not depend on what Redis's clock decided (a job SOON ahead
    # may or may not be due), or Hypothesis could not replay a sequence.

    def pick(self, items, index: int):
        items = list(items)
        return items[index % len(items)] if items else None

    def held_job(self, index: int) -> tuple[str, str, str] | None:
        held = [(w, i, t) for w in WORKERS for i, t in sorted(self.held[w].items())]
        return self.pick(held, index)

    def outcome(
        self, job_id: str, token: str, status: str, retry_in: int, traced: bool = False
    ) -> Outcome:
        """``traced``: with a trace record, as a traced worker's outcomes carry."""
        trace = f"{token} {status}" if traced else ""
        if status == SUCCESSFUL:
            return Outcome(job_id, token, status, result='{"n": 42}', trace=trace)
        if status == FAILED:
            return Outcome(job_id, token, status, error=ERROR, trace=trace)
        if status == RETRY:
            return Outcome(job_id, token, status, error=ERROR, retry_in_ms=retry_in, trace=trace)
        return Outcome(job_id, token, status, retry_in_ms=retry_in, trace=trace)

    def wrong_token(self, job: Job, kind: str, index: int) -> str:
        """A token that is not the job's owner's."""
        if kind == "last claim's" and job.owner is None and job.token is not None:
            return job.token  # its hash still names it: the job is no longer RUNNING
        stale = [t for i, t in self.issued if i == job.id and t != job.owner]
        if kind in ("stale", "last claim's") and stale:
            return self.pick(stale, index)
        if kind in ("stale", "last claim's", "other worker"):
            mine = job.owner.split("/")[0] if job.owner else None
            other = self.pick([w for w in WORKERS if w != mine], index)
            return f"{other}/{max(job.attempts, 1)}"
        return "" if kind == "empty" else "w9/7"

    def drop_held(self, worker: str, outcome: Outcome) -> None:
        """The worker is done with a job once it has sent its outcome (its own token)."""
        if self.held[worker].get(outcome.job_id) == outcome.owner:
            del self.held[worker][outcome.job_id]

    def any_held(self) -> bool:
        return any(self.held.values())

    # Rules: producers.

    @initialize(
        batch=st.lists(
            st.tuples(JOB_QUEUE, PRIORITY, st.sampled_from(list(DELAYS)), st.booleans()),
            max_size=8,
        ),
        workers=st.lists(WORKER, unique=True),
        slots=SLOTS,
    )
    def backlog(self, batch, workers, slots):
        """A few jobs to start with, some stored by a process older than entries (a
        deploy: see stored_by_older), the workers already up (their first heartbeat
        registers their broadcast cursor), and how many slots each worker has."""
        self.slots = dict(zip(WORKERS, slots, strict=True))
        for queue, priority, delay, older in batch:
            [job_id] = self.op_enqueue_batch([(queue, priority, DELAYS[delay])])
            if older:
                self.stored_by_older(job_id)
        for worker in workers:
            self.op_heartbeat(worker, {})

    @rule(
        queue=JOB_QUEUE,
        priority=PRIORITY,
        delay=st.sampled_from(list(DELAYS)),
        via_api=st.booleans(),
    )
    def enqueue(self, queue, priority, delay, via_api):
        self.op_enqueue(queue, priority, DELAYS[delay], via_api)

    @rule(queue=JOB_QUEUE, priority=PRIORITY)
    def enqueue_now(self, queue, priority):
        self.op_enqueue(queue, priority, None, via_api=False)

    @rule(
        batch=st.lists(
            st.tuples(JOB_QUEUE, PRIORITY, st.sampled_from(list(DELAYS)), st.booleans()),
            min_size=2,
            max_size=5,
        )
    )
    def enqueue_a_batch(self, batch):
        """Several jobs, of any queues, priorities and delays, in one script call; the
        ones marked as if a process older than entries stored them (a deploy): their
        hashes at the odd places of entries."""
        ids = self.op_enqueue_batch([(q, p, DELAYS[d]) for q, p, d, _ in batch])
        for job_id, (*_, older) in zip(ids, batch, strict=True):
            if older:
                self.stored_by_older(job_id)

    def stored_by_older(self, job_id: str) -> None:
        """A job just enqueued as a process older than entries stores it: its hash,
        at the odd place of an entry (a job that is no entry stays as it is)."""
        job = self.jobs[job_id]
        if job.entry and keep_as_hash(self.r, self.keys, job_id):
            job.entry = False
            self.count("entries stored as hashes")

    @rule(pick=PICK)
    def enqueue_a_taken_id(self, pick):
        """An id already taken (any job not deleted, in either form), sent again fresh
        (a call repeated after a lost reply), or delayed: refused, nothing changes."""
        taken = self.job_list(QUEUED, DELAYED, WAITING, PARKED, RUNNING, FINISHED)
        job = self.pick(taken, pick)
        if job is None:
            return
        before = snapshot(self.r)
        payload = self.backend.prepare(tasks.noop, (), {})._payload
        again = [NewJob(job.id, "low", 5, payload), NewJob(job.id, "low", 5, payload, 2**42)]
        assert self.broker.enqueue(again) == [None, None]
        assert snapshot(self.r) == before

    # Rules: Workers.

    @rule(
        worker=WORKER,
        order=ORDER,
        woken_by=st.sampled_from(["", "", *QUEUES, "no/queue"]),
        idle=st.booleans(),
    )
    def claim(self, worker, order, woken_by, idle):
        self.op_claim(worker, order, None, woken_by, idle=idle)

    @rule(
        worker=WORKER,
        status=STATUS,
        retry_in=RETRY_DELAY,
        broadcasts=st.booleans(),
        idle=st.booleans(),
    )
    def work(self, worker, status, retry_in, broadcasts, idle):
        """A worker's loop: finish the job in hand (if any) and claim the next; a busy
        worker reads the broadcasts' number only now and then; one that will wait
        registers as idle when it finds no job."""
        outcome = None
        if self.held[worker]:
            job_id, token = min(self.held[worker].items())
            outcome = self.outcome(job_id, token, status, retry_in)
        self.op_claim(worker, QUEUES, outcome, broadcasts=broadcasts, idle=idle)

    @rule(worker=WORKER, order=ORDER, status=STATUS)
    def work_until_idle(self, worker, order, status):
        """A worker's loop until its queues run dry (a few claims at most), each claim
        finishing the job before: then it stands idle, and the next job of its queues
        is handed to it."""
        for _ in range(6):
            outcome = None
            if self.held[worker]:
                job_id, token = min(self.held[worker].items())
                outcome = self.outcome(job_id, token, status, 0)
            self.op_claim(worker, order, outcome, idle=True)
            if worker in self.idle:
                return
            self.settle()  # what this claim set, before the next claims the job again

    @rule(pick=PICK, priority=PRIORITY)
    def a_job_lands_ahead_of_an_idle_workers_queue(self, pick, priority):
        """While a worker stands idle on two queues or more, a job lands in its first
        queue without being handed to it (an operator runs a delayed job now: no
        promotion hands a job over), then one is enqueued to its second: its claim
        would take the first, so the second is not handed to it."""
        ready = [
            (w, order)
            for w, (_, order) in sorted(self.idle.items())
            if len(order) > 1 and set(order) <= set(QUEUES)  # not a wide worker's spares
        ]
        chosen = self.pick(ready, pick)
        if chosen is None:
            return
        _, order = chosen
        self.op_enqueue(order[0], priority, DELAYS["an hour"], via_api=False)
        job = list(self.jobs.values())[-1]  # the job just enqueued
        self.op_operate("run_now", order[0], [job.id], 0)
        self.op_enqueue(order[1], priority, None, via_api=False)

    @rule(pick=PICK, order=ORDER)
    def wait(self, pick, order):
        """An idle worker's wait returns the job an enqueue handed to it."""
        worker = self.pick(sorted(self.handed), pick)
        if worker is not None:
            self.op_wait(worker, order)

    @rule(pick=PICK, order=ORDER, status=STATUS, retry_in=RETRY_DELAY, traced=st.booleans())
    def finish_and_claim(self, pick, order, status, retry_in, traced):
        held = self.held_job(pick)
        if held is None:
            return
        worker, job_id, token = held
        self.op_claim(worker, order, self.outcome(job_id, token, status, retry_in, traced))

    @rule(pick=PICK, status=STATUS, retry_in=RETRY_DELAY, traced=st.booleans())
    def finish(self, pick, status, retry_in, traced):
        held = self.held_job(pick)
        if held is None:
            return
        worker, job_id, token = held
        self.op_finish(worker, self.outcome(job_id, token, status, retry_in, traced))

    @rule(
        pick=PICK,
        kind=WRONG,
        index=PICK,
        status=STATUS,
        retry_in=RETRY_DELAY,
        worker=WORKER,
        order=st.none() | ORDER,
    )
    def finish_by_a_wrong_owner(self, pick, kind, index, status, retry_in, worker, order):
        """Fenced out (a stale token, another worker's, a made-up one): the outcome
        changes nothing. Alone, or in a claim (then the claim goes on as usual)."""
        job = self.pick(self.jobs.values(), pick)
        if job is None:
            return
        token = self.wrong_token(job, kind, index)
        assert token != job.owner
        outcome = self.outcome(job.id, token, status, retry_in, traced=True)
        if order is not None:
            self.op_claim(worker, order, outcome)
            return
        before = snapshot(self.r)
        assert self.broker.finish(outcome) is False
        assert snapshot(self.r) == before, f"a finish by {token!r} changed Redis"

    @rule(picks=st.lists(PICK, min_size=1, max_size=3), wrong=st.none() | WRONG, index=PICK)
    def report_progress(self, picks, wrong, index):
        """Running jobs' progress, as a worker's writer sends it: stored for the jobs
        their owner names; with a wrong token too (a late write after the job ended,
        was recovered or given back), refused."""
        reports = []
        for pick in picks:
            held = self.held_job(pick)
            if held is not None:
                _, job_id, token = held
                attempt = self.jobs[job_id].attempts  # its own, as a writer sends it
                reports.append((job_id, token, f'{{"attempt":{attempt},"done":{pick}}}'))
        job = self.pick(self.jobs.values(), index)
        if wrong is not None and job is not None:
            reports.append((job.id, self.wrong_token(job, wrong, index), '{"done":0}'))
        if reports:
            self.op_report_progress(reports)

    @rule(pick=PICK, which=st.sampled_from(["held", "handed", "any"]))
    def stop(self, pick, which):
        """A job asked to stop: one a worker holds, one handed to an idle worker and
        not taken yet, or any."""
        held, handed = self.held_job(pick), self.pick(self.handed.values(), pick)
        if which == "held" and held is not None:
            job = self.jobs[held[1]]
        elif which == "handed" and handed is not None:
            job = self.jobs[handed]
        else:
            job = self.pick(self.jobs.values(), pick)
        if job is not None:
            self.op_stop(job, job.id)

    @rule(worker=WORKER)
    def take_stops(self, worker):
        """A worker's heartbeat learns which of its jobs to stop (the task is stopped
        by the worker; its outcome comes in a finish or a claim)."""
        if self.stop_lists.get(worker):
            self.op_take_stops(worker)

    @rule(worker=WORKER, wrong=st.none() | WRONG, pick=PICK, index=PICK, traced=st.booleans())
    def heartbeat(self, worker, wrong, pick, index, traced):
        """Renews what the worker still owns; with a wrong token too, reported lost.
        ``traced``: with the running attempts' trace records, stored for those it owns."""
        extra = {}
        if wrong is not None:
            others = [j for j in self.jobs.values() if j.id not in self.held[worker]]
            job = self.pick(others, pick)
            if job is not None:
                extra[job.id] = self.wrong_token(job, wrong, index)
            else:
                extra["no-such-job"] = f"{worker}/1"
        self.op_heartbeat(worker, extra, traced)

    @rule(worker=WORKER, keep=st.lists(PICK, max_size=2))
    def abandon(self, worker, keep):
        """A lost reply: the worker gives back what the lost call may have given it,
        keeping the jobs it runs in its other slots (picked among those it holds, and
        another worker's, which it cannot give back anyway)."""
        mine = sorted(self.held[worker].items())
        others = sorted(j for w, held in self.held.items() if w != worker for j in held.items())
        kept = {self.pick(mine, p) for p in keep[:1]} | {self.pick(others, p) for p in keep[1:]}
        self.op_abandon(worker, keep=tuple(sorted(kept - {None})))

    @rule(worker=WORKER)
    def stop_while_idle(self, worker):
        """A worker stops, or turns to broadcasts: the job handed to it, if it has not
        taken it, goes back; the jobs of its other slots are theirs to finish."""
        self.op_abandon(worker, handed_only=True)

    @rule(pick=PICK)
    def a_waiting_job_was_stored_in_the_other_form(self, pick):
        """A fresh waiting job as the other process of a deploy stored it: a process
        older than entries stored its hash (at the odd place of an entry), one that
        keeps it as an entry took another's (at a hash's even place). Every script
        reads either form, whatever its place says: a claim or a hand-off starts it,
        a cancel, a watch, a stop or a dependant finds it, an operator empties it."""
        job = self.pick(self.job_list(QUEUED), pick)
        if job is None:
            return
        if job.entry and keep_as_hash(self.r, self.keys, job.id):
            job.entry = False
            self.count("entries stored as hashes")
        elif not job.entry and keep_as_entry(self.r, self.keys, job.id):
            job.entry = True
            self.count("hashes stored as entries")

    @rule(pick=PICK)
    def a_registration_runs_out(self, pick):
        """An idle worker's registration runs out (its key's TTL passes: the worker
        died or froze while idle): nothing is handed to it any more, and its queues'
        registries keep a stale entry, which no enqueue takes."""
        worker = self.pick(sorted(self.idle), pick)
        if worker is not None:
            self.r.delete(self.keys.idle_worker(worker))  # what the TTL's end does
            del self.idle[worker]
            self.count("registrations run out")

    @rule(worker=WORKER, status=STATUS, priority=PRIORITY, queue=JOB_QUEUE)
    def a_wide_worker_stands_idle(self, worker, status, priority, queue):
        """A worker of more queues than it registers on (empty ones first) works until
        it stands idle, and a job is enqueued to one of its queues: to the last it
        registered on ("high"), it is handed over; past them ("default", "low"), it
        leaves a wake-up token for the worker (idle-wide), as the invariants check."""
        self.work_until_idle(worker, WIDE_ORDER, status)
        if worker in self.idle:
            self.op_enqueue(queue, priority, None, via_api=False)

    @rule(worker=WORKER, order=ORDER, status=STATUS, priority=PRIORITY)
    def a_worker_stops_as_it_is_handed_a_job(self, worker, order, status, priority):
        """A worker works until it stands idle; a job is enqueued to its first queue,
        which may hand it over; the worker stops before it takes it."""
        self.handed_to(worker, order, status, priority)
        self.op_abandon(worker, handed_only=True)

    def handed_to(self, worker, order, status, priority) -> bool:
        """The worker works until it stands idle, and a job is enqueued to its first
        queue: whether that job was handed to it."""
        self.work_until_idle(worker, order, status)
        if worker in self.idle:
            first = next(q for q in self.idle_orders[worker] if q in QUEUES)
            self.op_enqueue(first, priority, None, via_api=False)
        return worker in self.handed

    @rule(
        worker=WORKER,
        order=ORDER,
        status=STATUS,
        priority=PRIORITY,
        fate=st.sampled_from(["taken", "taken late", "reply lost"]),
    )
    def an_idle_worker_is_handed_a_job(self, worker, order, status, priority, fate):
        """A job is handed to an idle worker, whose wait returns it. ``taken``: it takes
        it at once. ``taken late``: it was frozen; it thaws and takes the job after the
        hand-off's deadline passed and a tick gave the job back (refused: it does not
        start it, and nothing counts the job, which never ran). ``reply lost``: the
        wait's reply never arrives (the connection broke): the worker gives back what
        it owns, as after a lost claim's reply, but the jobs of its other slots, so the
        job runs at once, uncounted."""
        if not self.handed_to(worker, order, status, priority):
            return
        job = self.op_wait(worker, QUEUES, take=False)
        token = job.owner
        if fate == "reply lost":
            self.op_abandon(worker, keep=self.in_other_slots(worker))
            return
        if fate == "taken late":
            self.r.zadd(self.keys.handed, {job.id: 0}, xx=True)
            job.deadline = 0
            self.op_tick("s1", (), 100, False)
        self.op_take(worker, job, token)

    @rule(worker=WORKER, order=ORDER, status=STATUS, priority=PRIORITY)
    def a_handed_job_is_never_taken(self, worker, order, status, priority):
        """The idle worker a job was handed to died (or its wait never returned): the
        hand-off's deadline passes, and a tick gives the job back, uncounted."""
        if not self.handed_to(worker, order, status, priority):
            return
        job = self.jobs[self.handed[worker]]
        self.r.zadd(self.keys.handed, {job.id: 0}, xx=True)
        job.deadline = 0
        self.op_tick("s2", QUEUES, 100, True)

    @rule(worker=WORKER)
    def worker_vanishes(self, worker):
        """It stops using its tokens; its jobs come back once their lease passes."""
        self.forget_slots(worker)

    @rule(worker=WORKER)
    def worker_stalls(self, worker):
        """A whole lost lease in one step: the worker claims, stalls past its lease, and
        the scheduler recovers the job (which keeps its place, so the next stalled
        claim often takes it again: after LOST_LIMIT recoveries it fails)."""
        self.op_claim(worker, QUEUES, None)
        for job in self.job_list(RUNNING):
            if job.owner and job.owner.startswith(worker + "/"):
                self.r.zadd(self.lease_key(job), {job.id: 0}, xx=True)
                job.deadline = 0
        self.op_tick("s1", QUEUES, 100, True)

    # Rules: Schedulers, clients, operators.

    @rule(
        scheduler=st.sampled_from(["s1", "s2"]),
        queues=st.sampled_from(TICK_QUEUES),
        batch=st.sampled_from([1, 2, 100]),
        recover=st.sampled_from([True, True, False]),
        held=st.sampled_from([False, False, False, True]),
        in_grace=st.sampled_from([False, False, True]),
    )
    def tick(self, scheduler, queues, batch, recover, held, in_grace):
        self.op_tick(scheduler, queues, batch, recover, held, in_grace)

    @rule(pick=PICK, via_api=st.booleans())
    def cancel(self, pick, via_api):
        job = self.pick(self.jobs.values(), pick)
        if job is not None:
            self.op_cancel(job, via_api)

    @rule(pick=PICK)
    def watch(self, pick):
        job = self.pick(self.jobs.values(), pick)
        if job is not None:
            self.op_watch(job)

    @rule(
        action=st.sampled_from(["retry_failed", "delete_failed", "run_now", "empty"]),
        queue=st.sampled_from(QUEUES),
        picks=st.lists(PICK, max_size=2),
        limit=st.sampled_from([0, 1, 2]),
    )
    def operate(self, action, queue, picks, limit):
        """A dashboard action on chosen jobs (of any queue, any state), or on the first
        ``limit`` of the queue's list (0: all)."""
        ids = [self.pick(self.jobs, p) for p in picks] if self.jobs else []
        self.op_operate(action, queue, ids, 0 if ids else limit)

    @rule(action=st.sampled_from(["pause", "resume"]), queue=st.sampled_from(QUEUES))
    def pause_or_resume(self, action, queue):
        self.op_operate(action, queue, [], 0)

    # Rules: Time.

    @rule(pick=PICK, every=st.booleans())
    def lease_runs_out(self, pick, every):
        """Time passes for one running job (or all): its lease deadline moves into the
        past."""
        running = self.job_list(RUNNING)
        for job in running if every else [self.pick(running, pick)] if running else []:
            self.r.zadd(self.lease_key(job), {job.id: 0}, xx=True)
            job.deadline = 0

    @rule(pick=PICK)
    def becomes_due(self, pick):
        """Time passes for one delayed job: its due time moves into the past."""
        job = self.pick(self.job_list(DELAYED), pick)
        if job is not None:
            self.r.zadd(self.keys.delayed(job.queue), {job.id: 0}, xx=True)
            job.due = 0
