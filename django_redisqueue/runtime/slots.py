"""A worker process that runs several jobs at once: ``runworker --threads N``.

The loop (the main thread) claims a job whenever one of N slots is free and hands it to
a slot's thread, which runs it as a one-slot worker does (``Worker.execute``), then
stores its outcome and claims its next job in one call until there is no work or the
loop has something to do first. The design: docs/architecture.md, "Many jobs in one
process".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core import tracing
from django_redisqueue.runtime import WORKER_LOGGER, attempts
from django_redisqueue.runtime.attempts import Finished
from django_redisqueue.runtime.idle import WAIT_TIMEOUT
from django_redisqueue.runtime.stopping import StopToken
from django_redisqueue.runtime.worker import BROADCASTS_READ_EVERY, GIVE_UP_AFTER, Worker
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS, Reconnector, reply_lost
from django_redisqueue.store.wire import Claimed

logger = logging.getLogger(WORKER_LOGGER)
T = TypeVar("T")


class _Slot:
    """What a thread of the worker is running: its job, its stop token, its trace."""

    def __init__(self, job: Claimed | None = None) -> None:
        # The worker's from its claim until its outcome is stored: its lease renewed,
        # never given back after a lost reply. ``current`` only while it runs.
        self.job = job
        self.current: Claimed | None = None
        self.token: StopToken | None = None
        self.attempt: tracing.Attempt | tracing.NotTraced = tracing.NOT_TRACED
        self.task_attempt: attempts.Attempt | None = None


class _Gate:
    """Many threads pass at once, or one closes it and is alone: the slots' claims side
    by side, each a round trip, and the loop's give-back, which none may overlap."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._passing = 0
        self._closed = False

    @contextlib.contextmanager
    def passing(self) -> Iterator[None]:
        with self._changed:
            while self._closed:
                self._changed.wait()
            self._passing += 1
        try:
            yield
        finally:
            with self._changed:
                self._passing -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        """Only the loop's thread closes it."""
        with self._changed:
            self._closed = True
            while self._passing:
                self._changed.wait()
        try:
            yield
        finally:
            with self._changed:
                self._closed = False
                self._changed.notify_all()


class _OfTheThread(Generic[T]):
    """An attribute Worker reads and writes that is each thread's own: the job it runs,
    its stop token, its trace (kept in the thread's ``_Slot``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, worker: SlotWorker, owner: type | None = None) -> T:
        return cast(T, getattr(worker._slot(), self.name))

    def __set__(self, worker: SlotWorker, value: T) -> None:
        setattr(worker._slot(), self.name, value)


class SlotWorker(Worker):
    """A worker that runs up to ``threads`` jobs at once, each on a thread of its own."""

    def __init__(
        self,
        backend: RedisQueueBackend,
        queues: Sequence[str] | None = None,
        *,
        threads: int,
        weights: Mapping[str, int] | None = None,
        **options: Any,
    ) -> None:
        # Before Worker's own: it sets the job, token and trace, which are each thread's.
        self._local = threading.local()
        # By attempt, (job id, owner token): a slot whose job's lease ran out may still
        # run it when another claims the job again.
        self._running: dict[tuple[str, str], _Slot] = {}
        self._changed = threading.Condition()  # a job taken into a slot, or ended
        # The slots' claims, each from its call to its job in ``_running``, and the
        # loop's give-back after a lost reply (which keeps the jobs in ``_running``).
        self._claims = _Gate()
        # The attempts whose outcome a stopping slot could not store (Redis failing):
        # still this worker's in Redis, their leases to run out; never given back.
        self._unstored: set[tuple[str, str]] = set()
        # Each slot thread's database connections, by thread, to close as the slots end.
        self._databases: dict[int, Sequence[BaseDatabaseWrapper]] = {}
        super().__init__(backend, queues, weights=weights, **options)
        self.threads = threads
        self._free = threading.Semaphore(threads)

    def _slot(self) -> _Slot:
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = _Slot()
        return slot

    def _spare_broker(self) -> contextlib.AbstractContextManager[Broker]:
        """A broker on a connection no other slot is calling on (``Broker.spares``):
        not the pool's, whose hand-over takes a lock and system calls that each hand
        the GIL to another slot; nor one a slot, which would hold as many connections
        as slots where the calls at once are few (docs/architecture.md)."""
        return self.backend.broker.spares.lend()

    current: _OfTheThread[Claimed | None] = _OfTheThread()
    token: _OfTheThread[StopToken | None] = _OfTheThread()
    attempt: _OfTheThread[tracing.Attempt | tracing.NotTraced] = _OfTheThread()
    task_attempt: _OfTheThread[attempts.Attempt | None] = _OfTheThread()

    def in_hand(self) -> list[tuple[Claimed, str]]:
        with self._changed:
            slots = list(self._running.items())
        return [
            (slot.job, slot.attempt.record)
            for (job_id, owner), slot in slots
            if slot.job and (job_id, owner) not in self.stuck
        ]

    def give_up_stuck(self) -> bool:
        """A blocked event loop first (Worker's); then each job stopped GIVE_UP_AFTER
        seconds ago whose thread runs on (blocked in C) ends as if its task had raised
        the stop's reason (``attempts.given_up``), and the process recycles once its
        other jobs are done, without waiting for that thread."""
        if super().give_up_stuck():
            return True  # the threads it let go end their jobs: looked at next time
        with self._changed:
            slots = list(self._running.values())
        for slot in slots:
            job, token = slot.current, slot.token
            if job is None or token is None or (job.job_id, job.owner) in self.stuck:
                continue
            if not token.not_let_go(GIVE_UP_AFTER):
                continue
            self.stuck.add((job.job_id, job.owner))
            logger.error(
                "Job %s: stopped (%s) %.0f s ago, its thread has not let go (blocked in a "
                "call outside Python); given up, and this worker process exits once its "
                "other jobs are done",
                job.job_id,
                type(token.reason).__name__,
                GIVE_UP_AFTER,
            )
            attempt = slot.task_attempt
            finished = attempts.given_up(attempt, self.hooks) if attempt is not None else None
            if finished is not None:
                try:
                    stored = self.backend.broker.finish(finished.outcome)
                except REDIS_ERRORS:  # the lease runs out, and the job runs again
                    continue
                self._report(finished, stored)
        return False

    def held(self) -> list[tuple[str, str]]:
        # A slot's job is held from its claim (before its thread starts it) until its
        # outcome is stored (after ``execute`` let it go): a give-back keeps them all.
        with self._changed:
            return [*self._running, *self._unstored]

    def lease_lost(self, job: Claimed) -> None:
        with self._changed:
            slot = self._running.get((job.job_id, job.owner))
        self._stop_lost(job, slot.token if slot and slot.current is job else None)

    def _stoppable(self) -> list[tuple[Claimed, StopToken]]:
        with self._changed:
            slots = list(self._running.values())
        return [(s.current, s.token) for s in slots if s.current is not None and s.token]

    # The loop: claim while a slot is free; the slots run the jobs and store them.

    def _loop(self, backoff: Reconnector) -> None:
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="redisqueue-slot")
        try:
            while not self._should_stop():
                if not self._free.acquire(timeout=WAIT_TIMEOUT):
                    continue  # every slot busy: look at the stop flags again
                # A slot freed as the worker stops (a second SIGTERM gave a job back)
                # takes nothing: that job would be claimed again at once.
                job = None if self._should_stop() else self._claim(backoff)
                if job is None:
                    self._free.release()
                    continue
                slot = _Slot(job)
                with self._changed:
                    self._running[job.job_id, job.owner] = slot
                pool.submit(self._run_in_slot, job, slot)
        finally:
            # The jobs in hand end first, each storing its outcome; not a stuck one.
            with self._changed:
                while set(self._running) - self.stuck:
                    self._changed.wait(WAIT_TIMEOUT)
            pool.shutdown(wait=not self.stuck)
            self._close_databases()
            # A stuck thread's call, if it calls again, goes through the pool.
            self.backend.broker.spares.close_all()
            # A slot's claim lost its reply as the worker stopped: no free slot's claim
            # came after it to give back what it may have given.
            self._recover_before_the_end()

    def _claim(self, backoff: Reconnector) -> Claimed | None:
        """One claim for a free slot (no outcome: the slots store theirs), or what the
        wait hands over; None when nothing came, or Redis failed."""
        try:
            if self.uncertain:
                with self._claims.closed():  # no slot's claim between its reply and its slot
                    self._recover_claim(None)
                    self.uncertain = False
            claim = self._store_and_claim(None, True)
            backoff.succeeded()
        except REDIS_ERRORS as exc:  # refused (nothing changed), or its reply lost
            if reply_lost(exc):  # set, never read and written back: a slot may set it too
                self.uncertain = True
            backoff.failed(exc)
            return None
        if claim.job is None and self.burst and claim.read_broadcasts:
            # Out of work once no job is in hand: one ending may release others.
            with self._changed:
                if self._running:
                    self._changed.wait(WAIT_TIMEOUT)
                    return None
        return claim.job or self._between_jobs(claim, True, backoff)

    def _run_in_slot(self, job: Claimed, slot: _Slot) -> None:
        """Run the job, store its outcome and, while there is work, claim the next in
        the same call and run it, on this thread; then free the slot for the loop."""
        try:
            while True:
                self._local.slot = slot
                following = None
                try:
                    finished = self.execute(job)
                    with self._changed:
                        self.jobs_done += 1
                    self._look_at_memory()
                    stored, following = self._store_and_claim_next(finished)
                    if stored is not None:
                        self._report(finished, stored)
                except BaseException:  # a bug of this app's: said, and the slot is freed
                    logger.exception("Worker %s: job %s's slot failed", self.worker_id, job.job_id)
                finally:
                    with self._changed:
                        # Unless the call that stored its outcome claimed the same job
                        # again under the same token (a give-back is uncounted): then
                        # the entry is the next attempt's, which this thread runs next.
                        if self._running.get((job.job_id, job.owner)) is slot:
                            del self._running[job.job_id, job.owner]
                        self._databases[threading.get_ident()] = connections.all(
                            initialized_only=True
                        )
                        self._changed.notify_all()
                if following is None or following.job is None:
                    return
                job, slot = following.job, following
        finally:
            self._free.release()

    def _store_and_claim_next(self, finished: Finished) -> tuple[bool | None, _Slot | None]:
        """Store the outcome and, when the loop has nothing to do first, claim this
        slot's next job in the same call (never the job handed to the worker, nor an
        idle registration: those are the loop's). Returns whether the call stored the
        outcome (None: stored and reported apart) and the next job's slot, if any."""
        queues = self._queues_for_a_slot()
        if not queues:
            self._store(finished)
            return None, None
        failed: Exception | None = None
        with self._claims.passing():  # not while the loop gives back what a lost reply gave
            try:
                with self._spare_broker() as broker:
                    stored, job = broker.claim(
                        queues, self.worker_id, finished.outcome, broadcasts=False
                    )
            except REDIS_ERRORS as exc:  # the loop recovers a job the call may have given
                if reply_lost(exc):  # set, never read and written back: a slot may set it too
                    self.uncertain = True
                failed = exc
            else:
                following = _Slot(job)
                if job is not None:
                    with self._changed:
                        self._running[job.job_id, job.owner] = following
        if failed is not None:
            self._store(finished, repeated=reply_lost(failed))
            return None, None
        return bool(stored), following

    def _queues_for_a_slot(self) -> list[str]:
        """The queues a slot claims from now, in this turn's order; none while the loop
        has to stop, recover, or read or run the broadcasts."""
        reading_due = time.monotonic() - self.broadcasts_read_at >= BROADCASTS_READ_EVERY
        if self._should_stop() or self.uncertain or reading_due or self.broadcasts.waiting:
            return []
        return self.order.next()

    def _close_databases(self) -> None:
        """Close the connections the slots' threads kept open (CONN_MAX_AGE), from this
        thread once theirs have ended; else they would stay open until the garbage
        collector, or the process's exit, found them."""
        if not self.close_connections:
            return
        for kept in self._databases.values():
            for connection in kept:
                connection.inc_thread_sharing()  # made in another thread, which has ended
                try:
                    connection.close()
                finally:
                    connection.dec_thread_sharing()
        self._databases.clear()

    def _store(self, finished: Finished, *, repeated: bool = False) -> None:
        """Store the outcome, trying again while Redis fails (a repeat after a lost
        reply is fenced), up to a few tries once the worker stops. ``repeated``: a
        call that may have stored it lost its reply."""
        backoff = Reconnector(
            logger, f"Worker {self.worker_id}", where=self.backend.broker.describe
        )
        while True:
            try:
                with self._spare_broker() as broker:
                    stored = broker.finish(finished.outcome)
                break
            except REDIS_ERRORS as exc:
                repeated = repeated or reply_lost(exc)
                if self._give_up(not self._should_stop(), backoff, exc):
                    with self._changed:
                        self._unstored.add((finished.outcome.job_id, finished.outcome.owner))
                    return
        backoff.succeeded()
        self._report(finished, stored, repeated=repeated)
