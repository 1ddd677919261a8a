"""Whether a scheduler runs: without one, retries and delayed jobs stay in their
delayed sets, and a worker says so (at start, and on its retry lines)."""

from __future__ import annotations

import logging
import time

from django_redisqueue.runtime import SCHEDULER_IDLE_WAIT, WORKER_LOGGER
from django_redisqueue.store.gateway import REDIS_ERRORS
from django_redisqueue.store.queries import Queries
from django_redisqueue.store.wire import RETRY

logger = logging.getLogger(WORKER_LOGGER)

# A worker says that no scheduler runs when none has stepped for this long (s): an idle
# scheduler steps every SCHEDULER_IDLE_WAIT s, so this is ten of its steps, leaving
# room for a step slowed by its outbox, its schedules' sync or a Redis error.
NO_SCHEDULER_AFTER = 10 * SCHEDULER_IDLE_WAIT
# How often a worker asks Redis again whether a scheduler runs, for its retry lines (s):
# a busy worker retrying many jobs asks once per this, not once a job.
SCHEDULER_LOOK_EVERY = 5.0


class SchedulerWatch:
    """Whether a scheduler has stepped within NO_SCHEDULER_AFTER, by Redis's clock.
    Asked of Redis at most every SCHEDULER_LOOK_EVERY s, the answer kept between; None
    when Redis did not answer (unknown: nothing is said then, and the worker goes on)."""

    def __init__(self, queries: Queries) -> None:
        self.queries = queries
        self.looked_at = float("-inf")
        self.seen: bool | None = None

    def scheduler_seen(self) -> bool | None:
        now = time.monotonic()
        if now - self.looked_at >= SCHEDULER_LOOK_EVERY:
            self.looked_at = now  # also after an error: not asked again before its time
            self.seen = self._look()
        return self.seen

    def missing(self) -> bool:
        """True when Redis says that no scheduler has stepped lately."""
        return self.scheduler_seen() is False

    def warn_at_start(self, worker_id: str, alias: str) -> None:
        """Say, at a worker's start, that no scheduler runs, when none has lately."""
        if self.missing():
            logger.warning(
                "Worker %s: no scheduler has stepped in the last %g s: retries and delayed "
                "jobs (run_after, delay) will not run until manage.py runscheduler runs "
                "for backend %r",
                worker_id,
                NO_SCHEDULER_AFTER,
                alias,
            )

    def retry_note(self, status: str) -> str:
        """What the line of an attempt that ended ``status`` adds: for a retry, that no
        scheduler has stepped lately; else nothing."""
        return NO_SCHEDULER_NOTE if status == RETRY and self.missing() else ""

    def _look(self) -> bool | None:
        within_ms = int(NO_SCHEDULER_AFTER * 1000)
        try:
            now_ms = self.queries.clock_ms()
            return bool(self.queries.live_schedulers(now_ms, 1, within_ms=within_ms))
        except REDIS_ERRORS as exc:
            logger.debug("Whether a scheduler runs is unknown (%s)", exc)
            return None


# Said on a retry's line when no scheduler has stepped lately.
NO_SCHEDULER_NOTE = (
    f" (no scheduler has stepped in the last {NO_SCHEDULER_AFTER:g} s: the retry waits "
    "for manage.py runscheduler)"
)
