"""A worker standing idle (docs/protocol.md, "The hand-off"): a claim that found no job
registered it on its queues; it blocks on their wake-up lists and its hand-off list a
few times, and takes a job handed to it before it starts it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS
from django_redisqueue.store.wire import Claimed

logger = logging.getLogger(WORKER_LOGGER)

# Seconds an idle worker blocks on its wake-up lists per call.
WAIT_TIMEOUT = 1.0
# Wake-ups are hints; an idle worker claims anyway after this many quiet waits.
IDLE_WAITS_BEFORE_CLAIM = 5
# How long a claim that finds no job registers the worker as idle (ms): past its quiet
# waits, which end in a claim that registers it again.
IDLE_MS = round((IDLE_WAITS_BEFORE_CLAIM + 1) * WAIT_TIMEOUT * 1000)
# A wait starts only if it ends this long before the registration does (s): an enqueue
# wakes only the workers it finds registered, so one held up (frozen, starved of CPU)
# claims, and registers, again instead.
REGISTRATION_MARGIN = 0.5


class IdleStand:
    """One worker's idle registration, its waits, and the job handed to it."""

    def __init__(self, broker: Broker, worker_id: str) -> None:
        self.broker = broker
        self.worker_id = worker_id
        # Registered by its last claim: the next one takes a job handed meanwhile.
        self.registered = False
        self.registered_at = float("-inf")  # when the claim that registered it was sent
        self.clock = time.monotonic  # (the registration's clock: one a test may step)

    def claimed(self, registered: bool, sent_at: float) -> None:
        """A claim that named queues, sent at ``sent_at`` (monotonic), registered the
        worker as idle (it found no job and the worker will wait), or not."""
        self.registered, self.registered_at = registered, sent_at

    def wait(self, queues: Sequence[str], stopping: Callable[[], bool]) -> Claimed | str | None:
        """Block until woken, or for a few quiet waits, while the registration stands:
        the job handed over, once taken; or the queue whose token woke it ('' for a
        broadcast); or None, to claim again. Redis errors propagate: a lost reply may
        have carried a job."""
        for _ in range(IDLE_WAITS_BEFORE_CLAIM):
            if stopping():
                return None
            ends = self.clock() + WAIT_TIMEOUT + REGISTRATION_MARGIN
            if ends > self.registered_at + IDLE_MS / 1000:
                return None
            woken = self.broker.wait_for_work(queues, WAIT_TIMEOUT, self.worker_id)
            if isinstance(woken, Claimed):
                self.registered = False  # handed over: the registration ended
                return woken if self._take(woken) else None
            if woken is not None:
                return woken
        return None

    def _take(self, handed: Claimed) -> bool:
        """Take a job handed over, under this worker's lease; False if it went back
        meanwhile (this worker frozen, or slow to read it, past the hand-off's deadline)."""
        lost, _ = self.broker.heartbeat(self.worker_id, {}, {handed.job_id: handed.owner})
        if lost:
            logger.info(
                "Job %s: handed to worker %s, which took it too late; it went back to its "
                "queue and is not started here",
                handed.job_id,
                self.worker_id,
            )
        return not lost

    def give_back(self) -> None:
        """End the registration (stopping, or about to run broadcasts), giving back the
        job handed meanwhile, if any; on a Redis error, that job goes back at its
        hand-off's deadline instead."""
        if not self.registered:
            return
        self.registered = False
        with contextlib.suppress(*REDIS_ERRORS):
            if given_back := self.broker.abandon(self.worker_id, handed_only=True):
                logger.info(
                    "Worker %s: gave back job %s, handed to it as it turned to other work",
                    self.worker_id,
                    ", ".join(given_back),
                )
