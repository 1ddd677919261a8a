"""The core of the protocol model: the moves the shared Lua files make to a job (queued or
delayed, claimed, finished, retried, given back, cancelled, ended), Redis's clock read
around each call, real time let pass between steps, and what a script decided with its
own clock read back."""

from __future__ import annotations

import json
import time

from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.store.wire import RELEASE, RETRY, Outcome
from tests.support.model.harness import FAR, RUN, snapshot
from tests.support.model.protocol.records import (
    DELAYED,
    DELETED,
    DEPENDENCY,
    FAIR_LOOKS,
    FINISHED,
    IDLE_QUEUES,
    PARKED,
    QUEUED,
    RUNNING,
    SOON,
    STOPPED,
    VALUE_ERROR,
    WAITING,
    Err,
    Job,
    Pending,
)


class CoreModel:
    """The moves of the jobs ProtocolMachine (machine.py) keeps, as the scripts make
    them."""

    def count(self, name: str) -> None:
        RUN[name] += 1

    def take_snapshot(self) -> dict[str, object]:
        return snapshot(self.r)

    # Redis's clock, read around each call: the window in which its script ran.

    def clock(self) -> int:
        now = super().clock()
        self.last_clock = max(self.last_clock, now)
        return now

    def let_time_pass(self) -> None:
        """Between two steps, Redis's clock moves past every due time set SOON ahead
        (of a delayed job, or of a waiting one, to be released later), and past the
        last ms a step has seen, so that no two steps share a ms: then no step's result
        depends on how fast the previous ones ran (due or not yet, ties between finish
        times or lease deadlines), and a failing sequence replays."""
        near = self.started + FAR // 2
        dues = [j.due for j in self.job_list(DELAYED)]
        dues += [j.run_after for j in self.job_list(WAITING)]
        target = max([self.last_clock, *(due for due in dues if due and due < near)])
        ahead = target - self.clock()
        if ahead > 1:
            time.sleep(min(ahead, 2 * SOON) / 1000)
            RUN["sleeps"] += 1
        while self.clock() <= target:
            time.sleep(0.0002)

    # The model's moves, as the shared Lua files (store/lua/lib/) make them.

    def job_list(self, *places: str) -> list[Job]:
        return [j for j in self.jobs.values() if not places or j.place in places]

    def queue_order(self, queue: str) -> list[Job]:
        ready = [j for j in self.jobs.values() if j.place == QUEUED and j.queue == queue]
        return sorted(ready, key=lambda j: (-j.priority, j.seq))

    def failed_order(self, queue: str) -> list[Job]:
        failed = [j for j in self.jobs.values() if j.indexed and j.queue == queue]
        return sorted(failed, key=lambda j: (j.finished_at, j.id))

    def push_ready(self, job: Job) -> None:
        """To the back of its priority in its queue."""
        self.seq += 1
        job.seq, job.place, job.due = self.seq, QUEUED, None
        if job.fair is not None:
            self.fair_add(job, back=False)

    def requeue(self, job: Job, window: tuple[int, int] | None = None) -> bool:
        """Back to the place it had in its queue; a job asked to stop ends FAILED with
        the stop's error instead (``window``: the call's), and False says so."""
        if job.stop:
            assert window is not None, f"{job} asked to stop, going back"
            self.end(job, FAILED, window, Err(STOPPED))
            RUN["stopped jobs ended instead of going back"] += 1
            return False
        job.place = QUEUED
        if job.fair is not None:
            self.fair_add(job, back=True)
        return True

    def push_delayed(self, job: Job, due: int | None, window: tuple[int, int]) -> None:
        job.place, job.due, job.due_window = DELAYED, due, window

    def place(self, job: Job, due: int, window: tuple[int, int]) -> None:
        """Queue a job due at ``due`` (0: now), or delay it, as a script whose clock
        read some instant of ``window`` did: inside the window, as Redis did."""
        t0, t1 = window
        delayed = due > t1
        if t0 < due <= t1:
            delayed = self.r.zscore(self.keys.delayed(job.queue), job.id) is not None
        if delayed:
            self.push_delayed(job, due, (due, due))
        else:
            self.push_ready(job)

    def leave_running(self, job: Job) -> None:
        job.owner, job.deadline, job.handed = None, None, False

    def lease_key(self, job: Job) -> str:
        """The set that holds a RUNNING job's deadline."""
        return self.keys.handed if job.handed else self.keys.running

    def take(self, job: Job, window: tuple[int, int]) -> None:
        """A handed job taken by its worker (its heartbeat or its claim): under the
        worker's lease from then on."""
        job.handed, job.deadline = False, None
        job.deadline_window = (window[0] + self.lease_ms, window[1] + self.lease_ms)

    def forget_attempt(self, job: Job) -> None:
        job.attempts = max(job.attempts - 1, 0)
        if job.progress is not None:
            try:
                attempt = json.loads(job.progress).get("attempt")
            except (ValueError, AttributeError):
                attempt = None
            if type(attempt) is int and attempt <= job.attempts:
                RUN["progress of the attempt before kept"] += 1
            else:
                RUN["progress forgotten with its attempt"] += 1
                job.progress = None
        if job.workers:
            job.workers.pop()

    def end(
        self,
        job: Job,
        status: str,
        window: tuple[int, int],
        error: Err | None,
        result: str = "",
    ) -> None:
        """record_outcome: the job's end, then every waiting job it fails in turn."""
        pending: list[Pending] = []
        self.store_outcome(job, status, window, error, pending, result)
        self.fail_pending(pending, window)

    def store_outcome(
        self,
        job: Job,
        status: str,
        window: tuple[int, int],
        error: Err | None,
        pending: list[Pending],
        result: str = "",
        root: str | None = None,
    ) -> None:
        never_ran = job.place == WAITING
        job.place, job.final = FINISHED, status
        self.m_release_unique(job)
        job.finished_at, job.finish_window = None, window
        if status == FAILED and not job.cancelled and not never_ran:
            job.indexed = True
        if error is not None:
            job.errors.append(error)
        if result:
            job.result = result
        self.stats[("failed:" if status == FAILED else "ok:") + job.queue] += 1
        if job.waiters:
            job.done.append(status)
        if job.group is not None:
            self.count_in_group(job, status, window, pending)
        then, job.then = job.then, []  # the list and the field go
        for next_id in then:
            if status == SUCCESSFUL:
                self.release(self.jobs[next_id], window)
            else:
                origin = root or job.id
                pending.append(Pending(next_id, Err(DEPENDENCY, job.id, origin), root=origin))

    def m_cancel(self, job: Job | None, error: Err, window: tuple[int, int]) -> bool:
        """cancel_job: a READY job (queued, delayed, waiting or parked) ends FAILED,
        cancelled."""
        if job is None or job.place not in (QUEUED, DELAYED, WAITING, PARKED):
            return False
        if job.place == QUEUED and job.fair is not None:
            self.fair_drop(job)
        job.cancelled = True
        self.end(job, FAILED, window, error)
        return True

    def m_finish(self, outcome: Outcome | None, window: tuple[int, int]) -> bool | None:
        if outcome is None:
            return None
        job = self.jobs.get(outcome.job_id)
        if job is None or job.place != RUNNING or job.owner != outcome.owner:
            return False
        self.leave_running(job)
        self.m_free_slot(job)
        if outcome.trace:
            job.trace = outcome.trace
        t0, t1 = window
        if outcome.status in (RETRY, RELEASE) and job.stop:  # it does not run again
            self.end(job, FAILED, window, Err(VALUE_ERROR if outcome.error else STOPPED))
            RUN["stopped jobs ended instead of going back"] += 1
        elif outcome.status == RETRY:
            job.errors.append(Err(VALUE_ERROR))
            self.push_delayed(job, None, (t0 + outcome.retry_in_ms, t1 + outcome.retry_in_ms))
        elif outcome.status == RELEASE and outcome.retry_in_ms > 0:
            # Given back for later (a task this worker does not know): in its delayed set.
            self.forget_attempt(job)
            self.push_delayed(job, None, (t0 + outcome.retry_in_ms, t1 + outcome.retry_in_ms))
        elif outcome.status == RELEASE:
            self.forget_attempt(job)
            self.requeue(job, window)
        else:
            error = Err(VALUE_ERROR) if outcome.error else None
            self.end(job, outcome.status, window, error, outcome.result)
        return True

    def m_claim(
        self,
        queues,
        worker: str,
        window: tuple[int, int],
        take: bool = False,
        register: bool = False,
    ) -> Job | None:
        """The first job of the first unpaused queue; one over its limit is parked, and
        the next one is taken. ``take``: the worker's registration as idle ends, and
        the job handed to it meanwhile, if any, is the one claimed. ``register``:
        finding none, it registers as idle on its queues (in that order)."""
        if take and queues:
            self.idle.pop(worker, None)
            handed = self.handed.pop(worker, None)
            if handed is not None:
                self.take(self.jobs[handed], window)
                return self.jobs[handed]
        job = self.m_claim_from(queues, worker, window)
        if job is None and register and queues:
            self.registrations += 1
            self.idle[worker] = (self.registrations, tuple(queues)[:IDLE_QUEUES])
            self.idle_orders[worker] = tuple(queues)
            if len(queues) > IDLE_QUEUES:
                self.idle_wide = True
                self.count("registered idle, wide")
            self.count("registered idle")
        return job

    def m_start(self, job: Job, worker: str, window: tuple[int, int]) -> None:
        """start_job: RUNNING under ``worker``'s lease, its attempt counted."""
        self.claims += 1
        job.claim_order = self.claims
        if job.limit:
            self.m_take_limit(job, window)
        job.attempts += 1
        job.owner = job.token = f"{worker}/{job.attempts}"
        job.workers.append(worker)
        job.scored = True
        job.entry = False  # start_job writes its hash
        job.place, job.deadline = RUNNING, None
        job.deadline_window = (window[0] + self.lease_ms, window[1] + self.lease_ms)
        self.issued.append((job.id, job.owner))

    def m_hand_queued(self, new: list[Job], window: tuple[int, int]) -> int:
        """After one enqueue call stored ``new``: for each queue it made jobs READY in
        (in that order) that holds only those and is not paused, its first jobs go, one
        each, to the latest registered idle workers whose claim would take them first
        (every queue before it in their order empty or paused), until one has a
        limit. Returns how many were handed."""
        ids, handed = {j.id for j in new}, 0
        for queue in dict.fromkeys(j.queue for j in new if j.place == QUEUED):
            looks = [FAIR_LOOKS]
            while queue not in self.paused:
                ready = self.queue_order(queue)
                if not ready or any(j.id not in ids for j in ready):
                    break
                worker = self.idle_worker_for(queue)
                if worker is None:
                    break
                job = self.next_in(queue, looks)
                if job.limit:  # left for a claim, at its place
                    if job.fair is not None:
                        self.fair_add(job, back=True)
                    break
                del self.idle[worker]
                self.m_start(job, worker, window)
                job.handed, job.handed_window = True, window
                job.deadline_window = (window[0] + self.handed_ms, window[1] + self.handed_ms)
                self.handed[worker] = job.id
                handed += 1
        return handed

    def idle_on(self, queue: str) -> bool:
        """Whether a worker stands idle on ``queue``: registered on it, or serving it
        past the queues it registered on."""
        return any(queue in self.idle_orders[worker] for worker in self.idle)

    def idle_worker_for(self, queue: str) -> str | None:
        for worker, (_, order) in sorted(self.idle.items(), key=lambda item: -item[1][0]):
            if queue not in order:
                continue
            before = order[: order.index(queue)]
            if all(q in self.paused or not self.queue_order(q) for q in before):
                return worker
        return None

    def m_claim_from(self, queues, worker: str, window: tuple[int, int]) -> Job | None:
        looks = [FAIR_LOOKS]  # the claim's, for every fair queue it meets
        for queue in queues:
            while queue not in self.paused:
                job = self.next_in(queue, looks)
                if job is None:
                    break
                if job.limit and not self.m_limit_room(job.limit):
                    self.m_park(job)
                    continue
                self.m_start(job, worker, window)
                return job
        return None

    def m_abandon(
        self, worker: str, window: tuple[int, int], keep: frozenset[tuple[str, str]] = frozenset()
    ) -> list[Job]:
        """Every job the worker owns goes back, but the attempts it ``keep``s, (job id,
        owner token) pairs (running in its other slots)."""
        mine = [
            j
            for j in self.job_list(RUNNING)
            if j.owner is not None
            and j.owner.startswith(worker + "/")
            and (j.id, j.owner) not in keep
        ]
        # The running set's order, then the handed set's.
        mine.sort(
            key=lambda j: (j.handed, j.deadline if j.deadline is not None else FAR * 1000, j.id)
        )
        self.idle.pop(worker, None)  # its registration ends; a job handed goes back
        self.handed.pop(worker, None)
        for job in mine:
            self.leave_running(job)
            self.m_free_slot(job)
            self.forget_attempt(job)
            self.requeue(job, window)
        return mine

    def m_give_back_handed(self, worker: str, window: tuple[int, int]) -> list[Job]:
        """A worker that stops while registered as idle: its registration ends, and the
        job handed to it meanwhile, if it has not taken it, goes back (no other job of
        its is looked at)."""
        self.idle.pop(worker, None)
        handed = self.handed.pop(worker, None)
        if handed is None:
            return []
        job = self.jobs[handed]
        self.leave_running(job)
        self.m_free_slot(job)
        self.forget_attempt(job)
        self.requeue(job, window)
        return [job]

    def m_stop(self, job: Job | None, window: tuple[int, int]) -> str | None:
        """stop: a RUNNING job is asked to stop (its worker's stop list names it); one
        handed and not taken ends FAILED now; another's status is the answer."""
        if job is None or job.place == DELETED:
            return None
        if job.place != RUNNING:
            return job.status
        job.stop = True
        worker = (job.owner or "").split("/")[0]
        if not job.handed:
            self.stop_lists.setdefault(worker, []).append(f"{job.id} {job.owner}")
            return "STOPPING"
        if self.handed.get(worker) == job.id:
            del self.handed[worker]
        self.leave_running(job)
        self.m_free_slot(job)
        self.forget_attempt(job)
        self.requeue(job, window)
        return "STOPPED"

    # Reading back what a script decided with its own clock.

    def settle(self) -> None:
        """Learn the exact due times, lease deadlines and finish times the last step set,
        checking each lies in the window of the call that set it."""
        for job in self.jobs.values():
            if job.place == DELAYED and job.due is None:
                score = self.r.zscore(self.keys.delayed(job.queue), job.id)
                if score is not None:
                    lo, hi = job.due_window
                    assert lo <= score <= hi, f"job {job.n}: due {score} not in {job.due_window}"
                    job.due = int(score)
            elif job.place == RUNNING and job.deadline is None:
                score = self.r.zscore(self.lease_key(job), job.id)
                if score is not None:
                    lo, hi = job.deadline_window
                    assert lo <= score <= hi, f"job {job.n}: lease {score} not in {lo}..{hi}"
                    job.deadline = int(score)
            elif job.place == FINISHED and job.finished_at is None:
                stored = self.r.hget(self.keys.job(job.id), "finished_at")
                if stored is not None:
                    lo, hi = job.finish_window
                    assert lo <= int(stored) <= hi, f"job {job.n}: finished_at {stored}"
                    job.finished_at = int(stored)
        self.settle_starts()
