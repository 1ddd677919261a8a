"""The jobs a worker is asked to stop (``result.stop()``, the dashboard's Abort): their
ids come on the worker's stop list (stop.lua), which its heartbeat's thread blocks on
while the worker runs jobs, and each is stopped through its task's stop token, as a
time limit stops one. A task that does not let go is given up, as a time limit's is.
Whatever the attempt then does, the job never runs again: Redis ends it FAILED."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_redisqueue.exceptions import JobStopped
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.stopping import StopToken
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.wire import Claimed

logger = logging.getLogger(WORKER_LOGGER)

# How long (s) a request for a job not running here yet is kept: the job may be between
# its claim and its start.
KEPT_FOR = 60.0


class StopRequests:
    def __init__(
        self,
        worker_id: str,
        broker: Broker,
        running: Callable[[], list[tuple[Claimed, StopToken]]],
    ) -> None:
        self.worker_id = worker_id
        self.broker = broker
        # The waiting thread's own connection, which it gives back itself (``close``):
        # given back by another thread while a wait is in flight, the pool's next user
        # would read that wait's reply.
        self._waiting: Broker | None = None
        self.running = running  # the jobs running now, with their stop tokens
        self._early: dict[str, float] = {}  # job id: when asked, for a job not started
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` s for a request; stop the job it names (Redis errors
        propagate)."""
        if self._waiting is None:
            self._waiting = self.broker.pinned()
        job_id = self._waiting.wait_for_stops(self.worker_id, timeout)
        if job_id:
            self.ask(job_id)

    def close(self) -> None:
        """Give the wait's connection back: by the thread that waits, once it is done."""
        if self._waiting is not None:
            self._waiting.close()
            self._waiting = None

    def ask(self, job_id: str) -> None:
        """Stop the attempts of ``job_id`` running here; a job not started yet is stopped
        as it starts (``starting``)."""
        tokens = [token for job, token in self.running() if job.job_id == job_id]
        if not tokens:
            with self._lock:
                now = time.monotonic()
                self._early = {j: t for j, t in self._early.items() if now - t < KEPT_FOR}
                self._early[job_id] = now
            return
        _stop(job_id, tokens)

    def starting(self, job_id: str, token: StopToken) -> None:
        """A job is about to start with ``token``: stopped at once if it was asked to."""
        with self._lock:
            asked = self._early.pop(job_id, None)
        if asked is not None:
            _stop(job_id, [token])


def _stop(job_id: str, tokens: list[StopToken]) -> None:
    logger.warning("Job %s: asked to stop; stopping its task", job_id)
    for token in tokens:
        token.stop(JobStopped(f"Job {job_id} was asked to stop while it ran."))
