"""``RedisQueueBackend``: Django's task backend contract, on Redis."""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import Any, cast

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from django_redisqueue.backends.base import (
    JobPreparation,
    enqueued_is_heard,
    job_after,
    new_job,
    new_job_id,
)
from django_redisqueue.backends.outbox import OutboxRelay
from django_redisqueue.compat import (
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    Task,
    TaskResultDoesNotExist,
    task_backends,
    task_enqueued,
)
from django_redisqueue.core import tracing
from django_redisqueue.core.fanout import GroupResult, GroupState
from django_redisqueue.core.jobs import (
    FAILED,
    QUEUE_NAME_RE,
    SUCCESSFUL,
    JobRecord,
    error_info,
    from_seconds,
    stored_value,
    to_json,
)
from django_redisqueue.core.registry import registry
from django_redisqueue.core.results import make_result, task_for, unregistered_task
from django_redisqueue.core.tasks import Job, RedisTask, RedisTaskResult
from django_redisqueue.exceptions import (
    BrokerUnavailable,
    ConfigurationError,
    JobCancelled,
    JobStopped,
    NotCancellable,
    NotStoppable,
    ResultTimeout,
)
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.calls import NotReplicated
from django_redisqueue.store.connection import Client, make_client
from django_redisqueue.store.gateway import REDIS_ERRORS, Reconnector, answered
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.queries import Queries
from django_redisqueue.store.wire import AFTER_GROUP, CANCELLED, MissingJob

logger = logging.getLogger(__name__)

FINAL_STATUSES = frozenset({SUCCESSFUL, FAILED})

# Longest single blocking call while waiting for a result; the wait goes on after it.
WAIT_SLICE = 1.0


class RedisQueueBackend(JobPreparation):
    task_class = RedisTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Django's base keeps QUEUES as a set, read here, and refuses a task on a queue
        # not in it. This backend checks a task's queue itself (validate_task), against
        # its settings once they are read: a QUEUES that is wrong (E001 to E003) neither
        # raises here nor refuses every task where it is defined.
        super().__init__(alias, {**params, "QUEUES": []})
        self.params = params

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """W004: the app is in INSTALLED_APPS. Django's tasks framework runs this from
        its own system check, so it runs when the app is missing and its checks do not."""
        messages = list(super().check(**kwargs))
        if not apps.is_installed("django_redisqueue"):
            messages.append(
                checks.Warning(
                    f"TASKS[{self.alias!r}] uses {type(self).__name__}, but "
                    "'django_redisqueue' is not in INSTALLED_APPS: there is no "
                    "'manage.py runworker' to run its jobs, nor 'runscheduler', the "
                    "dashboard or this app's other checks.",
                    hint="Add 'django_redisqueue' to INSTALLED_APPS, then run "
                    "'manage.py migrate'.",
                    id="django_redisqueue.W004",
                )
            )
        return messages

    @cached_property
    def queue_names(self) -> tuple[str, ...]:
        """QUEUES in priority order (Django keeps them as a set); empty when any queue
        name is valid."""
        return self.config.queues

    def served_queues(self) -> list[str]:
        """The queues workers serve by default, in priority order: QUEUES, or, when any
        queue name is valid, every queue jobs were enqueued to, in alphabetical order."""
        return list(self.queue_names) or self.queries.known_queues()

    def serves(self, queue: str) -> bool:
        """Whether ``queue`` is one of ``served_queues()``, asked without reading them."""
        if self.queue_names:
            return queue in self.queue_names
        return self.queries.knows_queue(queue)

    @cached_property
    def keys(self) -> KeySchema:
        return KeySchema.for_backend(self.config.key_prefix)

    def get_client(self) -> Client:
        """Return a Redis client: on a Redis cache's pool (Django's or django-redis's),
        one made from the URL (a server, or a node of a cluster), or a Sentinel master's."""
        return make_client(self.config)

    def connect(self) -> Broker:
        """The broker, once its client could be made. A cluster client connects as it is
        made; while no node answers, wait with backoff (a worker started before its
        Redis is up waits for it, as it does for a Redis that goes away later)."""
        backoff = Reconnector(logger, f"Backend {self.alias!r}")
        while True:
            try:
                broker = self.broker
            except REDIS_ERRORS as exc:
                backoff.failed(exc)
                continue
            backoff.succeeded()
            return broker

    @cached_property
    def broker(self) -> Broker:
        broker = Broker(
            self.get_client(),
            self.keys,
            lease=self.config.lease,
            result_ttl=self.config.result_ttl,
            replica_acks=self.config.replica_acks,
            replica_acks_timeout=self.config.replica_acks_timeout,
        )
        # The broker is in reference cycles (its scripts' bound methods); this backend
        # is not: its spare connections go back to the pool when it goes, with its
        # thread, not at the collector's next full pass.
        weakref.finalize(self, broker.spares.close_all)
        return broker

    @cached_property
    def outbox(self) -> OutboxRelay:
        """The backend's side of its outboxes (OPTIONS['OUTBOX'], maybe none)."""
        return OutboxRelay(
            self.alias,
            self.config.outbox,
            self.broker,
            self.push,
            record_queues=not self.queue_names,
        )

    def push_to_outbox(self, results: list[RedisTaskResult], database: str) -> None:
        """Write ``results`` to the outbox in the transaction on ``database``; once it
        commits, relay them."""
        self.outbox.write(results, database)
        self.push_on_commit(results, database, relay=(self.outbox.relay_committed, database))

    def outboxed(self, job_id: str) -> dict[str, str] | None:
        """The fields of a job still in an outbox (``OutboxRelay.fields``)."""
        return self.outbox.fields(job_id) if self.config.outbox else None

    @cached_property
    def queries(self) -> Queries:
        """The read side (dashboard, metrics, health), on the broker's client."""
        return Queries(self.broker.client, self.keys, result_ttl=self.config.result_ttl)

    def validate_task(self, task: Task) -> None:
        """Refuse a task this backend cannot run. Django calls this where a task is
        defined, as its module is imported (a tasks module that a view imports, which
        the URLconf's system check imports): with wrong settings, which the system
        checks report, the task's queue is not checked against them, and the backend
        raises ConfigurationError when it is used (``config``)."""
        try:
            queue_names, fair_queues = self.queue_names, self.config.fair_queues
        except ConfigurationError:
            queue_names, fair_queues = (), frozenset()
        if queue_names and task.queue_name not in queue_names:
            raise InvalidTask(
                f"Queue '{task.queue_name}' is not valid for backend. It is not one of the "
                f"{self.alias!r} backend's QUEUES ({', '.join(queue_names)}): add it "
                f"to TASKS[{self.alias!r}]['QUEUES'] or use one of those."
            )
        if not QUEUE_NAME_RE.fullmatch(task.queue_name):
            raise InvalidTask(
                f"Queue '{task.queue_name}' is not valid for backend: a queue name is 1 to "
                "64 letters, digits, '_', '.' or '-'."
            )
        fair_key = getattr(task, "fair_key", None)
        if fair_key is not None and task.queue_name not in fair_queues:
            raise InvalidTask(
                f"A fair_key was given for queue '{task.queue_name}', which does not serve "
                f"keys in turn: add it to TASKS[{self.alias!r}]['OPTIONS']['FAIR_QUEUES']."
            )
        super().validate_task(task)
        if task.func is not unregistered_task:
            registry.register(task)

    def push(self, results: Sequence[RedisTaskResult], *, relayed: bool = False) -> None:
        """Put prepared jobs in Redis (one round trip), set their ``enqueued_at`` and
        send task_enqueued for each. Jobs that depend on another (``depends_on``) go
        through the linked enqueue, which holds them until that job succeeded.
        ``relayed``: they come from the outbox, and a job relayed before (or whose id
        is taken) is skipped, whatever became of it since."""
        after = [job_after(result) for result in results]
        if any(after):
            self.push_linked(results, after, relayed=relayed)
            return
        self._stored(
            results,
            lambda: self.broker.enqueue(
                [new_job(result) for result in results],
                record_queues=not self.queue_names,
                relayed=relayed,
            ),
            relayed=relayed,
        )

    def push_linked(
        self,
        results: Sequence[RedisTaskResult],
        after: Sequence[str],
        group_id: str = "",
        *,
        relayed: bool = False,
    ) -> None:
        """``push`` for jobs that wait for another (``after``: a job id, AFTER_GROUP for
        a group's callback, or '') or belong to group ``group_id``."""
        jobs = [new_job(result, wait) for result, wait in zip(results, after, strict=True)]
        self._stored(
            results,
            lambda: self.broker.enqueue_linked(
                jobs, group_id=group_id, record_queues=not self.queue_names, relayed=relayed
            ),
            relayed=relayed,
        )

    def _stored(
        self,
        results: Sequence[RedisTaskResult],
        store: Callable[[], Sequence[int | str | None]],
        *,
        relayed: bool = False,
    ) -> None:
        """Run ``store`` (a broker enqueue of ``results``), turning Redis errors into
        BrokerUnavailable; then set each result's ``enqueued_at`` and send
        task_enqueued."""
        try:
            enqueued = store()
        except MissingJob as exc:
            raise TaskResultDoesNotExist(
                f"Job {exc.job_id}, which {_names(results)} would run after, does not exist "
                "(or its result expired): nothing was queued."
            ) from None
        except NotReplicated as exc:
            raise BrokerUnavailable(
                f"Enqueued {_names(results)}, but not safely: {exc}. The job(s) run unless "
                "the master fails first; enqueueing them again may run them twice."
            ) from exc
        except REDIS_ERRORS as exc:
            raise self._unavailable(f"enqueue {_names(results)}", exc) from exc
        taken = []
        holders: dict[str, RedisTaskResult | None] = {}
        heard = enqueued_is_heard(type(self))
        for result, enqueued_at in zip(results, enqueued, strict=True):
            if enqueued_at is None:
                if not relayed:
                    taken.append(result)
                continue
            if isinstance(enqueued_at, str):
                self._adopt(result, enqueued_at, holders)
                continue
            object.__setattr__(result, "enqueued_at", from_seconds(enqueued_at / 1000))
            if heard:
                task_enqueued.send(type(self), task_result=result)
        if taken:
            raise BrokerUnavailable(
                f"Could not enqueue {_names(taken)}: job id "
                f"{', '.join(r.id for r in taken)} is taken."
            )

    def _adopt(
        self,
        result: RedisTaskResult,
        holder: str,
        holders: dict[str, RedisTaskResult | None],
    ) -> None:
        """Make ``result`` (a unique job not stored) the result of ``holder``, the job
        holding its unique key: the caller gets that job, as the enqueue promises.
        ``holders``: the holders read so far in this batch (one read per holder)."""
        if holder not in holders:
            try:
                holders[holder] = self.get_result(holder)
            except TaskResultDoesNotExist:
                holders[holder] = None  # ended and expired since: its id is all there is
        held = holders[holder]
        object.__setattr__(result, "id", holder)
        if held is not None:
            for name in ("status", "enqueued_at", "started_at", "finished_at",
                         "last_attempted_at", "args", "kwargs", "errors", "worker_ids",
                         "_return_value"):  # fmt: skip
                object.__setattr__(result, name, getattr(held, name))

    # Fan-out (core/fanout.py)

    def enqueue_group(self, members: Sequence[Job], callback: Job | None) -> GroupResult:
        """Queue a group's members and its callback (held until every member ended):
        one atomic call per 1,000 jobs, every call in one round trip."""
        jobs = [*members, *([callback] if callback else [])]
        _refuse(jobs, "a group's jobs", UNIQUE)
        with tracing.sending("enqueue_group", _common_queue(jobs)) as sending:
            results = [self.prepare(job.task, job.args, job.kwargs) for job in members]
            after = [""] * len(results)
            if callback is not None:
                results.append(self.prepare(callback.task, callback.args, callback.kwargs))
                after.append(AFTER_GROUP)
            group_id = new_job_id()
            self.push_linked(results, after, group_id)
            sending.sent([result.id for result in results])
        return GroupResult(
            id=group_id,
            backend=self.alias,
            member_ids=[result.id for result in results[: len(members)]],
            callback_id=results[-1].id if callback is not None else None,
        )

    def enqueue_chain(self, jobs: Sequence[Job]) -> list[RedisTaskResult]:
        """Queue jobs that run one after the other, in one atomic call per batch."""
        _refuse(jobs[1:], "a chain's later steps (they run after the one before)")
        _refuse(jobs, "a chain's steps", ("unique",))
        with tracing.sending("enqueue_chain", _common_queue(jobs)) as sending:
            results = [self.prepare(job.task, job.args, job.kwargs) for job in jobs]
            after = [jobs[0].task.depends_on or ""] + [result.id for result in results[:-1]]
            self.push_linked(results, after)
            sending.sent([result.id for result in results])
        return results

    def _unavailable(self, what: str, exc: Exception) -> BrokerUnavailable:
        """The error for a call to Redis that failed: it did not answer (a lost
        connection, a timeout), or it answered with a refusal (out of memory, a
        read-only replica, loading), which the message quotes."""
        return BrokerUnavailable(
            f"Could not {what}: the {self.alias!r} task backend's Redis "
            f"{'refused it' if answered(exc) else 'did not answer'} "
            f"({type(exc).__name__}: {exc})."
        )

    def send_broadcast(self, job: Job, queue: str = "") -> int:
        """Send ``job`` to every live worker (or every worker serving ``queue``)."""
        if not isinstance(queue, str):
            raise TypeError(f"queue must be a queue name, or '' for every worker; got {queue!r}.")
        if queue and not QUEUE_NAME_RE.fullmatch(queue):
            raise ValueError(f"{queue!r} is not a queue name.")
        if self.queue_names and queue and queue not in self.queue_names:
            raise ValueError(f"{queue!r} is not one of the {self.alias!r} backend's QUEUES.")
        _refuse([job], "a broadcast", (*UNIQUE, "concurrency_limit", "rate_limit"))
        if job.task.run_after is not None:
            raise ValueError("A broadcast runs at once: it takes no run_after or delay.")
        if job.task.takes_context:
            raise ValueError(
                f"{job.task.module_path} takes a context, which a broadcast has not: a "
                "broadcast is no job, it has no result."
            )
        with tracing.sending("broadcast", queue):
            result = self.prepare(job.task, job.args, job.kwargs)
            try:
                return self.broker.broadcast(result._payload, queue)
            except REDIS_ERRORS as exc:
                raise self._unavailable(f"broadcast {_names([result])}", exc) from exc

    def get_group(self, group_id: str) -> GroupResult:
        """The handle of a group queued earlier (from any process)."""
        state = self.group_state(group_id)
        return GroupResult(
            id=group_id,
            backend=self.alias,
            member_ids=self.queries.group_members(group_id),
            callback_id=state.callback_id or None,
            state=state,
        )

    def group_state(self, group_id: str) -> GroupState:
        state = self.queries.group(group_id)
        if state is None:
            raise TaskResultDoesNotExist(f"No group {group_id} (or it expired).")
        return state

    def group_results(self, group_id: str, traces: list[str] | None = None) -> list[Any]:
        """The members' return values, in order; None for a member that failed, has
        not ended, or whose result expired. ``traces``: a list to add the members'
        trace records to (core/tracing.py; '' for a member that has none)."""
        values: list[Any] = []
        members = self.queries.group_members(group_id)
        read = ("status", "result", "trace") if traces is not None else ("status", "result")
        for start in range(0, len(members), 1000):
            for fields in self.queries.jobs(members[start : start + 1000], *read):
                succeeded = fields.get("status") == SUCCESSFUL
                values.append(stored_value(fields.get("result"))[1] if succeeded else None)
                if traces is not None:
                    traces.append(fields.get("trace", ""))
        return values

    def wait_group(self, group_id: str, timeout: float | None = None) -> None:
        """Block on Redis until every member of the group has ended; raise
        ResultTimeout if they have not within ``timeout`` seconds."""
        state = None

        def ended() -> bool:
            nonlocal state
            state = self.group_state(group_id)
            return state.finished_at_ms is not None

        def late() -> str:
            if state is None:
                return f"Group {group_id} could not be read after {timeout} s."
            total = state.total if state.total is not None else "its"
            return f"Group {group_id}: {state.ended} of {total} members ended after {timeout} s."

        block = functools.partial(self.broker.wait_group, group_id)
        self._wait_until(f"group {group_id}", ended, block, timeout, late)

    def cancel_group(self, group_id: str) -> int:
        error = JobCancelled(f"Group {group_id} was cancelled before this job started.")
        return self.broker.cancel_group(group_id, to_json(error_info(error)))

    def get_result(self, result_id: str) -> RedisTaskResult:
        try:
            fields = self.queries.get_job(result_id)
        except REDIS_ERRORS:
            if (fields := self.outboxed(result_id)) is None:
                raise
        if fields is None and (fields := self.outboxed(result_id)) is None:
            # Relayed between the two reads, or not there at all.
            fields = self.queries.get_job(result_id)
        if fields is None:
            raise TaskResultDoesNotExist(result_id)
        record = JobRecord.parse(result_id, fields, self.config.max_payload_bytes)
        task = task_for(record.envelope, self.alias, self.default_queue)
        return make_result(self.alias, task, record)

    @cached_property
    def default_queue(self) -> str:
        """Where a job of an unknown task counts: the first of QUEUES."""
        return (self.queue_names or (DEFAULT_TASK_QUEUE_NAME,))[0]

    def wait(self, result_id: str, timeout: float | None = None) -> None:
        """Block on Redis until the job finishes; raise ResultTimeout if it does not."""
        status = "unknown"

        def ended() -> bool:
            nonlocal status
            status = self.broker.watch(result_id) or ""
            if not status and self.outboxed(result_id):
                status = "in the outbox, waiting for the relay"
            elif not status:
                raise TaskResultDoesNotExist(result_id)
            return status in FINAL_STATUSES

        def late() -> str:
            return f"Job {result_id} has not finished after {timeout} s (it is {status})."

        block = functools.partial(self.broker.wait_finished, result_id)
        self._wait_until(f"job {result_id}", ended, block, timeout, late)

    def _wait_until(
        self,
        what: str,
        ended: Callable[[], bool],
        block: Callable[[float], object],
        timeout: float | None,
        late: Callable[[], str],
    ) -> None:
        """Every wait on Redis: look whether ``what`` has ended, else ``block`` on
        Redis for up to a slice and look again, until ``timeout`` (then ResultTimeout,
        saying ``late()``). Redis errors (a restart, a failover) are waited out, with
        backoff, until the timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = Reconnector(
            logger, f"Waiting for {what}", ceiling=1.0, where=self.broker.describe
        )
        while True:
            try:
                if ended():
                    return
                remaining = WAIT_SLICE if deadline is None else deadline - time.monotonic()
                if remaining > 0:
                    block(min(remaining, WAIT_SLICE))
                backoff.succeeded()
            except REDIS_ERRORS as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise ResultTimeout(
                        f"{what.capitalize()} has not finished after {timeout} s: Redis "
                        f"failed ({exc})."
                    ) from exc
                backoff.failed(exc)
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(late())

    def cancel(self, result_id: str) -> None:
        """Cancel a job that has not started; raise NotCancellable if it has."""
        error = JobCancelled(f"Job {result_id} was cancelled before it started.")
        status = self.broker.cancel(result_id, to_json(error_info(error)))
        if status is None and self.outboxed(result_id):
            raise NotCancellable(
                f"Job {result_id} is in the outbox, waiting for the relay to Redis: it can "
                "be cancelled once it is there."
            )
        if status is None:
            raise TaskResultDoesNotExist(result_id)
        if status != CANCELLED:
            raise NotCancellable(
                f"Job {result_id} is {status}: only a job that has not started (READY) "
                "can be cancelled."
            )

    def stop(self, result_id: str) -> bool:
        """Stop a running job: it ends FAILED with ``JobStopped``, never retried. True
        once asked; False when it had ended already (nothing changes). Raises
        NotStoppable for a job that has not started."""
        error = JobStopped(f"Job {result_id} was asked to stop while it ran.")
        status = self.broker.stop(result_id, to_json(error_info(error)))
        if status is None and self.outboxed(result_id):
            raise NotStoppable(
                f"Job {result_id} is in the outbox, waiting for the relay to Redis: it has "
                "not started, and can be cancelled once it is there."
            )
        if status is None:
            raise TaskResultDoesNotExist(result_id)
        if status == "READY":
            tried = self.get_result(result_id).attempts
            waits = (
                f"waits to be tried again after {tried} attempt(s)" if tried else "has not started"
            )
            raise NotStoppable(f"Job {result_id} {waits}: cancel() it instead.")
        return status in ("STOPPING", "STOPPED")


# The options a linked enqueue (a group, a chain, a broadcast) cannot keep.
UNIQUE = ("depends_on", "unique")


def _refuse(jobs: Sequence[Job], what: str, options: Sequence[str] = ("depends_on",)) -> None:
    """Raise ValueError if any of ``jobs`` sets one of ``options``, which ``what`` cannot
    keep (it would be dropped without a word)."""
    for job in jobs:
        for name in options:
            if getattr(job.task, name, None):
                raise ValueError(f"{name} cannot be used for {what}: {job.task.module_path}.")


def _common_queue(jobs: Sequence[Job]) -> str:
    """The queue of every job in ``jobs``, or '' when they go to several."""
    queues = {job.task.queue_name for job in jobs}
    return queues.pop() if len(queues) == 1 else ""


def _names(results: Sequence[RedisTaskResult]) -> str:
    """What a batch of jobs is, for a message: "app.tasks.f()" or "3 jobs"."""
    paths = {result.task.module_path for result in results}
    if len(results) == 1:
        return f"{paths.pop()}()"
    return f"{len(results)} jobs of {paths.pop()}()" if len(paths) == 1 else f"{len(results)} jobs"


def our_backends() -> Iterator[tuple[str, dict[str, Any]]]:
    """The ``TASKS`` aliases served by RedisQueueBackend, with their settings."""
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own handler reports a backend it cannot import
        if isinstance(backend_class, type) and issubclass(backend_class, RedisQueueBackend):
            yield alias, params


def redisqueue_backends() -> list[RedisQueueBackend]:
    """Every backend of settings.TASKS that is a RedisQueueBackend."""
    return [cast(RedisQueueBackend, task_backends[alias]) for alias, _ in our_backends()]
