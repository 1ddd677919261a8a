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

# A report waiting to be written: job id -> (owner token, record).
Pending = dict[str, tuple[str, str]]


class ProgressWriter(Hook):
    """Gives each attempt a way to report (before its task runs), and writes its last
    report before its outcome is stored (a late write would be refused)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pending: Pending = {}
        self._lock = threading.Lock()  # over _pending and _thread
        # Held while writing: what is written is the latest taken, in the order taken
        # (an attempt's last value never lands before an older one the thread holds).
        self._writing = threading.Lock()
        self._reported = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, attempt: Attempt) -> None:
        attempt.report = self.reporter(
            attempt.claimed.job_id, attempt.claimed.owner, attempt.record.attempts
        )

    def ended(self, attempt: Attempt) -> None:
        self.flush(attempt.claimed.job_id)

    def reporter(self, job_id: str, owner: str, attempt: int) -> Callable[[JobProgress], None]:
        """What an attempt's context reports to (``JobContext._report``)."""

        def report(progress: JobProgress) -> None:
            with self._lock:
                self._pending[job_id] = (owner, progress.record(attempt))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="redisqueue-progress", daemon=True
                    )
                    self._thread.start()
            self._reported.set()

        return report

    def flush(self, job_id: str) -> None:
        """Write the job's last report now, if it waits."""
        with self._writing:
            with self._lock:
                waiting = self._pending.pop(job_id, None)
            if waiting is not None:
                self._write({job_id: waiting})

    def _run(self) -> None:
        while True:
            if not self._reported.wait(IDLE_THREAD_ENDS):
                with self._lock:
                    if not self._pending:  # else a report came as the wait ended
                        self._thread = None
                        return
            self._reported.clear()
            with self._writing:
                with self._lock:
                    pending, self._pending = self._pending, {}
                if pending:
                    self._write(pending)
            time.sleep(WRITE_INTERVAL)  # at most one write per interval

    def _write(self, pending: Pending) -> None:
        # JobProgress is for people to watch: a write Redis refuses is dropped, not tried
        # again, and never fails the job.
        try:
            with self.broker.spares.lend() as broker:
                broker.report_progress(
                    [(job_id, owner, record) for job_id, (owner, record) in pending.items()]
                )
        except REDIS_ERRORS as exc:
            logger.debug("JobProgress of %d job(s) not written: %s", len(pending), exc)
