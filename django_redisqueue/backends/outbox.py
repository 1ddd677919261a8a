"""The transactional outbox: jobs enqueued in a transaction are written to a table in
that transaction, and relayed to Redis once it has committed.

A row commits or rolls back with the data it belongs to (savepoints included), so a
committed job cannot be lost to Redis being down, failing over or full at the commit.
Two relays move rows to Redis: the committing process's, right after the commit
(``OutboxRelay.relay_committed``), and ``runscheduler``'s, for rows left behind
(``relay()``). Both
store the job and only then delete the row. The store leaves a relay record in Redis
(the job's id), which outlives the job and its result until runscheduler sweeps it
once the row is deleted: a row relayed again, however late (a delete that failed, a
process killed between the two, ``REPLICA_ACKS`` not met), stores nothing, so a row
relayed twice makes one job. Where
the database can ``SELECT ... FOR UPDATE SKIP LOCKED``, a scheduler skips a step while
another relays older rows; elsewhere (SQLite) they take turns. Either way no row is
relayed twice at once and a backend's rows reach Redis oldest first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.models import Count, Min, QuerySet
from django.utils import timezone

from django_redisqueue.backends.base import job_after, new_job
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.tasks import RedisTaskResult
from django_redisqueue.exceptions import BrokerUnavailable
from django_redisqueue.models import OutboxJob
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS
from django_redisqueue.store.wire import MissingJob, NewJob

logger = logging.getLogger(__name__)

# What reading or writing an outbox may raise while its database is down, lacks the
# table, or cannot even be loaded (a DATABASES entry whose driver is missing).
OUTBOX_ERRORS: tuple[type[Exception], ...] = (DatabaseError, InterfaceError, ImproperlyConfigured)
# What a relay by the committing process survives: the rows stay for runscheduler.
RELAY_ERRORS: tuple[type[Exception], ...] = (BrokerUnavailable, *REDIS_ERRORS)
# Rows runscheduler relays per transaction.
RELAY_BATCH = 500
# runscheduler relays a row once it is this old (s): a commit's own relay usually
# takes it first, and a relay of the same row by both costs a refused enqueue.
SETTLE_SECONDS = 2.0
# Later rows that wait for a job a relay reads, at most, to find the ones that run
# after its batch's jobs (relayed with them).
FOLLOWERS_READ = 10 * RELAY_BATCH
# Relay records (of jobs whose rows may be deleted) runscheduler's sweep reads at a
# time, and most pages it reads in a step: 10,000 a second.
SWEEP_BATCH = 1000
SWEEP_PAGES = 10
# How long a deleted row's relay record is kept after its last relay (s): a relay that
# read the row before its delete and stalled (a pause, a swap storm) finds it, unless
# it stalled longer than this and the job's result expired meanwhile.
RECORD_HOLD_SECONDS = 600.0
# Most payload bytes one INSERT of outbox rows carries: a quarter of MariaDB's and
# MySQL's default max_allowed_packet (16 MiB), as a driver may escape each byte to two.
WRITE_BATCH_BYTES = 4 << 20


def write(database: str, backend: str, jobs: Sequence[NewJob]) -> None:
    """Add ``jobs`` to the outbox, in the current transaction on ``database``: one
    INSERT per WRITE_BATCH_BYTES of payloads, so that each fits a server's packet limit
    (MariaDB's max_allowed_packet drops the connection, and the transaction, on a
    larger one)."""
    now = timezone.now()
    rows = OutboxJob.objects.using(database)
    batch: list[OutboxJob] = []
    size = 0
    for job in jobs:
        length = len(job.payload.encode()) + len(job.options.encode())
        if batch and size + length > WRITE_BATCH_BYTES:
            rows.bulk_create(batch)
            batch, size = [], 0
        batch.append(
            OutboxJob(
                job_id=job.job_id,
                backend=backend,
                queue=job.queue,
                priority=job.priority,
                payload=job.payload,
                due_ms=job.due_ms,
                after=job.after,
                options=job.options,
                created_at=now,
            )
        )
        size += length
    if batch:
        rows.bulk_create(batch)


def row_job(row: OutboxJob) -> NewJob:
    """The job a row holds, as the enqueue script takes it."""
    return NewJob(
        row.job_id, row.queue, row.priority, row.payload, row.due_ms, row.after, row.options
    )


def forget(database: str, job_ids: Iterable[str]) -> None:
    """Delete the rows of jobs now in Redis: one statement, one round trip. Their relay
    records are held, then dropped by runscheduler's sweep (``sweep_records``)."""
    OutboxJob.objects.using(database).filter(job_id__in=list(job_ids)).delete()


def sweep_records(
    broker: Broker,
    databases: Sequence[str],
    start: int = 0,
    batch: int = SWEEP_BATCH,
    hold: float | None = None,
    now_ms: int | None = None,
) -> int:
    """Drop the relay records last relayed ``hold`` seconds ago or more (by default
    RECORD_HOLD_SECONDS) whose jobs have
    no row left in ``databases``, a page of ``batch`` from place ``start`` (0: the
    longest unrelayed) at a time, while pages come full and yield some, at most
    SWEEP_PAGES; return the place the next sweep starts from (0 once the end was
    reached). A row still there keeps its record, and the next page starts past the
    ones kept. A deleted row's record is held a while: a relay that read the row before
    its delete (a committing process stalled between its read and its store) may still
    store it. ``now_ms``: Redis's time, if the caller has it (else asked for). Redis and
    database errors propagate."""
    hold = RECORD_HOLD_SECONDS if hold is None else hold
    before_ms = (broker.clock_ms() if now_ms is None else now_ms) - int(hold * 1000)
    for _ in range(SWEEP_PAGES):
        ids = broker.relayed_jobs(before_ms, start, batch)
        kept = set().union(*(present(database, ids) for database in databases)) if ids else set()
        broker.forget_relayed([job_id for job_id in ids if job_id not in kept])
        if len(ids) < batch:
            return 0
        start += len(kept)
        if len(kept) == len(ids):
            break
    return start


def find(databases: Sequence[str], backend: str, job_id: str) -> NewJob | None:
    """The job ``job_id`` if it is waiting in an outbox of ``databases``, else None."""
    for database in databases:
        row = OutboxJob.objects.using(database).filter(backend=backend, job_id=job_id).first()
        if row is not None:
            return row_job(row)
    return None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits in a backend's outboxes: how many rows, and since when."""

    jobs: int
    oldest: datetime | None

    def age(self, now: datetime | None = None) -> float:
        """Seconds the oldest row has waited (0 when none waits)."""
        if self.oldest is None:
            return 0.0
        return max(0.0, ((now or timezone.now()) - self.oldest).total_seconds())


def backlog(databases: Sequence[str], backend: str) -> Backlog:
    """One query per database: how many rows, and the oldest's time."""
    jobs, oldest = 0, None
    for database in databases:
        found = (
            OutboxJob.objects.using(database)
            .filter(backend=backend)
            .aggregate(jobs=Count("id"), oldest=Min("created_at"))
        )
        jobs += found["jobs"]
        if found["oldest"] is not None and (oldest is None or found["oldest"] < oldest):
            oldest = found["oldest"]
    return Backlog(jobs, oldest)


def has_table(database: str) -> bool:
    """Whether ``database`` has the outbox's table (its migration applied). Database
    errors propagate."""
    return OutboxJob._meta.db_table in connections[database].introspection.table_names()


def migrate_command(database: str) -> str:
    """The command that creates the outbox's table in ``database``."""
    return f"python manage.py migrate {OutboxJob._meta.app_label} --database {database}"


def present(database: str, job_ids: Iterable[str]) -> set[str]:
    """Which of ``job_ids`` have a row: the jobs a transaction committed, less those a
    savepoint rolled back (which Django's ``savepoint_rollback()`` leaves among the
    transaction's ``on_commit`` callbacks)."""
    return set(
        OutboxJob.objects.using(database)
        .filter(job_id__in=list(job_ids))
        .values_list("job_id", flat=True)
    )


def store(
    broker: Broker,
    jobs: Sequence[NewJob],
    *,
    record_queues: bool,
    backend: str,
    databases: Sequence[str],
) -> set[str]:
    """Put ``jobs`` in Redis, as the outbox's relays do, in order and in one atomic
    call (per enqueue batch) when some wait for another: a job is never stored without
    the one it runs after (a relay cut between the two, then the first job run and its
    result expired, would find it gone). Return the jobs whose rows must stay: those
    that wait for a job still in an outbox of ``databases`` (relayed later, once that
    one is). The others are in Redis now or were already (the id taken), or wait for a
    job that exists nowhere and are dropped, logged, as enqueue() would have refused
    them. Redis errors propagate, NotReplicated (too few replicas confirmed) once the
    jobs were sent."""
    if not any(job.after for job in jobs):
        broker.enqueue(jobs, record_queues=record_queues, relayed=True)
        return set()
    kept: set[str] = set()
    jobs = list(jobs)
    while jobs:
        try:
            broker.enqueue_linked(jobs, record_queues=record_queues, relayed=True)
            break
        except MissingJob as exc:
            # It names a job Redis lacks: leave out what waits for it, and send the rest.
            waiting = _waiting_for(exc.job_id, jobs)
            jobs = [job for job in jobs if job.job_id not in waiting]
            relaying = any(job.job_id == exc.job_id for job in jobs)
            if not relaying and find(databases, backend, exc.job_id) is not None:
                kept |= waiting
                continue
            logger.error(
                "Outbox: job(s) %s run after job %s, which does not exist (or its result "
                "expired): dropped, as enqueue() would have refused them",
                ", ".join(sorted(waiting)),
                exc.job_id,
            )
    return kept


def _waiting_for(job_id: str, jobs: Sequence[NewJob]) -> set[str]:
    """The ids of ``jobs`` that run after ``job_id``, directly or through one another."""
    return set(_runs_after({job_id}, ((job.job_id, job.after) for job in jobs)))


def _runs_after(waited_for: set[str], links: Iterable[tuple[str, str]]) -> Iterator[str]:
    """The ids of ``links`` (a job's id, and the job it runs after), in order, that run
    after one of ``waited_for``, directly or through one another: ``links`` come in the
    outbox's order, in which a job follows the one it waits for."""
    waited = set(waited_for)
    for job_id, after in links:
        if after in waited:
            waited.add(job_id)
            yield job_id


def relay(
    broker: Broker,
    backend: str,
    database: str,
    *,
    record_queues: bool,
    databases: Sequence[str] = (),
    batch: int = RELAY_BATCH,
    settle: float = SETTLE_SECONDS,
) -> int:
    """Move up to ``batch`` of ``backend``'s rows of ``database`` that are ``settle``
    seconds old into Redis, oldest first (with the later rows that run after one of
    them), and delete them, in one transaction; return how many. ``databases``: every
    outbox of the backend (a job may wait for one in another). Where the database skips
    locked rows, a relay that finds older rows held by another relay leaves the step to
    it: relaying newer ones now would put them ahead in their queues. On a Redis error
    nothing is deleted and the error propagates."""
    eligible = OutboxJob.objects.using(database).filter(
        backend=backend, created_at__lte=timezone.now() - timedelta(seconds=settle)
    )
    if not eligible.exists():  # the usual answer: no lock, no transaction
        return 0
    skip_locked = connections[database].features.has_select_for_update_skip_locked
    with transaction.atomic(using=database):
        if skip_locked:
            taken = list(eligible.select_for_update(skip_locked=True).order_by("id")[:batch])
            oldest = eligible.order_by("id").values_list("id", flat=True).first()
            if not taken or oldest != taken[0].id:
                return 0
        else:
            # A write that matches nothing takes the database's write lock (SQLite), so
            # that relays take turns rather than fail to delete what they relayed.
            OutboxJob.objects.using(database).filter(id=-1).update(due_ms=0)
            taken = list(eligible.order_by("id")[:batch])
            if not taken:
                return 0
        taken += _followers(eligible, taken, skip_locked)
        kept = store(
            broker,
            [row_job(row) for row in taken],
            record_queues=record_queues,
            backend=backend,
            databases=databases or [database],
        )
        _delete_rows(database, [row.id for row in taken if row.job_id not in kept])
    return len(taken) - len(kept)


def _followers(
    eligible: QuerySet[OutboxJob], taken: Sequence[OutboxJob], skip_locked: bool
) -> list[OutboxJob]:
    """The rows past the batch ``taken`` that run after one of its jobs, directly or
    through one another, oldest first, at most RELAY_BATCH: relayed with it, lest the
    job they wait for run and its result expire before the next batch. One query reads
    the later rows that wait for a job (few, as a rule; at most FOLLOWERS_READ), their
    chains are followed here, and only the followers are taken."""
    later = eligible.filter(id__gt=taken[-1].id).exclude(after="").order_by("id")
    links = list(later.values_list("job_id", "after")[:FOLLOWERS_READ])
    followers = list(islice(_runs_after({row.job_id for row in taken}, links), RELAY_BATCH))
    if not followers:
        return []
    rows = eligible.filter(job_id__in=followers)
    if skip_locked:
        rows = rows.select_for_update(skip_locked=True)
    return list(rows.order_by("id"))


def _delete_rows(database: str, ids: Sequence[int]) -> None:
    """Delete rows by id, one primary-key look-up each: one statement over several
    (``IN (...)``) may scan the table instead (MariaDB does on a small one), and wait
    for the rows another relay holds."""
    connection = connections[database]
    table = connection.ops.quote_name(OutboxJob._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(f"DELETE FROM {table} WHERE id = %s", [(id_,) for id_ in ids])


class Push(Protocol):
    def __call__(self, results: Sequence[RedisTaskResult], *, relayed: bool = False) -> None: ...


class OutboxRelay:
    """A backend's side of its outboxes: the jobs written in a transaction, relayed
    right after the commit by the committing process (``push``: the backend's own
    enqueue) or later by runscheduler, and found while they wait."""

    def __init__(
        self,
        alias: str,
        databases: Sequence[str],
        broker: Broker,
        push: Push,
        *,
        record_queues: bool,
    ) -> None:
        self.alias = alias
        self.databases = databases
        self.broker = broker
        self.push = push
        self.record_queues = record_queues

    def write(self, results: Sequence[RedisTaskResult], database: str) -> None:
        """Write ``results`` to the outbox in the transaction on ``database``."""
        write(database, self.alias, [new_job(result, job_after(result)) for result in results])

    def relay_committed(self, results: list[RedisTaskResult], database: str) -> None:
        """Right after the commit: push the jobs whose rows committed, then delete the
        rows. If Redis refuses, the rows stay for runscheduler, and the caller, whose
        transaction has committed, is not told: the jobs are safe."""
        try:
            committed = present(database, [result.id for result in results])
        except OUTBOX_ERRORS as exc:
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
                kept = store(
                    self.broker,
                    [new_job(result, job_after(result)) for result in results],
                    record_queues=self.record_queues,
                    backend=self.alias,
                    databases=self.databases,
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
            forget(database, [r.id for r in results if r.id not in kept])
        except OUTBOX_ERRORS as exc:  # relayed again later: stores nothing
            logger.warning("Outbox: relayed jobs' rows not deleted yet: %s", exc)

    def relay_left(self, settle: float = SETTLE_SECONDS) -> int:
        """Relay the rows left in the outboxes, once ``settle`` seconds old
        (runscheduler's step): one batch per database; return how many. A database
        that cannot be read leaves the others relayed; its error is raised after them,
        as are Redis errors."""
        relayed, failed = 0, None
        for database in self.databases:
            try:
                relayed += relay(
                    self.broker,
                    self.alias,
                    database,
                    record_queues=self.record_queues,
                    databases=self.databases,
                    settle=settle,
                )
            except OUTBOX_ERRORS as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return relayed

    def fields(self, job_id: str) -> dict[str, str] | None:
        """The fields of a job still in an outbox, as a READY job's hash holds them
        (no ``enqueued_at`` yet); None if it is in none."""
        job = find(self.databases, self.alias, job_id)
        if job is None:
            return None
        return {"payload": job.payload, "queue": job.queue, "priority": str(job.priority)}
