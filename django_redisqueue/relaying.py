"""``RedisQueueBackend``'s side of the transactional outbox (``outbox.py``): its jobs
written in the transaction, relayed by the committing process right after the commit,
relayed by ``runscheduler`` when that did not happen, and found while they wait."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from django_redisqueue import outbox
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.tasks import RedisTaskResult
from django_redisqueue.exceptions import BrokerUnavailable
from django_redisqueue.preparation import JobPreparation, new_job
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS

logger = logging.getLogger(__name__)

# What a relay by the committing process survives: the rows stay for runscheduler.
RELAY_ERRORS: tuple[type[Exception], ...] = (BrokerUnavailable, *REDIS_ERRORS)


def job_after(result: RedisTaskResult) -> str:
    """The id of the job ``result``'s job runs after ('' for none)."""
    return getattr(result.task, "depends_on", None) or ""


class OutboxRelay(JobPreparation):
    """The outbox's half of RedisQueueBackend, which provides the rest."""

    if TYPE_CHECKING:

        @cached_property
        def broker(self) -> Broker: ...

        @cached_property
        def queue_names(self) -> tuple[str, ...]: ...

        def push(self, results: Sequence[RedisTaskResult], *, relayed: bool = False) -> None: ...

    def push_to_outbox(self, results: list[RedisTaskResult], database: str) -> None:
        """Write ``results`` to the outbox in the transaction on ``database``; once it
        commits, relay them (``relay_committed``)."""
        outbox.write(
            database, self.alias, [new_job(result, job_after(result)) for result in results]
        )
        self.push_on_commit(results, database, relay=True)

    def relay_committed(self, results: list[RedisTaskResult], database: str) -> None:
        """Right after the commit: push the jobs whose rows committed, then delete the
        rows. If Redis refuses, the rows stay for runscheduler, and the caller, whose
        transaction has committed, is not told: the jobs are safe."""
        try:
            committed = outbox.present(database, [result.id for result in results])
        except outbox.OUTBOX_ERRORS as exc:
            logger.warning("Outbox: rows unread after the commit, left to runscheduler: %s", exc)
            return
        results = [result for result in results if result.id in committed]
        if not results:
            return
        kept: set[str] = set()
        try:
            try:
                self.push(results, relayed=True)
            except TaskResultDoesNotExist:
                # A job runs after one Redis does not have: job by job, as runscheduler.
                kept = outbox.store(
                    self.broker,
                    [new_job(result, job_after(result)) for result in results],
                    record_queues=not self.queue_names,
                    backend=self.alias,
                    databases=self.config.outbox,
                )
        except RELAY_ERRORS as exc:
            logger.warning(
                "%d job(s) stay in the outbox of database %r until runscheduler relays them: %s",
                len(results),
                database,
                exc,
            )
            return
        try:
            outbox.forget(database, [r.id for r in results if r.id not in kept])
        except outbox.OUTBOX_ERRORS as exc:  # relayed again later: stores nothing
            logger.warning("Outbox: relayed jobs' rows not deleted yet: %s", exc)

    def relay_outbox(self, settle: float = outbox.SETTLE_SECONDS) -> int:
        """Relay the rows left in this backend's outboxes, once ``settle`` seconds old
        (runscheduler's step): one batch per database; return how many. A database
        that cannot be read leaves the others relayed; its error is raised after them,
        as are Redis errors."""
        relayed, failed = 0, None
        for database in self.config.outbox:
            try:
                relayed += outbox.relay(
                    self.broker,
                    self.alias,
                    database,
                    record_queues=not self.queue_names,
                    databases=self.config.outbox,
                    settle=settle,
                )
            except outbox.OUTBOX_ERRORS as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return relayed

    def outboxed(self, job_id: str) -> dict[str, str] | None:
        """The fields of a job still in the outbox, as a READY job's hash holds them
        (no ``enqueued_at`` yet); None if it is in none of this backend's outboxes."""
        if not self.config.outbox:
            return None
        job = outbox.find(self.config.outbox, self.alias, job_id)
        if job is None:
            return None
        return {"payload": job.payload, "queue": job.queue, "priority": str(job.priority)}
