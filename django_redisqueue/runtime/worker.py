"""The worker loop: finish the last job and claim the next in one call, run it.

One job at a time (``pool.py`` forks processes for ``--concurrency``); idle, it blocks
on BLPOP, about one command a second. Any Redis error is logged and waited out with
backoff; the outcome in hand is kept until Redis stores it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType

from django.db import close_old_connections

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core import tracing
from django_redisqueue.core.jobs import JobRecord
from django_redisqueue.core.registry import registry
from django_redisqueue.core.results import make_result, task_for
from django_redisqueue.exceptions import (
    InvalidPayload,
    LeaseLost,
    WorkerShutdown,
)
from django_redisqueue.observe.metrics import JobMetrics, MetricsRefused
from django_redisqueue.runtime import WORKER_LOGGER, attempts
from django_redisqueue.runtime.attempts import Finished
from django_redisqueue.runtime.broadcasts import Inbox
from django_redisqueue.runtime.event_loop import EventLoop
from django_redisqueue.runtime.heartbeat import Heartbeat
from django_redisqueue.runtime.idle import IDLE_MS, IdleStand
from django_redisqueue.runtime.memory import past_limit
from django_redisqueue.runtime.progress import ProgressWriter
from django_redisqueue.runtime.queue_order import QueueOrder
from django_redisqueue.runtime.scheduler_watch import SchedulerWatch
from django_redisqueue.runtime.stop_requests import StopRequests
from django_redisqueue.runtime.stopping import STOP_SIGNAL, StopToken
from django_redisqueue.runtime.unknown_tasks import for_a_worker_that_knows
from django_redisqueue.store.gateway import REDIS_ERRORS, Reconnector, reply_lost
from django_redisqueue.store.wire import AFTER_GROUP_PREFIX, RELEASE, Claimed, Outcome

logger = logging.getLogger(WORKER_LOGGER)


@dataclass(frozen=True, slots=True)
class _Claim:
    """What the loop's call answered: whether it stored the outcome sent, the job it
    claimed, whether it looked at the queues (not while ``receiving`` broadcasts), and
    whether it read the last broadcast's number."""

    stored: bool
    job: Claimed | None
    receiving: bool
    read_broadcasts: bool


# Seconds a stopped job's thread has to let go (its exception taken, its finally blocks
# run), or a blocked event loop to run again, before the worker gives up on them.
GIVE_UP_AFTER = 5.0
# Tries to store the last outcome when stopping while Redis fails.
FINISH_ATTEMPTS_ON_EXIT = 5
# With QUEUES empty (any name valid), how often a worker looks for new queues (s).
QUEUES_REFRESH = 1.0
# How often a busy worker's claim also reads the last broadcast's number (s): with
# every claim it would cost a command a job.
BROADCASTS_READ_EVERY = 0.1
# What sending the metrics may raise: it is logged, and the worker goes on.
METRICS_ERRORS: tuple[type[Exception], ...] = (MetricsRefused, *REDIS_ERRORS)


class Worker:
    def __init__(
        self,
        backend: RedisQueueBackend,
        queues: Sequence[str] | None = None,
        *,
        weights: Mapping[str, int] | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        max_memory: int | None = None,
        close_connections: bool = True,
        watch_scheduler: bool = True,
    ) -> None:
        self.backend = backend
        # A connection of its own: the heartbeat's calls never wait behind its BLPOP.
        self.broker = backend.broker.pinned()
        self.queues = list(queues or backend.queue_names)
        # No queue named and QUEUES empty: serve every queue used, looking for new ones.
        self.discover_queues = not self.queues
        self.queues_seen_at = float("-inf")
        self.order = QueueOrder(self.queues, weights)
        self.burst = burst
        self.max_jobs = max_jobs
        self.max_memory = max_memory  # MB of RSS, checked after each job
        self.over_memory = False
        # Jobs whose threads ignored a stop (blocked in C): given up, the process recycled.
        self.stuck: set[tuple[str, str]] = set()  # by attempt: (job id, owner token)
        self.loop_blocked = False  # a task blocked the event loop: given up (recycled)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.started_at = int(time.time() * 1000)
        self.jobs_done = 0
        self.threads = 1  # its slots: the jobs it runs at once (SlotWorker's N)
        self.stopping = False
        self.drained = False  # a burst worker out of work: its run ends
        self.uncertain = False  # the last call's reply was lost: it may have given a job
        self.current: Claimed | None = None  # the job running now
        self.attempt: tracing.Attempt | tracing.NotTraced = tracing.NOT_TRACED  # its span
        self.token: StopToken | None = None  # how the running task is stopped
        self.task_attempt: attempts.Attempt | None = None  # once its task is about to run
        self.woken_by = ""  # the queue whose wake-up token this worker took, to pass on
        self.idle = IdleStand(self.broker, self.worker_id)
        self.broadcasts_read_at = float("-inf")  # when a claim last read their number
        self.event_loop = EventLoop()  # the async def tasks', started by the first
        self.stop_requests = StopRequests(self.worker_id, backend.broker, self._stoppable)
        self.broadcasts = Inbox(
            self.worker_id, self.broker, backend.config, self._in_task, self.event_loop.call
        )
        self.metrics = JobMetrics() if backend.config.metrics else None
        # Off only in tests that run jobs inside their own transaction (testing.py).
        self.close_connections = close_connections
        # It says when no scheduler runs; not in run_jobs(), which is its own (testing.py).
        self.scheduler = SchedulerWatch(backend.queries) if watch_scheduler else None
        # What every attempt has around its task (attempts.py), in this order.
        self.hooks: list[attempts.Hook] = [
            attempts.LogLines(logger, self._retry_note),
            attempts.Signals(type(backend)),
            attempts.Around(self._in_task),
            attempts.TimeLimit(),
            ProgressWriter(backend.broker),
        ]
        if self.metrics is not None:
            self.hooks.append(attempts.Metrics(self.metrics))

    def run(self) -> None:
        """Run jobs until stopped (``stop()``), out of work (burst), max_jobs or
        max_memory."""
        self.drained = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(STOP_SIGNAL, self._on_stop_signal)
        heartbeat = Heartbeat(self)
        heartbeat.start()
        logger.info(
            "Worker %s serving %s (backend %r)",
            self.worker_id,
            ", ".join(self.queues) or "every queue used",
            self.backend.alias,
        )
        if not self.burst and self.scheduler is not None:  # (a burst worker runs none)
            self.scheduler.warn_at_start(self.worker_id, self.backend.alias)
        backoff = Reconnector(logger, f"Worker {self.worker_id}", where=self.broker.describe)
        try:
            self.register()
        except REDIS_ERRORS as exc:
            backoff.failed(exc)  # the heartbeat registers it once Redis answers
        try:
            self._loop(backoff)
        finally:
            heartbeat.stopped.set()
            self.event_loop.close()
            self.send_metrics()
            self.idle.give_back()
            with contextlib.suppress(*REDIS_ERRORS):  # else its record expires by itself
                self.broker.unregister_worker(self.worker_id)
            self.broker.close()
            tracing.flush()  # last: a pool's worker process exits without Python's clean-up
        logger.info("Worker %s stopped after %d job(s)", self.worker_id, self.jobs_done)

    def _loop(self, backoff: Reconnector) -> None:
        """Store the last outcome and claim the next job, in one call; between jobs,
        receive broadcasts or wait for work; run the job; again, until stopping with no
        outcome left to store."""
        finished: Finished | None = None
        while True:
            wanted = not self._should_stop()
            if not wanted and finished is None:
                self._recover_before_the_end()
                return
            try:
                if self.uncertain:  # the last call's reply was lost: it may have given a job
                    finished = self._recover_claim(finished)
                    self.uncertain = False
                claim = self._store_and_claim(finished, wanted)
                backoff.succeeded()
            except REDIS_ERRORS as exc:  # refused (nothing changed), or its reply lost
                if reply_lost(exc):  # set, never read and written back: a slot may set it too
                    self.uncertain = True
                if self._give_up(wanted, backoff, exc):
                    return
                continue
            if finished is not None:
                self._report(finished, claim.stored)
                finished = None
            job = claim.job or self._between_jobs(claim, wanted, backoff)
            if job is not None:
                finished = self.execute(job)
                self.jobs_done += 1
                self._look_at_memory()

    def _look_at_memory(self) -> None:
        """After a job: once past ``max_memory``, the worker recycles. The flag is set,
        never read and written back: the slots of a SlotWorker look at once, and one
        under the limit must not erase another's finding."""
        if not self.over_memory and past_limit(self.max_memory, self.worker_id):
            self.over_memory = True

    def _store_and_claim(self, finished: Finished | None, wanted: bool) -> _Claim:
        """Store the outcome in hand and claim the next job, in one call: from the
        queues in this turn's order, none while stopping or with broadcasts to receive
        (the worker runs those holding no job, so no lease waits on them). Redis errors
        propagate."""
        self._refresh_queues()
        receiving = self.broadcasts.waiting
        queues = self.order.next() if wanted and not receiving else []
        now = time.monotonic()
        reading = now - self.broadcasts_read_at >= BROADCASTS_READ_EVERY
        may_wait = wanted and not self.burst and bool(queues)
        stored, job = self.broker.claim(
            queues,
            self.worker_id,
            finished.outcome if finished else None,
            woken_by=self.woken_by,
            broadcasts=reading,
            take_handed=self.idle.registered and bool(queues),
            idle_ms=IDLE_MS if may_wait else None,
        )
        self.woken_by = ""
        if queues:
            self.idle.claimed(job is None and may_wait, now)
        if reading:
            self.broadcasts_read_at = now
        return _Claim(bool(stored), job, receiving, reading)

    def _between_jobs(self, claim: _Claim, wanted: bool, backoff: Reconnector) -> Claimed | None:
        """After a claim that found no job: learn of the broadcasts, run them, or wait
        for work, which may hand a job over; or, out of work in burst mode, stop."""
        if not claim.read_broadcasts:
            # Before it waits or stops, a worker learns of the broadcasts.
            self.broadcasts_read_at = float("-inf")
            return None
        if self.broadcasts.waiting:
            self.idle.give_back()  # busy with them: nothing is handed to it
            self.broadcasts.receive(self.queues, backoff)
            return None
        if claim.receiving:  # the claim did not look at the queues
            return None
        if not wanted or self.burst:
            self.drained = self.burst
            return None
        try:
            return self._wait_for_work()
        except REDIS_ERRORS as exc:
            # A lost reply may have carried a handed job.
            if reply_lost(exc):  # set, never read and written back: a slot may set it too
                self.uncertain = True
            backoff.failed(exc)
            return None

    def _give_up(self, wanted: bool, backoff: Reconnector, exc: Exception) -> bool:
        """Back off after a Redis error; True when stopping and out of tries."""
        if not wanted and backoff.failures >= FINISH_ATTEMPTS_ON_EXIT:
            logger.error(
                "Worker %s: could not store its last outcome (%s); the job runs again "
                "once its lease runs out",
                self.worker_id,
                exc,
            )
            return True
        backoff.failed(exc)
        return False

    def _recover_claim(self, finished: Finished | None) -> Finished | None:
        """After a lost reply (of a claim, a wait or a take): store the outcome in hand
        (again: fencing refuses a repeat), then give back any job the lost call gave
        this worker, so that it runs at once and does not count as lost."""
        if finished is not None:
            self._report(finished, self.broker.finish(finished.outcome), repeated=True)
        # The jobs of other slots stay: the lost call cannot have given them.
        given_back = self.broker.abandon(self.worker_id, keep=self.held())
        self.idle.registered = False
        if given_back:
            logger.warning(
                "Worker %s: gave back job(s) %s, claimed or handed to it by a call whose "
                "reply was lost",
                self.worker_id,
                ", ".join(given_back),
            )
        return None

    def _recover_before_the_end(self) -> None:
        """The loop ends with no outcome to store: give back what a call whose reply was
        lost may have given (else it waits RUNNING for its lease, counted as lost)."""
        if self.uncertain:
            with contextlib.suppress(*REDIS_ERRORS):  # else its lease runs out
                self._recover_claim(None)
                self.uncertain = False

    def in_hand(self) -> list[tuple[Claimed, str]]:
        """The job running now (none or one), with its attempt's trace record."""
        job = self.current
        return [(job, self.attempt.record)] if job is not None else []

    def held(self) -> list[tuple[str, str]]:
        """The attempts this worker holds, (job id, owner token), from their claim until
        their outcome is stored (a one-slot worker's loop holds none when it recovers a
        lost reply)."""
        return [(job.job_id, job.owner) for job, _ in self.in_hand()]

    @property
    def lease(self) -> float:
        """Seconds a claimed job stays this worker's without a heartbeat."""
        return self.backend.config.lease

    def register(
        self, owned: Mapping[str, str] | None = None, traces: Mapping[str, str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Tell the dashboard this worker is alive and what it serves, and extend the
        leases of the jobs it ``owned`` (storing their attempts' trace records,
        ``traces``); return the ids it no longer owns, and those asked to stop."""
        info: dict[str, str | int] = {
            "queues": ",".join(self.queues),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": self.started_at,
            "jobs_done": self.jobs_done,
            "slots": self.threads,
        }
        return self.backend.broker.heartbeat(self.worker_id, info, owned or {}, traces)

    def send_metrics(self) -> None:
        """Add the jobs counted since the last call to Redis's metrics (kept on failure)."""
        if self.metrics is None:
            return
        try:
            self.metrics.send(self.backend)
        except METRICS_ERRORS as exc:
            logger.debug("Worker %s: metrics not sent (%s)", self.worker_id, exc)

    def _retry_note(self, status: str) -> str:
        return self.scheduler.retry_note(status) if self.scheduler else ""

    def _should_stop(self) -> bool:
        return self.stopping or self.drained or self.recycled

    @property
    def recycled(self) -> bool:
        """True once the worker stops to be replaced by a fresh process: it has run
        ``max_jobs`` jobs, grown past ``max_memory``, or given up a job whose thread is
        stuck."""
        if self.over_memory or self.stuck or self.loop_blocked:
            return True
        return self.max_jobs is not None and self.jobs_done >= self.max_jobs

    def _refresh_queues(self) -> None:
        """With QUEUES empty and no queue named: serve every queue jobs were enqueued
        to, in alphabetical order, looking again at most every QUEUES_REFRESH s."""
        if not self.discover_queues or time.monotonic() - self.queues_seen_at < QUEUES_REFRESH:
            return
        self.queues_seen_at = time.monotonic()
        queues = self.backend.queries.known_queues()
        if queues != self.queues:
            self.queues = queues
            self.order = QueueOrder(queues)
            logger.info("Worker %s serving %s", self.worker_id, ", ".join(queues) or "nothing yet")

    def _wait_for_work(self) -> Claimed | None:
        """Stand idle (idle.py): return the job handed over, once taken, or None to
        claim again (woken by a token, which it passes on: ``woken_by``)."""
        if not self.queues:  # QUEUES empty and nothing enqueued yet: look again soon
            time.sleep(QUEUES_REFRESH)
            return None
        woken = self.idle.wait(self.queues, lambda: self.stopping)
        if isinstance(woken, str):
            self.woken_by = woken
            return None
        return woken

    @contextlib.contextmanager
    def _in_task(self) -> Iterator[StopToken]:
        """Around a task's run (a job's, or a broadcast's): Django's connections checked
        before and after, as around a request, and its stop token running."""
        token = self.token or StopToken()
        self.token = token
        self._close_old_connections()
        try:
            with token.running():
                yield token
        finally:
            self._close_old_connections()
            if self.current is None:  # a broadcast's: it ends with it
                self.token = None

    def _close_old_connections(self) -> None:
        """Before and after each task, as Django does around each request."""
        if self.close_connections:
            close_old_connections()

    def _report(self, finished: Finished, stored: bool, *, repeated: bool = False) -> None:
        outcome = finished.outcome
        if not stored and repeated:
            logger.info(
                "Job %s: outcome %s sent again after a lost reply; already stored, or "
                "the lease ran out",
                outcome.job_id,
                outcome.status,
            )
        elif not stored:
            logger.warning(
                "Job %s: its lease ran out before it finished; this outcome (%s) is "
                "not stored: the job's new owner decides it",
                outcome.job_id,
                outcome.status,
            )
        for hook in reversed(self.hooks):
            hook.stored(finished, stored)

    def execute(self, claimed: Claimed) -> Finished:
        """Run one claimed job; never raises for anything the job or its payload does."""
        self.current, self.token = claimed, StopToken()
        self.stop_requests.starting(claimed, self.token)
        config = self.backend.config
        record = JobRecord.parse(claimed.job_id, claimed.fields, config.max_payload_bytes)
        try:
            with tracing.attempt(record, self.worker_id) as self.attempt:
                finished = self._execute(claimed, record)
                outcome = finished.outcome
                trace = self.attempt.ended(outcome.status, finished.error, outcome.error)
            if trace:  # kept with the outcome, for the next attempt to link to
                finished = replace(finished, outcome=replace(outcome, trace=trace))
            return finished
        except LeaseLost:
            return self._abandoned(claimed)
        finally:
            self.current, self.token, self.task_attempt = None, None, None

    def _execute(self, claimed: Claimed, record: JobRecord) -> Finished:
        began = time.perf_counter()
        envelope = record.envelope
        try:
            if envelope is None:
                raise InvalidPayload(record.problem)
            if registry.get(envelope.task_path) is None:
                return Finished(for_a_worker_that_knows(claimed, envelope, self.worker_id))
        except InvalidPayload as exc:  # (UnknownTask too, past its wait)
            return attempts.unreadable(claimed, envelope, exc, logger)
        args = envelope.args
        after = claimed.fields.get("after", "")
        if after.startswith(AFTER_GROUP_PREFIX):  # a callback: the members' results first
            traces: list[str] | None = [] if self.attempt.record else None
            group_id = after.removeprefix(AFTER_GROUP_PREFIX)
            try:
                results = self.backend.group_results(group_id, traces)
            except REDIS_ERRORS as exc:  # not the task's failure: give it back, unrun
                logger.warning(
                    "Job %s: its group's results unread (%s); given back", claimed.job_id, exc
                )
                return Finished(Outcome(claimed.job_id, claimed.owner, RELEASE))
            self.attempt.link_members(traces or ())
            args = [results, *args]
        task = task_for(envelope, self.backend.alias, self.backend.default_queue)
        result = make_result(self.backend.alias, task, record)
        assert self.token is not None
        attempt = attempts.Attempt(claimed, record, envelope, task, result, self.token, began)
        self.task_attempt = attempt
        return attempts.run(
            attempt,
            args,
            self.hooks,
            self.backend.config.max_payload_bytes,
            self.event_loop.call,
        )

    def lease_lost(self, job: Claimed) -> None:
        """Called by the heartbeat: Redis says ``job`` is no longer ours (its lease ran
        out and it was recovered). Stop it: its outcome would be refused anyway."""
        self._stop_lost(job, self.token if self.current is job else None)

    def give_up_stuck(self) -> bool:
        """Called by the heartbeat: give up the jobs that cannot end. Here, the async
        jobs waiting for an event loop a task has blocked GIVE_UP_AFTER seconds are
        given back (``EventLoop.give_back_if_blocked``) and the process recycles; True if
        it did. A sync task runs on the main thread, where the stop's signal gets through."""
        if self.loop_blocked or not self.event_loop.give_back_if_blocked(GIVE_UP_AFTER):
            return False
        self.loop_blocked = True
        logger.error(
            "Worker %s: a task has blocked the event loop of its async tasks for %.0f s "
            "or more (a sync call inside an async def?); giving back the async jobs "
            "that wait for it, and this worker process exits once its other jobs are done",
            self.worker_id,
            GIVE_UP_AFTER,
        )
        return True

    def _stop_lost(self, job: Claimed, token: StopToken | None) -> None:
        if token is not None and token.stop(LeaseLost(f"the lease of job {job.job_id} was lost")):
            logger.warning(
                "Job %s: lease lost (the worker stalled or Redis failed for longer than "
                "the lease); stopping it, as its outcome would be refused: it runs again "
                "elsewhere",
                job.job_id,
            )

    def _stoppable(self) -> list[tuple[Claimed, StopToken]]:
        """The jobs running now, each with its task's stop token."""
        job, token = self.current, self.token
        return [(job, token)] if job is not None and token is not None else []

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.token is not None:
            self.token.deliver()

    def _abandoned(self, claimed: Claimed) -> Finished:
        # Sent anyway, fenced: Redis refuses it, as the job has another owner now.
        return Finished(Outcome(claimed.job_id, claimed.owner, RELEASE))

    def stop(self) -> None:
        """Finish the job in hand, take no new one, and return from ``run()``."""
        self.stopping = True

    def install_signal_handlers(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """Stop gracefully on the first of ``signals``; on the second, give the running
        job back to its queue and stop at once."""
        for signum in signals:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            running = [token for _, token in self._stoppable() if token.is_running]
            if running:
                logger.warning(
                    "Worker %s: %s again, giving the running job%s back to %s queue",
                    self.worker_id,
                    name,
                    *(("", "its") if len(running) == 1 else ("s", "their")),
                )
            for token in running:
                token.stop(WorkerShutdown())
            return
        # Stop first: a second signal may arrive while this one is being logged.
        self.stop()
        logger.info(
            "Worker %s: %s received, finishing the job in hand and stopping "
            "(send it again to give the job back and stop now)",
            self.worker_id,
            name,
        )
