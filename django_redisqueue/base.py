"""The public task API: ``@task``, ``RedisTask`` and ``RedisTaskResult``.

``RedisTask`` is Django's ``Task`` plus ``delay()``, ``using(delay=...)`` and calling
the task directly; the backend's ``task_class`` is ``RedisTask``, so Django's own
``task`` decorator makes the same object when it targets this backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, overload

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

DEFAULT_BACKEND_ALIAS = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTask(Task):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task inline, in this process, as a plain function call."""
        return self.call(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> TaskResult:
        """Queue up the task: an alias of ``enqueue()``."""
        return self.enqueue(*args, **kwargs)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        delay: float | timedelta | None = None,
    ) -> RedisTask:
        """Create a new task with modified defaults; ``delay`` sets ``run_after``."""
        if delay is not None:
            if run_after is not None:
                raise TypeError("Pass either delay or run_after, not both.")
            if not isinstance(delay, timedelta):
                delay = timedelta(seconds=delay)
            run_after = timezone.now() + delay
        return Task.using(
            self,
            priority=priority,
            queue_name=queue_name,
            run_after=run_after,
            backend=backend,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTaskResult(TaskResult):
    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job finishes; return its value or raise ``TaskFailed``.

        Raises ``ResultTimeout`` (a ``TimeoutError``) if it has not finished in
        ``timeout`` seconds (None waits for ever).
        """
        task_backends[self.backend].wait(self.id, timeout)
        self.refresh()
        if self.status == TaskResultStatus.FAILED:
            raise TaskFailed(self)
        return self.return_value


@overload
def task(function: Callable[..., Any], /) -> RedisTask: ...
@overload
def task(
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: bool = ...,
) -> Callable[[Callable[..., Any]], RedisTask]: ...
def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_BACKEND_ALIAS,
    takes_context: bool = False,
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
        )

    if function is not None:
        return wrapper(function)
    return wrapper
