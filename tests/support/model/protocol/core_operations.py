"""The core protocol's operations: each calls the broker (enqueue, claim, finish,
heartbeat, tick, cancel, a dashboard action, abandon, watch), moves the model
(core_model.py) as the script does, and compares the reply."""

from __future__ import annotations

import time

from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.jobs import FAILED
from django_redisqueue.exceptions import NotCancellable
from django_redisqueue.store.wire import Claimed, NewJob, Outcome
from tests.support import tasks
from tests.support.model.harness import RUN
from tests.support.model.protocol.records import (
    BATCH,
    CANCEL_ERROR,
    CANCELLED,
    DELAYED,
    DELETED,
    FINISHED,
    GRACE_MS,
    IDLE_MS,
    LEASE_LOST,
    LOST_ERROR,
    LOST_LIMIT,
    QUEUED,
    QUEUES,
    RUNNING,
    STOP_ERROR,
    Err,
    Job,
    run_after,
)


class CoreOperations:
    """The broker calls of the core protocol, each checked against the model."""

    # Operations: each calls the broker, then moves the model and compares the reply.
    # If the call raises, the model is left as it was. ``lost``: the call runs but its
    # reply is lost (the model moves, the reply is not compared).

    def op_enqueue(self, queue: str, priority: int, delay: int | None, via_api: bool) -> None:
        if not via_api:
            self.op_enqueue_batch([(queue, priority, delay)])
            return
        t0 = self.clock()
        when, due = (None, 0) if delay is None else run_after(t0 + delay)
        task = tasks.noop.using(queue_name=queue, priority=priority, run_after=when)
        job_id = task.enqueue().id
        self.place_new(job_id, queue, priority, due, t0, self.clock(), fresh=True)

    def op_enqueue_batch(
        self, specs: list[tuple[str, int, int | None]], relayed: bool = False
    ) -> list[str]:
        """Jobs (queue, priority, delay) stored by one enqueue call, in that order (by
        an outbox relay: ``relayed``); their ids."""
        prepared = [self.backend.prepare(tasks.noop, (), {}) for _ in specs]
        t0 = self.clock()
        jobs = [
            NewJob(result.id, queue, priority, result._payload, 0 if delay is None else t0 + delay)
            for result, (queue, priority, delay) in zip(prepared, specs, strict=True)
        ]
        enqueued = self.broker.enqueue(jobs, relayed=relayed)
        t1 = self.clock()
        assert len(enqueued) == len(jobs)
        for at in range(0, len(jobs), BATCH):  # each call of the batch in turn
            placed = []
            for job, enqueued_at in zip(
                jobs[at : at + BATCH], enqueued[at : at + BATCH], strict=True
            ):
                assert enqueued_at is not None and t0 <= enqueued_at <= t1
                self.place_new(
                    job.job_id, job.queue, job.priority, job.due_ms, t0, t1, hand=False, fresh=True
                )
                placed.append(self.jobs[job.job_id])
            RUN["handed over"] += self.m_hand_queued(placed, (t0, t1))
        return [job.job_id for job in jobs]

    def place_new(
        self,
        job_id: str,
        queue: str,
        priority: int,
        due: int,
        t0: int,
        t1: int,
        limit: str | None = None,
        hand: bool = True,
        fair: str | None = None,
        fresh: bool = False,
    ):
        """Model a job just stored, due at ``due`` (0: now), between t0 and t1: queued,
        delayed, or (``hand``: by a call of its own) handed to an idle worker. ``fresh``:
        stored by enqueue.lua with no option, so kept as an entry if queued now."""
        job = Job(job_id, len(self.jobs), queue, priority, limit=limit, fair=fair)
        self.jobs[job_id] = job
        self.place(job, due, (t0, t1))
        job.entry = fresh and job.place == QUEUED
        if job.entry:
            RUN["fresh jobs kept as entries"] += 1
        if hand:
            RUN["handed over"] += self.m_hand_queued([job], (t0, t1))

    def op_claim(
        self,
        worker: str,
        order,
        outcome: Outcome | None,
        woken_by: str = "",
        broadcasts: bool = True,
        idle: bool = False,
        take: bool | None = None,
    ) -> None:
        """``woken_by``: the worker took that queue's wake-up token (BLPOP) first.
        ``broadcasts``: the claim reads the last broadcast's number (else the broker
        keeps the one it had). ``idle``: finding no job, the worker registers as idle
        (as one that will wait does). A worker registered since its last claim takes
        the job handed to it first, as the worker's loop does (``take``: False for a
        slot's own claim, which leaves that job to the loop). A worker claims only with a
        slot free (slots.py): with every slot busy, the call only stores the outcome."""
        if not self.slot_free(worker, outcome):
            order = ()
        take = self.takes_handed(worker) if take is None else take
        seen = self.broker.last_broadcast
        if woken_by:
            self.r.lpop(self.keys.wake(woken_by))
        # A ms of its own: starts of one key are then ordered as they were claimed.
        while self.clock() <= self.last_claim:
            time.sleep(0.0002)
        t0 = self.clock()
        stored, claimed = self.broker.claim(
            order,
            worker,
            outcome,
            woken_by=woken_by,
            broadcasts=broadcasts,
            take_handed=take,
            idle_ms=IDLE_MS if idle else None,
        )
        t1 = self.last_claim = self.clock()
        expected_stored = self.m_finish(outcome, (t0, t1))
        handed = self.handed.get(worker) if take and order else None
        job = self.m_claim(order, worker, (t0, t1), take=take, register=idle)
        if woken_by in QUEUES and woken_by not in self.paused:
            waiting = any(j.queue == woken_by for j in self.job_list(QUEUED))
            tokens = self.r.llen(self.keys.wake(woken_by))
            assert tokens == int(waiting), f"wake:{woken_by}: {tokens} token(s) after a pass-on"
        if outcome is not None:
            self.drop_held(worker, outcome)
        assert stored is expected_stored, f"stored {stored}, model {expected_stored}"
        expected_seen = self.last_message if broadcasts else seen
        assert self.broker.last_broadcast == expected_seen, "the claim's broadcast number"
        if job is None:
            assert claimed is None, f"claimed {claimed} from {order}; model: nothing"
            return
        assert claimed is not None, f"model: job {job.n} claimed from {order}"
        assert claimed.job_id == job.id, (
            f"claimed {claimed.job_id}, model: job {job.n} ({job.id}) first in {job.queue}"
        )
        assert claimed.owner == job.owner
        fields = claimed.fields
        assert fields["status"] == "RUNNING"
        assert int(fields["attempts"]) == job.attempts
        assert fields["workers"] == ",".join(job.workers)
        assert fields["queue"] == job.queue and int(fields.get("priority", 0)) == job.priority
        assert int(fields.get("lost", 0)) == job.lost
        assert fields.get("after") == job.after
        assert fields.get("trace") == job.trace, "the claim's reply names the last trace"
        assert fields["payload"]
        if handed is None:
            assert t0 <= int(fields["last_attempted_at"]) <= t1
        else:
            lo, hi = job.handed_window
            assert lo <= int(fields["last_attempted_at"]) <= hi
            RUN["handed jobs claimed"] += 1
        self.held[worker][job.id] = job.owner
        RUN["claims"] += 1
        RUN["claims beside jobs in hand"] += len(self.held[worker]) > 1

    def takes_handed(self, worker: str) -> bool:
        """Whether the worker's next claim takes a handed job first: it has registered
        as idle since its last claim (its registration stands, or it was handed a job)."""
        return worker in self.idle or worker in self.handed

    def op_wait(self, worker: str, order, take: bool = True) -> Job:
        """The worker's wait (BLPOP) returns the job handed to it, first of all the
        lists it blocks on; ``take``: then the worker takes it (its heartbeat), as the
        worker does before it starts it."""
        woken = self.broker.wait_for_work(order, 0.01, worker)
        job = self.jobs[self.handed.pop(worker)]
        assert isinstance(woken, Claimed), f"{worker} waited, got {woken!r}; model: job {job.n}"
        assert woken.job_id == job.id and woken.owner == job.owner, (woken, job)
        assert woken.fields["status"] == "RUNNING" and woken.fields["payload"]
        assert int(woken.fields["attempts"]) == job.attempts == 1
        assert woken.fields["queue"] == job.queue
        assert int(woken.fields.get("priority", 0)) == job.priority
        RUN["handed jobs received"] += 1
        if take:
            self.op_take(worker, job, job.owner)
        return job

    def op_take(self, worker: str, job: Job, token: str) -> None:
        """The worker takes a job handed to it (``token``: its owner token then): its
        own from now on, unless the job went back meanwhile."""
        self.op_heartbeat(worker, {job.id: token})
        if job.place == RUNNING and job.owner == token:
            self.held[worker][job.id] = token
            RUN["handed jobs taken"] += 1

    def op_finish(self, worker: str, outcome: Outcome) -> None:
        t0 = self.clock()
        stored = self.broker.finish(outcome)
        t1 = self.clock()
        expected = self.m_finish(outcome, (t0, t1))
        self.drop_held(worker, outcome)
        assert stored is expected, f"finish stored {stored}, model {expected}"

    def op_heartbeat(self, worker: str, extra: dict[str, str], traced: bool = False) -> None:
        """``traced``: the worker sends a trace record for every job it names."""
        owned = {**self.held[worker], **extra}
        traces = {job_id: f"{token} RUNNING" for job_id, token in owned.items()} if traced else {}
        t0 = self.clock()
        lost, stopping = self.broker.heartbeat(worker, {}, owned, traces)
        t1 = self.clock()
        expected, to_stop = [], []
        for job_id, token in owned.items():
            job = self.jobs.get(job_id)
            if job is not None and job.place == RUNNING and job.owner == token:
                self.take(job, (t0, t1))
                job.trace = traces.get(job_id, job.trace)
                if job.stop:
                    to_stop.append(job_id)
            else:
                expected.append(job_id)
        assert lost == expected, f"heartbeat lost {lost}, model {expected}"
        assert stopping == to_stop, f"heartbeat: stop {stopping}, model {to_stop}"
        RUN["heartbeats naming jobs to stop"] += bool(stopping)
        for job_id in lost:
            self.held[worker].pop(job_id, None)
        # Seen now; the workers last seen an hour (a lease) ago leave {P}:workers.
        self.heartbeats = (self.heartbeats - self.silent) | {worker}
        self.silent.clear()
        self.records.add(worker)
        self.cursors.setdefault(worker, self.last_message)

    def op_report_progress(self, reports: list[tuple[str, str, str]]) -> None:
        """Progress written (job id, owner token, record): stored for each job RUNNING
        under that token, refused for any other (a late write, another's token)."""
        stored = self.broker.report_progress(reports)
        expected = []
        for job_id, token, record in reports:
            job = self.jobs.get(job_id)
            owned = job is not None and job.place == RUNNING and job.owner == token
            if owned:
                job.progress = record
            RUN["progress stored" if owned else "late progress refused"] += 1
            expected.append(owned)
        assert stored == expected, f"progress stored {stored}, model {expected}"

    def op_stop(self, job: Job | None, job_id: str) -> None:
        t0 = self.clock()
        reply = self.broker.stop(job_id, STOP_ERROR)
        expected = self.m_stop(job, (t0, self.clock()))
        assert reply == expected, f"stop of {job}: {reply}, model {expected}"
        RUN[f"stops answered {expected}"] += 1

    def op_take_stops(self, worker: str) -> None:
        """The worker's heartbeat takes the first id of its stop list."""
        taken = self.broker.wait_for_stops(worker, 0.01)
        entries = self.stop_lists.get(worker, [])
        want = tuple(entries.pop(0).split(" ", 1)) if entries else None
        assert taken == want, f"{worker} took stop {taken}, model {want}"

    def op_tick(
        self,
        scheduler: str,
        queues,
        batch: int,
        recover: bool,
        held: bool = False,
        in_grace: bool = False,
    ) -> None:
        """``held``: the step reaches Redis after the time it may recover leases by.
        ``in_grace``: its scheduler's earlier step a grace ago ran before any lease
        ran out (the clock's start), so every lease that ran out is left for later."""
        self.settle()  # due times and deadlines set earlier in the same rule
        before_delayed = [j for j in self.job_list(DELAYED) if j.queue in queues]
        t0 = self.clock()
        tick = self.broker.tick(
            scheduler,
            queues,
            batch=batch,
            lost_limit=LOST_LIMIT,
            lost_error=LOST_ERROR,
            recover=recover,
            recover_until_ms=t0 - 1 if held else t0 + 60_000,
            ran_out_by_ms=-1 if in_grace else None,
            grace_ms=GRACE_MS,
        )
        t1 = self.clock()
        assert tick.held == held, tick
        recover = recover and not held
        running = [j for j in self.job_list(RUNNING) if not j.handed]
        before_running = running if recover and not in_grace else []
        # Handed jobs not taken go back whatever the recovery's flags.
        before_handed = [j for j in self.job_list(RUNNING) if j.handed]
        pipe = self.r.pipeline(transaction=False)
        for job in before_delayed:
            pipe.zscore(self.keys.delayed(job.queue), job.id)
        for job in before_running + before_handed:
            pipe.zscore(self.lease_key(job), job.id)
        scores = pipe.execute()
        before = before_delayed + before_running + before_handed
        moved = {j.id for j, s in zip(before, scores, strict=True) if s is None}

        def predict(now: int):
            promoted, full = [], False
            for queue in queues:
                due = [j for j in before_delayed if j.queue == queue and j.due <= now]
                due = sorted(due, key=lambda j: (j.due, j.id))[:batch]
                promoted += due
                full = full or len(due) == batch
            expired = sorted(
                (j for j in before_running if j.deadline <= now), key=lambda j: (j.deadline, j.id)
            )[:batch]
            full = full or (recover and len(expired) == batch)
            untaken = sorted(
                (j for j in before_handed if j.deadline <= now), key=lambda j: (j.deadline, j.id)
            )[:batch]
            full = full or len(untaken) == batch
            return promoted, expired + untaken, full

        # The tick's clock reading lies in [t0, t1]; only a due time or deadline inside
        # that window can make a difference between the instants.
        inside = {j.due for j in before_delayed if t0 < j.due <= t1}
        inside |= {j.deadline for j in before_running + before_handed if t0 < j.deadline <= t1}
        instants = [t0, *sorted(inside)]
        for now in instants:
            promoted, expired, full = predict(now)
            if {j.id for j in promoted + expired} == moved:
                break
        else:
            raise AssertionError(
                f"tick moved {sorted(self.jobs[i].n for i in moved)}; no instant in "
                f"[{t0}, {t1}] explains it (model at {t0}: "
                f"{[j.n for j in predict(t0)[0] + predict(t0)[1]]})"
            )
        untaken = [j for j in expired if j.handed]
        expired = [j for j in expired if not j.handed]
        for job in promoted:
            self.push_ready(job)
        # The next due time is read before the recovery, whose failures may release
        # jobs into a delayed set (each wakes the scheduler if it is the first due).
        later = [j.due for j in self.job_list(DELAYED) if j.queue in queues]
        recovered = failed = 0
        for job in expired:
            self.leave_running(job)
            self.m_free_slot(job)
            job.lost += 1
            if job.lost > LOST_LIMIT:
                self.end(job, FAILED, (t0, t1), Err(LEASE_LOST))
                failed += 1
            elif self.requeue(job, (t0, t1)):
                recovered += 1
        for job in untaken:  # back uncounted: they never ran
            worker = (job.owner or "").split("/")[0]
            if self.handed.get(worker) == job.id:
                del self.handed[worker]  # its list is cleared
            self.leave_running(job)
            self.forget_attempt(job)
            self.requeue(job, (t0, t1))
        # Then the limits whose look is due; the next look counts for the next step.
        full = self.m_tick_looks(batch) or full
        later += [score for _, score in self.r.zrange(self.keys.limits, 0, 0, withscores=True)]
        self.m_trim_groups()
        # More cursors than live workers: a dead worker's cursor to drop.
        if recover and len(self.cursors) > len(self.heartbeats - self.silent):
            self.m_trim_broadcasts()
        model = (len(promoted), recovered, failed, len(untaken))
        assert (tick.promoted, tick.recovered, tick.failed, tick.handed_back) == model, (
            f"{tick}, model {model}"
        )
        overdue = False
        later += [j.deadline for j in self.job_list(RUNNING) if j.handed]
        if recover:
            # A lease that ran out and is still there: the next step is due a grace
            # after this one (t0 + GRACE_MS stands for it: see the bounds below).
            for job in (j for j in self.job_list(RUNNING) if not j.handed):
                overdue = overdue or job.deadline <= t0
                later.append(t0 + GRACE_MS if job.deadline <= t0 else job.deadline)
        assert tick.overdue == overdue, f"{tick}, model: overdue {overdue}"
        if full:
            assert tick.next_in == 0, f"a full batch: next_in {tick.next_in}"
        elif not later:
            assert tick.next_in is None, f"nothing left: next_in {tick.next_in}"
        else:
            nearest = min(later)
            assert tick.next_in is not None
            next_ms = round(tick.next_in * 1000)
            assert max(nearest - t1, 0) <= next_ms <= max(nearest - t0, 0), (
                f"next_in {tick.next_in} for {nearest} in [{t0}, {t1}]"
            )
        self.schedulers.add(scheduler)
        RUN["promoted"] += len(promoted)
        RUN["recovered"] += recovered
        RUN["failed by lost leases"] += failed
        RUN["handed jobs given back untaken"] += len(untaken)

    def op_cancel(self, job: Job, via_api: bool) -> None:
        t0 = self.clock()
        if via_api:
            try:
                self.backend.cancel(job.id)
                status: str | None = "CANCELLED"
            except NotCancellable:
                status = "not cancellable"
            except TaskResultDoesNotExist:
                status = None
        else:
            status = self.broker.cancel(job.id, CANCEL_ERROR)
        t1 = self.clock()
        if job.place == DELETED:
            expected = None
        elif self.m_cancel(job, Err(CANCELLED), (t0, t1)):
            expected = "CANCELLED"
        else:
            expected = "not cancellable" if via_api else job.status
        assert status == expected, f"cancel of job {job.n}: {status}, model {expected}"

    def op_operate(self, action: str, queue: str, ids: list[str], limit: int) -> None:
        t0 = self.clock()
        changed = self.broker.operate(action, queue, ids, limit)
        t1 = self.clock()
        expected = 0
        if action == "pause":
            expected = int(queue not in self.paused)
            self.paused.add(queue)
        elif action == "resume":
            expected = int(queue in self.paused)
            self.paused.discard(queue)
        else:
            if not ids:
                chosen = {
                    "empty": self.queue_order(queue),
                    "retry_failed": self.failed_order(queue),
                    "delete_failed": self.failed_order(queue),
                }.get(action, [])
                ids = [j.id for j in chosen[: limit or None]]
            for job_id in ids:
                job = self.jobs.get(job_id)
                if job is None or job.queue != queue:
                    continue
                if action in ("retry_failed", "delete_failed") and job.indexed:
                    job.indexed = False
                    if action == "delete_failed":
                        job.place, job.done = DELETED, []
                    else:
                        job.finished_at, job.result, job.waiters, job.done = None, None, False, []
                        job.stop = False
                        self.m_hold_unique_again(job)
                        self.push_ready(job)
                    expected += 1
                elif action == "run_now" and job.place == DELAYED:
                    self.push_ready(job)
                    expected += 1
                elif action == "empty" and job.place == QUEUED:
                    if job.fair is not None:
                        self.fair_drop(job)
                    if job.group is not None or job.then or job.unique:
                        # It ends first: its group still completes, its dependents fail,
                        # its unique key is free.
                        job.cancelled = True
                        self.end(job, FAILED, (t0, t1), Err(CANCELLED))
                    job.place = DELETED
                    expected += 1
        assert changed == expected, f"{action} {queue} {ids} {limit}: {changed}, model {expected}"

    def op_abandon(
        self, worker: str, handed_only: bool = False, keep: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """abandon; ``handed_only``: as a worker stopping while registered as idle,
        only the job handed to it and not taken goes back (its held jobs stay);
        ``keep``: the attempts (job id, owner token) it holds in other slots stay too."""
        t0 = self.clock()
        if handed_only:
            given = self.broker.abandon(worker, handed_only=True)
            expected = [j.id for j in self.m_give_back_handed(worker, (t0, self.clock()))]
            assert given == expected, f"give-back gave back {given}, model {expected}"
            RUN["handed jobs given back"] += len(given)
            return
        owners = self.owners()
        given = self.broker.abandon(worker, keep=keep)
        window = (t0, self.clock())
        self.check_kept(given, keep, owners)
        expected = [j.id for j in self.m_abandon(worker, window, frozenset(keep))]  # zset order
        assert given == expected, f"abandon gave back {given}, model {expected}"
        for job_id, token in list(self.held[worker].items()):
            if (job_id, token) in keep:
                RUN["jobs kept in hand by a give-back"] += 1
            else:
                del self.held[worker][job_id]

    def owners(self) -> dict[str, str | None]:
        return {j.id: j.owner for j in self.job_list(RUNNING)}

    def check_kept(self, given, keep, owners: dict[str, str | None]) -> None:
        """No attempt a give-back keeps is given back (``owners``: before it)."""
        kept = [job_id for job_id in given if (job_id, owners.get(job_id)) in set(keep)]
        assert not kept, f"gave back {self.names(kept)}, which it was told to keep"

    def op_watch(self, job: Job) -> None:
        status = self.broker.watch(job.id)
        if job.place == DELETED:
            expected = None
        else:
            expected = job.status
            if job.place != FINISHED:
                job.waiters = True
        assert status == expected, f"watch job {job.n}: {status}, model {expected}"
