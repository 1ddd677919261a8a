"""The public task API: ``@task``, ``RedisTask`` and ``RedisTaskResult``.

``RedisTask`` is Django's ``Task`` plus ``delay()``, ``using(delay=...)`` and calling
the task directly; the backend's ``task_class`` is ``RedisTask``, so Django's own
``task`` decorator makes the same object when it targets this backend.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, cast, overload

from django.db import transaction
from django.utils import timezone

from django_redisqueue.compat import (
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    TASK_REFRESH_ATTRS,
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    task_backends,
)
from django_redisqueue.core.jobs import JOB_ID_RE, to_json
from django_redisqueue.core.progress import JobProgress
from django_redisqueue.exceptions import TaskFailed

DEFAULT_BACKEND_ALIAS = "default"

# The longest wait between two attempts, whatever the backoff says.
MAX_RETRY_DELAY = 3600.0

# A rate limit: "100/m", "10/s", "5/10s", "1000/h", "20000/d".
RATE_LIMIT_RE = re.compile(r"(\d+)/(\d*)([smhd])")
RATE_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# A rate limit keeps one entry per start within its period: bounded, as is the period.
MAX_RATE_STARTS = 100_000
MAX_RATE_PERIOD_MS = 366 * 86_400_000
# A unique or limit key: what it names is up to the caller; Redis takes any text, the
# bound keeps keys small.
MAX_KEY_LENGTH = 200


def parse_rate_limit(rate: str) -> tuple[int, int]:
    """``"100/m"`` as (100 starts, per 60,000 ms); ``"5/10s"``: 5 per 10 s. Raises
    ValueError for anything else."""
    match = RATE_LIMIT_RE.fullmatch(rate) if isinstance(rate, str) else None
    starts = int(match[1]) if match else 0
    period = int(match[2] or 1) * RATE_UNITS_MS[match[3]] if match else 0
    if not 1 <= starts <= MAX_RATE_STARTS or not 1 <= period <= MAX_RATE_PERIOD_MS:
        raise ValueError(
            f"rate_limit must be '<starts>/<period>' such as '100/m', '10/s' or '5/10s' "
            f"(1 to {MAX_RATE_STARTS:,} starts; a period of s, m, h or d, at most 366 days), "
            f"not {rate!r:.80}."
        )
    return starts, period


def arguments_digest(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The same digest for the same arguments (keyword order aside): a unique job's key."""
    text = json.dumps([list(args), kwargs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _check_key(name: str, value: object) -> None:
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate: Redis's JSON could not read it
            raise ValueError(
                f"{name} must be text that UTF-8 can carry, not {value!r:.80}."
            ) from None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LENGTH:
        raise ValueError(
            f"{name} must be text of 1 to {MAX_KEY_LENGTH} characters, not {value!r:.80}."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTask(Task):
    """Django's Task, plus a retry policy and a few shortcuts.

    ``timeout``: seconds a job may run; past it, ``JobTimeout`` is raised inside the
    task, which fails it (or retries it: ``JobTimeout`` is an ``Exception``).

    ``retries``: how many times a job that raised one of ``retry_on`` is tried again.
    The n-th retry waits ``retry_backoff * 2**(n-1)`` seconds (at most an hour); with
    ``retry_jitter`` a random time between half that and all of it, so that jobs that
    failed together do not retry together.

    ``unique``: True (the key is the task and its arguments) or a key: while a job
    holding the key has not ended (or, with ``unique_for``, for that many seconds after
    it was enqueued), enqueueing another returns that job's result instead.

    ``concurrency_limit``: at most this many of the jobs sharing ``limit_key`` (default:
    the task) RUNNING at once, across every worker; ``rate_limit``: at most this many
    starts per period ("100/m"). A job over its limit waits, parked, and the jobs
    behind it run.
    """

    retries: int = 0
    retry_backoff: float = 1.0
    retry_jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    timeout: float | None = None  # seconds; a job past it fails with JobTimeout
    # The id of a job this task's jobs run after, once it succeeded (``using()``).
    depends_on: str | None = None
    unique: bool | str = False
    unique_for: float | None = None  # seconds; None: while the job has not ended
    concurrency_limit: int | None = None
    rate_limit: str | None = None
    limit_key: str | None = None  # default: the task's module path
    # Whose turn its jobs take on a fair queue (``using(fair_key=...)``); None: the
    # turn of the jobs that name none.
    fair_key: str | None = None
    # Whether enqueue() in a transaction writes its jobs to the outbox (outbox.py);
    # None: as the backend's OUTBOX says.
    outbox: bool | None = None

    def __post_init__(self) -> None:
        if self.outbox is not None and not isinstance(self.outbox, bool):
            raise ValueError(f"outbox must be True, False or None, not {self.outbox!r:.80}.")
        if self.depends_on is not None and not (
            isinstance(self.depends_on, str) and JOB_ID_RE.fullmatch(self.depends_on)
        ):
            raise ValueError(f"depends_on must be a job id, not {self.depends_on!r:.80}.")
        if self.timeout is not None and (
            not isinstance(self.timeout, int | float) or self.timeout <= 0
        ):
            raise ValueError(f"timeout must be seconds > 0 or None, not {self.timeout!r}.")
        self._check_retries()
        self._check_uniqueness()
        self._check_limits()
        Task.__post_init__(self)

    def _check_retries(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, not {self.retries!r}.")
        if not isinstance(self.retry_backoff, int | float) or self.retry_backoff < 0:
            raise ValueError(f"retry_backoff must be seconds >= 0, not {self.retry_backoff!r}.")
        if not (
            isinstance(self.retry_on, tuple)
            and all(isinstance(c, type) and issubclass(c, BaseException) for c in self.retry_on)
        ):
            raise ValueError(
                f"retry_on must be a tuple of exception classes, not {self.retry_on!r}."
            )

    def _check_uniqueness(self) -> None:
        if not isinstance(self.unique, bool):
            _check_key("unique", self.unique)
        if self.unique_for is not None and (
            not isinstance(self.unique_for, int | float)
            or isinstance(self.unique_for, bool)
            or not 0 < self.unique_for <= 10 * 365 * 86400
        ):
            raise ValueError(f"unique_for must be seconds > 0 or None, not {self.unique_for!r}.")
        if self.unique_for is not None and self.unique is False:
            raise ValueError("unique_for needs unique=True or a unique key.")
        if self.unique is not False and self.depends_on is not None:
            raise ValueError("A job that runs after another (depends_on) cannot be unique.")

    def _check_limits(self) -> None:
        if self.concurrency_limit is not None and (
            not isinstance(self.concurrency_limit, int)
            or isinstance(self.concurrency_limit, bool)
            or self.concurrency_limit < 1
        ):
            raise ValueError(
                f"concurrency_limit must be a whole number >= 1 or None, not "
                f"{self.concurrency_limit!r:.80}."
            )
        if self.rate_limit is not None:
            parse_rate_limit(self.rate_limit)
        if self.limit_key is not None:
            _check_key("limit_key", self.limit_key)
            if self.concurrency_limit is None and self.rate_limit is None:
                raise ValueError("limit_key needs a concurrency_limit or a rate_limit.")
        if self.fair_key is not None:
            _check_key("fair_key", self.fair_key)

    def retry_delay(self, exc: BaseException, failures: int) -> float | None:
        """Seconds to wait before trying again after ``failures`` failed attempts
        (this one included), or None if the job should fail now."""
        if failures > self.retries or not isinstance(exc, self.retry_on):
            return None
        delay = min(self.retry_backoff * 2 ** (failures - 1), MAX_RETRY_DELAY)
        if self.retry_jitter:
            delay = random.uniform(delay / 2, delay)
        return delay

    def job_options(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], fair: bool = False
    ) -> str:
        """What the enqueue keeps with a job of these arguments besides its envelope:
        its unique key, its limits and, on a ``fair`` queue, its fairness key, as JSON
        ('' for none, the common case)."""
        options: dict[str, Any] = {}
        if fair:
            options["fair"] = self.fair_key or ""
        if self.unique is not False:
            options["unique"] = (
                self.unique
                if isinstance(self.unique, str)
                else f"{self.module_path}:{arguments_digest(args, kwargs)}"
            )
            if self.unique_for is not None:
                options["unique_ms"] = max(int(self.unique_for * 1000), 1)
        if self.concurrency_limit is not None or self.rate_limit is not None:
            options["limit"] = self.limit_key or self.module_path
            if self.concurrency_limit is not None:
                options["max_running"] = self.concurrency_limit
            if self.rate_limit is not None:
                options["rate"], options["per"] = parse_rate_limit(self.rate_limit)
        return to_json(options) if options else ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task inline, in this process, as a plain function call."""
        return self.call(*args, **kwargs)

    # (Task's, by name: a slots dataclass's zero-argument super() fails.)
    def call(self, *args: Any, **kwargs: Any) -> Any:
        return Task.call(self, *_job_context(self, args), **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return await Task.acall(self, *_job_context(self, args), **kwargs)

    def job(self, *args: Any, **kwargs: Any) -> Job:
        """This task with these arguments, not queued yet: a member of a ``group()``,
        a step of a ``chain()`` (or ``.then()``), or a ``broadcast()``."""
        return Job(self, args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> TaskResult:
        """Queue up the task: an alias of ``enqueue()``."""
        return self.enqueue(*args, **kwargs)

    def enqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """Queue one job per ``(args, kwargs)`` pair, sent together: one round trip
        per batch of up to 1,000 jobs. Every job is checked before any is sent.
        With ENQUEUE_ON_COMMIT the jobs wait for the transaction to commit, as
        ``enqueue()`` does. On a backend that is not this app's, ``enqueue()`` is
        called for each."""
        backend = self.get_backend()
        if hasattr(backend, "enqueue_many"):
            return list(backend.enqueue_many(self, calls))
        return [self.enqueue(*args, **kwargs) for args, kwargs in calls]

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> TaskResult | None:
        """Queue up the task once the current transaction (default database) commits.

        The arguments are checked now, and the result returned now carries the job's
        id; outside a transaction the job is queued at once, and if the transaction
        rolls back it never is. On a backend that is not this app's, the job is
        enqueued on commit with ``enqueue()`` and None is returned.
        """
        backend = self.get_backend()
        if hasattr(backend, "enqueue_on_commit"):
            return backend.enqueue_on_commit(self, args, kwargs)
        transaction.on_commit(functools.partial(self.enqueue, *args, **kwargs))
        return None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        delay: float | timedelta | None = None,
        depends_on: TaskResult | str | None = None,
        unique_key: str | None = None,
        limit_key: str | None = None,
        fair_key: str | None = None,
        outbox: bool | None = None,
    ) -> RedisTask:
        """Create a new task with modified defaults; ``delay`` sets ``run_after``;
        ``depends_on`` (a result or a job id) holds its jobs until that job succeeded
        (if it fails, they fail with ``DependencyFailed``); ``unique_key`` makes its
        jobs unique under that key; ``limit_key`` counts them under that key's limits
        (the task's ``concurrency_limit`` and ``rate_limit``); ``fair_key`` names whose
        turn its jobs take on a fair queue (a customer, say); ``outbox`` writes its jobs
        into the transaction's outbox, or not, whatever the backend's OUTBOX says."""
        if delay is not None:
            if run_after is not None:
                raise TypeError("Pass either delay or run_after, not both.")
            if not isinstance(delay, timedelta):
                delay = timedelta(seconds=delay)
            run_after = timezone.now() + delay
        task: RedisTask = Task.using(  # type: ignore[assignment]  # a RedisTask, as self is
            self,
            priority=priority,
            queue_name=queue_name,
            run_after=run_after,
            backend=backend,
        )
        changes: dict[str, Any] = {}
        if depends_on is not None:
            changes["depends_on"] = depends_on if isinstance(depends_on, str) else depends_on.id
        if unique_key is not None:
            changes["unique"] = unique_key
        if limit_key is not None:
            changes["limit_key"] = limit_key
        if fair_key is not None:
            changes["fair_key"] = fair_key
        if outbox is not None:
            changes["outbox"] = outbox
        return replace(task, **changes) if changes else task


# TaskResult is a frozen dataclass at run time; django-stubs do not say so.
@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTaskResult(TaskResult):  # type: ignore[misc]
    # The job's JSON envelope, made once when it is prepared (not kept once stored).
    _payload: str = field(init=False, default="", repr=False, compare=False)
    # Its unique key and limits as JSON ('' for none; RedisTask.job_options).
    _options: str = field(init=False, default="", repr=False, compare=False)
    # What its task reported last, of its latest attempt (core/progress.py).
    _progress: JobProgress | None = field(init=False, default=None, repr=False, compare=False)

    @property
    def progress(self) -> JobProgress | None:
        """What the job's task reported last (``context.set_progress``), as of when
        this result was read or refreshed; None if it reported nothing in its latest
        attempt."""
        return self._progress

    def refresh(self) -> None:
        """Reload what Django's results hold, and the progress, from Redis."""
        self._take(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._take(await self.task.get_backend().aget_result(self.id))

    def _take(self, refreshed: TaskResult) -> None:
        for name in (*TASK_REFRESH_ATTRS, "_progress"):
            object.__setattr__(self, name, getattr(refreshed, name, None))

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job finishes; return its value or raise ``TaskFailed``.

        Raises ``ResultTimeout`` (a ``TimeoutError``) if it has not finished in
        ``timeout`` seconds (None waits for ever).
        """
        _backend(self.backend).wait(self.id, timeout)
        self.refresh()
        if self.status == TaskResultStatus.FAILED:
            raise TaskFailed(self)
        return self.return_value

    def cancel(self) -> None:
        """Cancel the job if it has not started; raise ``NotCancellable`` otherwise.

        A cancelled job ends FAILED, with a ``JobCancelled`` error.
        """
        _backend(self.backend).cancel(self.id)
        self.refresh()

    def stop(self) -> bool:
        """Stop the job while it runs: its worker stops the task within a second, and
        the job ends FAILED with a ``JobStopped`` error, never retried. Returns False
        when it had ended already (nothing changes); raises ``NotStoppable`` when it has
        not started (``cancel()`` it)."""
        asked = _backend(self.backend).stop(self.id)
        self.refresh()
        return asked


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):  # type: ignore[misc]
    """What a task that takes a context is given: Django's ``TaskContext``, and a way
    to report its progress."""

    # Where a report goes: the worker's writer, or nowhere (a backend without a store).
    _report: Callable[[JobProgress], None] = field(default=lambda progress: None, repr=False)

    def set_progress(
        self, done: int | float, total: int | float | None = None, note: str = ""
    ) -> None:
        """Report how much of the job's work is done, of ``total`` (None: unknown),
        with a short note (at most ``MAX_NOTE_CHARS``). Cheap to call as often as you
        like: it never waits on Redis, and the last value reported is stored within
        ``WRITE_INTERVAL``. Raises TypeError or ValueError for amounts that are not
        numbers of 0 or more."""
        progress = JobProgress.checked(done, total, note)
        if isinstance(self.task_result, RedisTaskResult):  # another backend's has no slot
            object.__setattr__(self.task_result, "_progress", progress)
        self._report(progress)


@dataclass(frozen=True, slots=True)
class Job:
    """A task with its arguments, to be queued in a group, a chain or a broadcast."""

    task: RedisTask
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def then(self, *jobs: Job) -> Chain:
        """A chain: this job, then each of ``jobs`` once the one before succeeded."""
        return Chain((self, *checked_jobs(jobs, "then()")))


@dataclass(frozen=True, slots=True)
class Chain:
    """Jobs that run one after the other, each once the one before succeeded."""

    jobs: tuple[Job, ...]

    def then(self, *jobs: Job) -> Chain:
        return Chain((*self.jobs, *checked_jobs(jobs, "then()")))

    def enqueue(self) -> list[RedisTaskResult]:
        """Queue the chain in one atomic call; return a result per step, in order."""
        return cast(_ChainBackend, fan_out_backend(self.jobs)).enqueue_chain(self.jobs)


class _ChainBackend(Protocol):
    def enqueue_chain(self, jobs: Sequence[Job]) -> list[RedisTaskResult]: ...


def _job_context(task: Task, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A task's arguments, its context a ``JobContext`` (Django's runners, the immediate
    backend's, give a plain ``TaskContext``: its progress then stays on the result)."""
    if task.takes_context and args and type(args[0]) is TaskContext:
        return (JobContext(task_result=args[0].task_result), *args[1:])
    return args


def checked_jobs(jobs: Iterable[Job], what: str) -> list[Job]:
    """``jobs`` as a list, once each is a ``Job``; ``what`` names the caller."""
    jobs = list(jobs)
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"{what} takes jobs (task.job(...)), not {job!r:.80}.")
    return jobs


def fan_out_backend(jobs: Iterable[Job]) -> BaseTaskBackend:
    """The one backend of ``jobs``, which must be one with fan-out (this app's)."""
    aliases = {job.task.backend for job in jobs}
    if len(aliases) != 1:
        raise ValueError(
            "The jobs of a group or a chain must all use one backend, not "
            f"{', '.join(sorted(aliases)) or 'none'}."
        )
    backend = task_backends[aliases.pop()]
    if not hasattr(backend, "enqueue_group"):
        raise TypeError(
            f"The {backend.alias!r} task backend ({type(backend).__name__}) has no "
            "groups, chains or broadcast: use django_redisqueue's RedisQueueBackend "
            "(or its ImmediateBackend in tests)."
        )
    return backend


class _WaitsAndCancels(Protocol):
    def wait(self, result_id: str, timeout: float | None = None) -> None: ...

    def cancel(self, result_id: str) -> None: ...

    def stop(self, result_id: str) -> bool: ...


def _backend(alias: str) -> _WaitsAndCancels:
    """The backend of a result: this app's (Redis or immediate), which can wait and cancel."""
    return cast(_WaitsAndCancels, task_backends[alias])


@overload
def task(function: Callable[..., Any], /) -> RedisTask: ...
@overload
def task(
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: bool = ...,
    retries: int = ...,
    retry_backoff: float = ...,
    retry_jitter: bool = ...,
    retry_on: tuple[type[BaseException], ...] = ...,
    timeout: float | None = ...,
    unique: bool | str = ...,
    unique_for: float | None = ...,
    concurrency_limit: int | None = ...,
    rate_limit: str | None = ...,
    limit_key: str | None = ...,
    outbox: bool | None = ...,
) -> Callable[[Callable[..., Any]], RedisTask]: ...
def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_BACKEND_ALIAS,
    takes_context: bool = False,
    retries: int = 0,
    retry_backoff: float = 1.0,
    retry_jitter: bool = True,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    timeout: float | None = None,
    unique: bool | str = False,
    unique_for: float | None = None,
    concurrency_limit: int | None = None,
    rate_limit: str | None = None,
    limit_key: str | None = None,
    outbox: bool | None = None,
) -> RedisTask | Callable[[Callable[..., Any]], RedisTask]:
    """Make a function a task, bare (``@task``) or with options (``@task(...)``)."""

    def wrapper(func: Callable[..., Any]) -> RedisTask:
        return RedisTask(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            run_after=None,
            takes_context=takes_context,
            retries=retries,
            retry_backoff=retry_backoff,
            retry_jitter=retry_jitter,
            retry_on=retry_on,
            timeout=timeout,
            unique=unique,
            unique_for=unique_for,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            limit_key=limit_key,
            outbox=outbox,
        )

    if function is not None:
        return wrapper(function)
    return wrapper
