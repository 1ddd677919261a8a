"""What every backend of this app does with a job before it runs: check it, give it an
id and its envelope, push it at once or when the transaction commits."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from django.db import transaction

from django_redisqueue.compat import (
    TASKS_PACKAGE,
    BaseTaskBackend,
    Task,
    log_task_enqueued,
    task_enqueued,
)
from django_redisqueue.core import tracing
from django_redisqueue.core.conf import Options, parse_options
from django_redisqueue.core.jobs import Envelope, JobRecord, ensure_json_arguments
from django_redisqueue.core.results import make_result
from django_redisqueue.core.tasks import RedisTask, RedisTaskResult
from django_redisqueue.exceptions import ConfigurationError
from django_redisqueue.store.wire import NewJob

# Moves committed jobs from the outbox of a database (the second argument) to Redis.
Relay = Callable[[list[RedisTaskResult], str], None]


def new_job_id() -> str:
    """A job id: 104 random bits as 26 hex digits, short enough that a waiting job's
    key and its queue entry stay in Redis's small allocation classes. From the
    system's random source, read for 256 ids at a time: a system call each would cost
    an enqueue more than the process id asked. ``list.pop`` hands each to one thread."""
    if _drawn_by[0] != os.getpid():  # a child draws its own: the parent's come twice
        _ids.clear()
        _drawn_by[0] = os.getpid()
    while True:
        try:
            return _ids.pop()
        except IndexError:
            drawn = secrets.token_hex(13 * _IDS_DRAWN)
            _ids.extend(drawn[i : i + 26] for i in range(0, len(drawn), 26))


_IDS_DRAWN = 256
_ids: list[str] = []
# The process that drew them: asked at each call, as a fork in C (uWSGI's) runs no hooks.
_drawn_by = [os.getpid()]


# Our verdict on who hears task_enqueued, kept in the signal's own cache, which
# connect() and disconnect() empty.
_ONLY_THE_LOG = object()
_TASKS_LOGGER = logging.getLogger(TASKS_PACKAGE)


def enqueued_is_heard(sender: type) -> bool:
    """Whether sending task_enqueued from ``sender`` would do anything: a receiver
    besides the framework's own DEBUG log line, or that line logged. Sending it to that
    line alone costs an enqueue about 10 µs for a line nobody logs."""
    cache = getattr(task_enqueued, "sender_receivers_cache", None)
    if not isinstance(cache, dict):
        return True
    key = (_ONLY_THE_LOG, sender)
    only_the_log = cache.get(key)
    if not isinstance(only_the_log, bool):
        # Marked before the receivers are read, kept only if no connect() or
        # disconnect() emptied the cache meanwhile (they do it under the lock).
        cache[key] = mark = object()
        try:
            sync, asynchronous = task_enqueued._live_receivers(sender)
        except (AttributeError, TypeError, ValueError):  # another Django's: send it
            return True
        only_the_log = list(sync) == [log_task_enqueued] and not asynchronous
        with task_enqueued.lock:
            if cache.get(key) is mark:
                cache[key] = only_the_log
    return not only_the_log or _TASKS_LOGGER.isEnabledFor(logging.DEBUG)


class JobPreparation(BaseTaskBackend):
    """What every backend of this app does with a job before it runs: check it, give
    it an id and its envelope, then ``push`` it (at once, or when the transaction
    commits). ``RedisQueueBackend`` pushes to Redis; ``ImmediateBackend`` runs it."""

    alias: str
    params: dict[str, Any]

    # Read at first use, not at start: Django builds every backend to run its system
    # checks, which must be able to report wrong settings rather than crash on them.
    @cached_property
    def config(self) -> Options:
        """The parsed settings; raises ConfigurationError if they are wrong."""
        return parse_options(self.alias, self.params)

    def push(self, results: Sequence[RedisTaskResult]) -> None:
        """Hand prepared jobs on: to Redis (one round trip), or run them."""
        raise NotImplementedError

    def enqueue(
        self, task: Task, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> RedisTaskResult:
        """Queue a job; with ENQUEUE_ON_COMMIT, once the current transaction commits."""
        return self.enqueue_many(task, [(args, kwargs)])[0]

    def enqueue_many(
        self,
        task: Task,
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
        *,
        on_commit: bool | None = None,
        using: str | None = None,
    ) -> list[RedisTaskResult]:
        """Queue one job of ``task`` per ``(args, kwargs)`` pair, sent together (one
        round trip per batch). Every job is checked before any is sent: a bad one
        raises and none is queued. ``on_commit`` (default: ENQUEUE_ON_COMMIT): once
        the transaction on database ``using`` commits."""
        self.validate_once(task)
        outbox = self.outbox_database(task, using)
        if on_commit is None:
            on_commit = self.config.enqueue_on_commit
        with tracing.sending("enqueue", task.queue_name) as sending:
            results = [
                self.prepare_valid(task, args, kwargs, sending.carrier) for args, kwargs in calls
            ]
            if outbox is not None:
                self.push_to_outbox(results, outbox)
            elif on_commit:
                self.push_on_commit(results, using)
            else:
                self.push(results)
            if isinstance(sending, tracing.Sending):
                at_commit = outbox is not None or (
                    on_commit and transaction.get_connection(using).in_atomic_block
                )
                # A unique job's id is known once it reaches Redis (the holder's).
                unique = at_commit and getattr(task, "unique", False) is not False
                sending.sent([] if unique else [r.id for r in results], at_commit=at_commit)
        return results

    def outbox_database(self, task: Task, using: str | None) -> str | None:
        """The database whose transaction ``task``'s jobs join through the outbox:
        ``using`` (default: the first of OUTBOX) when OUTBOX is on and the task does not
        say ``outbox=False``; None when there is no outbox there (the jobs go as without
        one) or no transaction to join. Raises ConfigurationError for ``outbox=True``
        where there is no outbox; ValueError for a unique task in a transaction."""
        databases = self.config.outbox
        wanted = getattr(task, "outbox", None)
        if wanted is False or (wanted is None and not databases):
            return None
        if not databases:
            raise ConfigurationError(
                f"{task.module_path} asks for the outbox, but TASKS[{self.alias!r}] has "
                "none: set OPTIONS['OUTBOX'] (True, or the databases to keep it in)."
            )
        database = using or databases[0]
        if database not in databases:
            if not wanted:
                return None
            raise ConfigurationError(
                f"Database {database!r} has no outbox for TASKS[{self.alias!r}]: its "
                f"OPTIONS['OUTBOX'] names {', '.join(map(repr, databases))}."
            )
        if not transaction.get_connection(database).in_atomic_block:
            return None  # no transaction to join: the job goes to Redis at once
        if getattr(task, "unique", False) is not False:
            raise ValueError(
                f"{task.module_path} is unique: its key is taken when the job reaches "
                "Redis, after the commit, so the job cannot go through the outbox. "
                "Enqueue it with .using(outbox=False)."
            )
        return database

    def push_to_outbox(self, results: list[RedisTaskResult], database: str) -> None:
        """Keep ``results`` in the outbox of ``database``'s transaction until it
        commits. A backend without a table of its own pushes them at the commit."""
        self.push_on_commit(results, database)

    def enqueue_on_commit(
        self,
        task: Task,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        *,
        using: str | None = None,
    ) -> RedisTaskResult:
        """Check a job now and push it once the transaction on database ``using``
        commits (at once outside a transaction; never if it rolls back).

        The result carries the job's id from the start; its ``enqueued_at`` is set
        when the job is pushed, and until then ``get_result()`` does not find it.
        """
        return self.enqueue_many(task, [(args, kwargs)], on_commit=True, using=using)[0]

    def push_on_commit(
        self,
        results: list[RedisTaskResult],
        using: str | None,
        *,
        relay: tuple[Relay, str] | None = None,
    ) -> None:
        """Push ``results`` when the transaction commits, together with the jobs
        queued just before them in the same transaction and savepoint: a view that
        queues ten jobs sends them in one round trip at the commit. ``relay``: they are
        in the outbox of a database, ``(relay, database)``, and move from it instead."""
        connection = transaction.get_connection(using)
        if connection.in_atomic_block and connection.run_on_commit:
            # Django keeps (savepoint ids, callback, robust) per callback. Joining the
            # batch registered last keeps both its guarantees: the order of the
            # on_commit callbacks, and that a savepoint rolled back drops its jobs
            # (they all belong to the same savepoints).
            savepoints, last = connection.run_on_commit[-1][:2]
            if (
                isinstance(last, _CommitBatch)
                and last.backend is self
                and last.relay == relay
                and savepoints == set(connection.savepoint_ids)
            ):
                last.results += results
                return
        batch = _CommitBatch(self, results, relay)
        transaction.on_commit(batch, using=using)

    def prepare(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> RedisTaskResult:
        """Validate a job and give it its id: a READY result that is not pushed yet.

        Raises at the call site: InvalidTask, TypeError for an argument that does not
        survive JSON, ValueError for a job over MAX_PAYLOAD_BYTES.
        """
        self.validate_once(task)
        return self.prepare_valid(task, args, kwargs, tracing.carrier())

    def validate_once(self, task: Task) -> None:
        """``validate_task``, remembered: a task (a frozen value) that passed once
        passes again, so the checks are not paid on every enqueue."""
        validated: set[Task] = self.__dict__.setdefault("_validated_tasks", set())
        try:
            if task in validated:
                return
        except TypeError:  # a field that cannot be hashed: check every time
            self.validate_task(task)
            return
        self.validate_task(task)
        if len(validated) >= 1024:
            validated.clear()
        validated.add(task)

    def prepare_valid(
        self,
        task: Task,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        trace: Mapping[str, str] | None = None,
    ) -> RedisTaskResult:
        """``prepare`` for a task already validated; ``trace``: the trace context the
        job carries (core/tracing.py), if any."""
        ensure_json_arguments(task.module_path, args, kwargs)
        envelope = Envelope(
            task_path=task.module_path,
            args=list(args),
            kwargs=dict(kwargs),
            queue_name=task.queue_name,
            priority=task.priority,
            run_after=task.run_after.timestamp() if task.run_after else None,
            trace=trace,
        )
        payload = envelope.dumps()
        size = len(payload.encode())
        if size > self.config.max_payload_bytes:
            raise ValueError(
                f"The job for {task.module_path}() is {size} bytes of JSON, over the "
                f"{self.config.max_payload_bytes}-byte MAX_PAYLOAD_BYTES limit: pass "
                "a reference (a primary key, a file path) instead of the data."
            )
        result = make_result(self.alias, task, JobRecord(new_job_id(), {}, envelope))
        object.__setattr__(result, "_payload", payload)
        if isinstance(task, RedisTask):
            fair = task.queue_name in self.config.fair_queues
            object.__setattr__(result, "_options", task.job_options(args, kwargs, fair))
        return result


class _CommitBatch:
    """The jobs pushed together when a transaction commits (an on_commit callback)."""

    def __init__(
        self,
        backend: JobPreparation,
        results: list[RedisTaskResult],
        relay: tuple[Relay, str] | None,
    ) -> None:
        self.backend = backend
        self.results = results
        self.relay = relay  # (how, database) when an outbox holds them

    def __call__(self) -> None:
        if self.relay is None:
            self.backend.push(self.results)
        else:
            relay, database = self.relay
            relay(self.results, database)


def new_job(result: RedisTaskResult, after: str = "") -> NewJob:
    run_after = result.task.run_after
    return NewJob(
        result.id,
        result.task.queue_name,
        result.task.priority,
        result._payload,
        int(run_after.timestamp() * 1000) if run_after else 0,
        after,
        result._options,
    )


def job_after(result: RedisTaskResult) -> str:
    """The id of the job ``result``'s job runs after ('' for none)."""
    return getattr(result.task, "depends_on", None) or ""
