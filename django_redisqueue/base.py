"""The public task API: ``@task``, ``RedisTask`` and ``RedisTaskResult``.

``RedisTask`` is Django's ``Task`` plus ``delay()``, ``using(delay=...)`` and calling
the task directly; the backend's ``task_class`` is ``RedisTask``, so Django's own
``task`` decorator makes the same object when it targets this backend.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast, overload

from django.db import transaction
from django.utils import timezone

from .compat import (
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    Task,
    TaskResult,
    TaskResultStatus,
    task_backends,
)
from .exceptions import TaskFailed
from .jobs import JOB_ID_RE

if TYPE_CHECKING:
    from .workflows import Job

DEFAULT_BACKEND_ALIAS = "default"

# The longest wait between two attempts, whatever the backoff says.
MAX_RETRY_DELAY = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTask(Task):
    """Django's Task, plus a retry policy and a few shortcuts.

    ``timeout``: seconds a job may run; past it, ``JobTimeout`` is raised inside the
    task, which fails it (or retries it: ``JobTimeout`` is an ``Exception``).

    ``retries``: how many times a job that raised one of ``retry_on`` is tried again.
    The n-th retry waits ``retry_backoff * 2**(n-1)`` seconds (at most an hour); with
    ``retry_jitter`` a random time between half that and all of it, so that jobs that
    failed together do not retry together.
    """

    retries: int = 0
    retry_backoff: float = 1.0
    retry_jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    timeout: float | None = None  # seconds; a job past it fails with JobTimeout
    # The id of a job this task's jobs run after, once it succeeded (``using()``).
    depends_on: str | None = None

    def __post_init__(self) -> None:
        if self.depends_on is not None and not (
            isinstance(self.depends_on, str) and JOB_ID_RE.fullmatch(self.depends_on)
        ):
            raise ValueError(f"depends_on must be a job id, not {self.depends_on!r:.80}.")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, not {self.retries!r}.")
        if not isinstance(self.retry_backoff, int | float) or self.retry_backoff < 0:
            raise ValueError(f"retry_backoff must be seconds >= 0, not {self.retry_backoff!r}.")
        if self.timeout is not None and (
            not isinstance(self.timeout, int | float) or self.timeout <= 0
        ):
            raise ValueError(f"timeout must be seconds > 0 or None, not {self.timeout!r}.")
        if not (
            isinstance(self.retry_on, tuple)
            and all(isinstance(c, type) and issubclass(c, BaseException) for c in self.retry_on)
        ):
            raise ValueError(
                f"retry_on must be a tuple of exception classes, not {self.retry_on!r}."
            )
        Task.__post_init__(self)

    def retry_delay(self, exc: BaseException, failures: int) -> float | None:
        """Seconds to wait before trying again after ``failures`` failed attempts
        (this one included), or None if the job should fail now."""
        if failures > self.retries or not isinstance(exc, self.retry_on):
            return None
        delay = min(self.retry_backoff * 2 ** (failures - 1), MAX_RETRY_DELAY)
        if self.retry_jitter:
            delay = random.uniform(delay / 2, delay)
        return delay

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task inline, in this process, as a plain function call."""
        return self.call(*args, **kwargs)

    def job(self, *args: Any, **kwargs: Any) -> Job:
        """This task with these arguments, not queued yet: a member of a ``group()``,
        a step of a ``chain()`` (or ``.then()``), or a ``broadcast()``."""
        from .workflows import Job

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
    ) -> RedisTask:
        """Create a new task with modified defaults; ``delay`` sets ``run_after``;
        ``depends_on`` (a result or a job id) holds its jobs until that job succeeded
        (if it fails, they fail with ``DependencyFailed``)."""
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
        if depends_on is not None:
            job_id = depends_on if isinstance(depends_on, str) else depends_on.id
            task = replace(task, depends_on=job_id)
        return task


# TaskResult is a frozen dataclass at run time; django-stubs do not say so.
@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTaskResult(TaskResult):  # type: ignore[misc]
    # The job's JSON envelope, made once when it is prepared (not kept once stored).
    _payload: str = field(init=False, default="", repr=False, compare=False)

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


class _WaitsAndCancels(Protocol):
    def wait(self, result_id: str, timeout: float | None = None) -> None: ...

    def cancel(self, result_id: str) -> None: ...


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
        )

    if function is not None:
        return wrapper(function)
    return wrapper
