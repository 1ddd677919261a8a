"""``ImmediateBackend``: runs each job at once, in the process that enqueues it.

For tests, in place of RedisQueueBackend (no Redis, no worker), whatever ``DEBUG`` is.
It is Django's ImmediateBackend plus what this app's API needs: results are
``RedisTaskResult`` (``wait()`` returns at once), ``get_result()`` finds them, the
arguments are checked as the Redis backend checks them, ``run_after`` and ``delay``
are accepted (the job still runs at once) and ``enqueue_on_commit`` waits for the
commit. Retries and time limits are not applied: each job runs once.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from django.db import transaction

from .base import RedisTask, RedisTaskResult
from .compat import ImmediateBackend as DjangoImmediateBackend
from .compat import Task, TaskResultDoesNotExist, TaskResultStatus
from .exceptions import NotCancellable
from .jobs import ensure_json_arguments


class ImmediateBackend(DjangoImmediateBackend):
    task_class = RedisTask
    supports_defer = True  # accepted, and ignored: the job runs now
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Every result of this backend instance, for get_result(): fine for a test run.
        self.results: dict[str, RedisTaskResult] = {}

    def enqueue(
        self, task: Task, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> RedisTaskResult:
        """Run the job now and return its finished result."""
        result = self.prepare(task, args, kwargs)
        self.run(result)
        return result

    def enqueue_on_commit(
        self,
        task: Task,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        *,
        using: str | None = None,
    ) -> RedisTaskResult:
        """Check the job now and run it once the transaction on ``using`` commits."""
        result = self.prepare(task, args, kwargs)
        transaction.on_commit(functools.partial(self.run, result), using=using)
        return result

    def prepare(
        self, task: Task, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> RedisTaskResult:
        """Validate a job as RedisQueueBackend does and return its READY result."""
        self.validate_task(task)
        ensure_json_arguments(task.module_path, args, kwargs)
        return RedisTaskResult(
            task=task,
            id=uuid.uuid4().hex,
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def run(self, result: RedisTaskResult) -> None:
        """Run a prepared job, sending the task signals; ``result`` records the outcome."""
        self.results[result.id] = result
        self._execute_task(result)

    def get_result(self, result_id: str) -> RedisTaskResult:
        try:
            return self.results[result_id]
        except KeyError:
            raise TaskResultDoesNotExist(result_id) from None

    def wait(self, result_id: str, timeout: float | None = None) -> None:
        """Return at once: a job that exists has finished."""
        self.get_result(result_id)

    def cancel(self, result_id: str) -> None:
        """Raise NotCancellable: every job has already run."""
        status = self.get_result(result_id).status
        raise NotCancellable(f"Job {result_id} is {status}: it ran when it was enqueued.")
