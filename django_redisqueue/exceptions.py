"""Errors raised by django_redisqueue; all derive from :class:`RedisQueueError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django_redisqueue.compat import TaskResult


class RedisQueueError(Exception):
    """Base class of every error this app raises."""


class ConfigurationError(RedisQueueError, ImproperlyConfigured):
    """The backend's settings are wrong; the message says how to fix them."""


class InvalidPayload(RedisQueueError):
    """A job taken from Redis cannot be run: bad JSON, envelope or size."""


class UnknownTask(InvalidPayload):
    """A job names a task that is not registered in this worker."""


class TaskFailed(RedisQueueError):
    """Raised by ``wait()`` when the job ended FAILED; ``.result`` holds its errors."""

    def __init__(self, result: TaskResult) -> None:
        self.result = result
        last = result.errors[-1] if result.errors else None
        # The traceback's last line names the error; a stored error may have none.
        lines = last.traceback.strip().splitlines() if last else []
        reason = lines[-1] if lines else (last.exception_class_path if last else "")
        reason = reason or "no error recorded"
        super().__init__(f"Task {result.task.module_path} ({result.id}) failed: {reason}")


class NotCancellable(RedisQueueError):
    """``cancel()`` on a job that is running or finished: only READY jobs can be."""


class JobCancelled(RedisQueueError):
    """Recorded as the error of a job cancelled before it started."""


class DependencyFailed(RedisQueueError):
    """Recorded as the error of a job that never ran because the job it runs after
    (in a chain, or named by ``depends_on``) did not succeed."""


class WorkerLost(RedisQueueError):
    """Recorded as the error of a job whose workers kept dying while running it."""


class BrokerUnavailable(RedisQueueError, ConnectionError):
    """Redis did not answer when enqueueing; the message says where and why."""


class JobTimeout(RedisQueueError):
    """Raised inside a task that runs past its ``timeout``."""


class WorkerShutdown(BaseException):
    """Raised inside a task when the worker is told to stop a second time.

    A BaseException, like KeyboardInterrupt, so that a task's ``except Exception``
    does not swallow it; the worker gives the job back to its queue.
    """


class JobStopped(BaseException):
    """Raised inside a task asked to stop (``result.stop()``, the dashboard's Abort),
    and recorded as the error of the job, which ends FAILED and is never retried. A
    BaseException, so that ``except Exception`` in a task does not swallow it."""


class NotStoppable(RedisQueueError):
    """``stop()`` on a job that has not started: ``cancel()`` it instead."""


class LeaseLost(BaseException):
    """Raised inside a task whose lease was lost (its worker stalled, or Redis failed,
    for longer than the lease): the job was given to another worker, and this run's
    outcome would be refused. A BaseException, so that ``except Exception`` in a task
    does not swallow it."""


class ResultTimeout(RedisQueueError, TimeoutError):
    """Raised by ``wait()`` when the job has not finished within the timeout."""
