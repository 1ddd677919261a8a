"""Writes the progress a worker's running tasks report (``context.set_progress``), from
a thread of its own: a task's report never waits on Redis (an async task's would stall
its loop), and however often tasks report, the process writes at most every
``WRITE_INTERVAL``: the last value of each job, all its jobs in one call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_redisqueue.core.progress import WRITE_INTERVAL, JobProgress
from django_redisqueue.runtime.attempts import Attempt, Hook
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS

logger = logging.getLogger("django_redisqueue.worker")

# The writer's thread ends after this long (s) without a report; the next one starts it.
IDLE_THREAD_ENDS = 10.0

# A report waiting to be written: (job id, owner token) -> record.
Pending = dict[tuple[str, str], str]


class ProgressWriter(Hook):
    """Gives each attempt a way to report (before its task runs), and writes its last
    report before its outcome is stored (a late write would be refused)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pending: Pending = {}
        self._lock = threading.Lock()  # over _pending, _in_flight and _thread
        # The attempts whose older report the thread is writing: an attempt's flush
        # waits for that write (its last value never lands before an older one), and
        # only an attempt that reported waits at all.
        self._in_flight: set[tuple[str, str]] = set()
        self._written = threading.Condition(self._lock)
        self._reported = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, attempt: Attempt) -> None:
        if attempt.task.takes_context:
            attempt.report = self.reporter(
                attempt.claimed.job_id, attempt.claimed.owner, attempt.record.attempts
            )

    def ended(self, attempt: Attempt) -> None:
        self.flush(attempt.claimed.job_id, attempt.claimed.owner)

    def reporter(self, job_id: str, owner: str, attempt: int) -> Callable[[JobProgress], None]:
        """What an attempt's context reports to (``JobContext._report``)."""

        def report(progress: JobProgress) -> None:
            with self._lock:
                self._pending[job_id, owner] = progress.record(attempt)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="redisqueue-progress", daemon=True
                    )
                    self._thread.start()
            self._reported.set()

        return report

    def flush(self, job_id: str, owner: str) -> None:
        """Write the attempt's last report now, if it waits."""
        key = (job_id, owner)
        with self._lock:
            while key in self._in_flight:
                self._written.wait()
            waiting = self._pending.pop(key, None)
        if waiting is not None:
            self._write({key: waiting})

    def _run(self) -> None:
        try:
            while True:
                if not self._reported.wait(IDLE_THREAD_ENDS):
                    with self._lock:
                        if not self._pending:  # else a report came as the wait ended
                            self._thread = None
                            return
                self._reported.clear()
                with self._lock:
                    pending, self._pending = self._pending, {}
                    self._in_flight = set(pending)
                try:
                    if pending:
                        self._write(pending)
                finally:
                    with self._lock:
                        self._in_flight = set()
                        self._written.notify_all()
                time.sleep(WRITE_INTERVAL)  # at most one write per interval
        finally:  # a write that raised what it does not catch: the next report starts one
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _write(self, pending: Pending) -> None:
        # JobProgress is for people to watch: a write Redis refuses is dropped, not tried
        # again, and never fails the job.
        try:
            with self.broker.spares.lend() as broker:
                broker.report_progress(
                    [(job_id, owner, record) for (job_id, owner), record in pending.items()]
                )
        except REDIS_ERRORS as exc:
            logger.debug("JobProgress of %d job(s) not written: %s", len(pending), exc)
