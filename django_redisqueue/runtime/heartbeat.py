"""The worker's heartbeat: a thread that keeps its record and its job's lease alive."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from django_redisqueue.core.jobs import owner_attempt
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.stop_requests import StopRequests
from django_redisqueue.store.gateway import REDIS_ERRORS
from django_redisqueue.store.wire import Claimed

logger = logging.getLogger(WORKER_LOGGER)

# Longest time between two heartbeats (s), and between two tries while Redis fails.
HEARTBEAT_INTERVAL = 10.0
HEARTBEAT_RETRY = 0.25
# Longest time (s) a worker running jobs takes to learn one is asked to stop.
STOP_LOOK = 1.0


class Beating(Protocol):
    """What the heartbeat needs of its worker."""

    worker_id: str
    stop_requests: StopRequests

    def in_hand(self) -> list[tuple[Claimed, str]]:
        """The jobs running now, each with its attempt's trace record ('' for none)."""
        ...

    @property
    def lease(self) -> float: ...

    def register(
        self, owned: Mapping[str, str] | None = None, traces: Mapping[str, str] | None = None
    ) -> tuple[list[str], list[str]]: ...

    def lease_lost(self, job: Claimed) -> None: ...

    def give_up_stuck(self) -> object: ...

    def send_metrics(self) -> None: ...


class Heartbeat(threading.Thread):
    """Keeps the worker's record alive for the dashboard, and extends the leases of the
    jobs it runs, in one call, every few seconds (at most a third of the lease). While
    Redis fails it tries again every HEARTBEAT_RETRY seconds, so a lease is renewed as
    soon as Redis accepts writes again."""

    def __init__(self, worker: Beating) -> None:
        super().__init__(name="redisqueue-heartbeat", daemon=True)
        self.worker = worker
        self.interval = min(worker.lease / 3, HEARTBEAT_INTERVAL)
        self.stopped = threading.Event()

    def run(self) -> None:
        delay = self.interval
        failures = 0
        while not self._wait(delay):
            self.worker.give_up_stuck()  # before in_hand: their leases are not renewed
            jobs = self.worker.in_hand()
            newest = _newest_attempts(job for job, _ in jobs)
            owned = {job_id: job.owner for job_id, job in newest.items()}
            # The running attempts' trace records: a recovery's attempt links to them.
            traces = {
                job.job_id: record for job, record in jobs if record and newest[job.job_id] is job
            } or None
            try:
                lost, stopping = self.worker.register(owned, traces)
            except REDIS_ERRORS as exc:
                if failures % 20 == 0:
                    logger.warning(
                        "Worker %s: heartbeat failed (%s: %s); trying again every %.2f s",
                        self.worker.worker_id,
                        type(exc).__name__,
                        exc,
                        HEARTBEAT_RETRY,
                    )
                failures += 1
                delay = min(HEARTBEAT_RETRY, self.interval)
                continue
            if failures:
                logger.warning("Worker %s: heartbeat sent again", self.worker.worker_id)
            failures, delay = 0, self.interval
            for job, _ in jobs:
                if job.job_id in lost or newest[job.job_id] is not job:
                    self.worker.lease_lost(job)
            for job_id in stopping:  # should its stop list's entry have been missed
                self.worker.stop_requests.ask(job_id, owned[job_id])
            self.worker.send_metrics()

    def _wait(self, delay: float) -> bool:
        """Wait ``delay`` s, taking the requests to stop the jobs in hand as they come
        (a worker that runs none spends no command on them); True once stopped."""
        until = time.monotonic() + delay
        while (left := until - time.monotonic()) > 0 and not self.stopped.is_set():
            slice_ = min(left, STOP_LOOK)
            if slice_ < 0.01 or not self.worker.in_hand():  # (a timeout of 0 is for ever)
                self.stopped.wait(slice_)
                continue
            try:
                self.worker.stop_requests.wait(slice_)
            except REDIS_ERRORS:  # the heartbeat's own call will say so
                self.stopped.wait(slice_)
        return self.stopped.is_set()


def _newest_attempts(jobs: Iterable[Claimed]) -> dict[str, Claimed]:
    """By job id, the attempt the heartbeat renews: the newest. A slot may still run an
    older attempt of a job this worker claimed again (its lease ran out while it was
    blocked in C); that one is no longer the job's owner."""
    newest: dict[str, Claimed] = {}
    for job in jobs:
        kept = newest.get(job.job_id)
        if kept is None or owner_attempt(job.owner) > owner_attempt(kept.owner):
            newest[job.job_id] = job
    return newest
