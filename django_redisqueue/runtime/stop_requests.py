"""The jobs a worker is asked to stop (``result.stop()``, the dashboard's Abort): their
ids come on the worker's stop list (stop.lua), which its heartbeat's thread blocks on
while the worker runs jobs, and each is stopped through its task's stop token, as a
time limit stops one; with slots, one whose thread does not let go is given up, as a
time limit's is. Whatever the attempt then does, the job never runs again: Redis ends
it FAILED."""

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
        # Through the pool, a connection per wait: none held between waits (a second
        # at a time, only while the worker runs jobs).
        self.broker = broker
        self.running = running  # the jobs running now, with their stop tokens
        # (job id, owner token): when asked, for an attempt not started yet
        self._early: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` s for a request; stop the attempt it names (Redis
        errors propagate)."""
        asked = self.broker.wait_for_stops(self.worker_id, timeout)
        if asked:
            self.ask(*asked)

    def ask(self, job_id: str, owner: str) -> None:
        """Stop the attempt ``owner`` of ``job_id`` running here; one not started yet is
        stopped as it starts (``starting``). Under the lock, so that an attempt that
        starts meanwhile finds the request."""
        with self._lock:
            tokens = [
                token
                for job, token in self.running()
                if (job.job_id, job.owner) == (job_id, owner)
            ]
            if not tokens:
                now = time.monotonic()
                self._early = {a: t for a, t in self._early.items() if now - t < KEPT_FOR}
                self._early[job_id, owner] = now
                return
        _stop(job_id, tokens)

    def starting(self, claimed: Claimed, token: StopToken) -> None:
        """An attempt is about to start with ``token`` (among ``running`` already: a
        request taken later finds it there): stopped at once if it was asked to."""
        with self._lock:
            asked = self._early.pop((claimed.job_id, claimed.owner), None)
        if asked is not None:
            _stop(claimed.job_id, [token])


def _stop(job_id: str, tokens: list[StopToken]) -> None:
    for token in tokens:  # (one stopped already, by this or another reason: said once)
        if token.stop(JobStopped(f"Job {job_id} was asked to stop while it ran.")):
            logger.warning("Job %s: asked to stop; stopping its task", job_id)
