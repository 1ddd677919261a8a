"""``ImmediateBackend``: runs each job at once, in the process that enqueues it.

For tests, in place of RedisQueueBackend (no Redis, no worker), whatever ``DEBUG`` is.
It is Django's ImmediateBackend plus what this app's API needs: results are
``RedisTaskResult`` (``wait()`` returns at once), ``get_result()`` finds them, jobs are
checked as the Redis backend checks them (``JobPreparation``: JSON arguments, the size
limit), ``run_after`` and ``delay`` are accepted (the job still runs at once) and
``enqueue_on_commit`` waits for the commit. Retries and time limits are not applied:
each job runs once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backend import JobPreparation
from .base import RedisTask, RedisTaskResult
from .compat import ImmediateBackend as DjangoImmediateBackend
from .compat import TaskResultDoesNotExist
from .exceptions import NotCancellable


class ImmediateBackend(JobPreparation, DjangoImmediateBackend):
    task_class = RedisTask
    supports_defer = True  # accepted, and ignored: the job runs now
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.params = params
        # Every result of this backend instance, for get_result(): fine for a test run.
        self.results: dict[str, RedisTaskResult] = {}

    def push(self, results: Sequence[RedisTaskResult]) -> None:
        """Run prepared jobs now, one after the other, sending the task signals; each
        result records its outcome."""
        for result in results:
            self.results[result.id] = result
            self._execute_task(result)  # type: ignore[attr-defined]  # Django's, and the backport's

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
