"""``ImmediateBackend``: runs each job at once, in the process that enqueues it.

For tests, in place of RedisQueueBackend (no Redis, no worker), whatever ``DEBUG`` is.
It is Django's ImmediateBackend plus what this app's API needs: results are
``RedisTaskResult`` (``wait()`` returns at once), ``get_result()`` finds them, jobs are
checked as the Redis backend checks them (``JobPreparation``: JSON arguments, the size
limit), ``run_after`` and ``delay`` are accepted (the job still runs at once) and
``enqueue_on_commit`` waits for the commit. Retries and time limits are not applied:
each job runs once. Groups, chains, ``depends_on`` and broadcasts run at once too: a
group's callback after its members, with their values; a chain stops at the first
failure (the rest end FAILED with ``DependencyFailed``); a broadcast runs once, here.
Unique keys and limits are accepted and checked, and have nothing to do: every job has
ended before the next is enqueued.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from django_redisqueue.backends.base import JobPreparation, new_job_id
from django_redisqueue.compat import ImmediateBackend as DjangoImmediateBackend
from django_redisqueue.compat import TaskError, TaskResultDoesNotExist, TaskResultStatus
from django_redisqueue.core.fanout import GroupResult, GroupState
from django_redisqueue.core.jobs import error_info
from django_redisqueue.core.tasks import Job, RedisTask, RedisTaskResult
from django_redisqueue.exceptions import DependencyFailed, NotCancellable


class ImmediateBackend(JobPreparation, DjangoImmediateBackend):
    task_class = RedisTask
    supports_defer = True  # accepted, and ignored: the job runs now
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.params = params
        # Every result of this backend instance, for get_result(): fine for a test run.
        self.results: dict[str, RedisTaskResult] = {}
        self.groups: dict[str, tuple[list[str], str | None]] = {}
        self.broadcasts = itertools.count(1)

    def push(self, results: Sequence[RedisTaskResult]) -> None:
        """Run prepared jobs now, one after the other, sending the task signals; each
        result records its outcome. A job whose ``depends_on`` did not succeed fails
        with DependencyFailed instead of running."""
        for result in results:
            after = getattr(result.task, "depends_on", None)
            if after is not None and after not in self.results:
                raise TaskResultDoesNotExist(f"Job {after}, which the job would run after.")
            self.results[result.id] = result
            before = self.results.get(after) if after else None
            if before is not None and before.status != TaskResultStatus.SUCCESSFUL:
                _fail_unrun(result, DependencyFailed(f"job {after} ended {before.status}"))
                continue
            self._execute_task(result)  # type: ignore[attr-defined]  # Django's, and the backport's

    def enqueue_group(self, members: Sequence[Job], callback: Job | None) -> GroupResult:
        """Run the members, then the callback with their values first."""
        results = [self.prepare(job.task, job.args, job.kwargs) for job in members]
        last = self.prepare(callback.task, callback.args, callback.kwargs) if callback else None
        self.push(results)
        group_id = new_job_id()
        self.groups[group_id] = ([result.id for result in results], last.id if last else None)
        if last is not None:
            object.__setattr__(last, "args", [self.group_results(group_id), *last.args])
            self.push([last])
        return GroupResult(group_id, self.alias, *self.groups[group_id])

    def enqueue_chain(self, jobs: Sequence[Job]) -> list[RedisTaskResult]:
        """Run the jobs in order; after a failure, the rest fail unrun."""
        results = [self.prepare(job.task, job.args, job.kwargs) for job in jobs]
        self.push(results[:1])
        for before, result in itertools.pairwise(results):
            self.results[result.id] = result
            if before.status == TaskResultStatus.SUCCESSFUL:
                self._execute_task(result)  # type: ignore[attr-defined]
            else:
                _fail_unrun(result, DependencyFailed(f"job {before.id} ended {before.status}"))
        return results

    def send_broadcast(self, job: Job, queue: str = "") -> int:
        """Run the job once, here: this process is the only worker."""
        self.prepare(job.task, job.args, job.kwargs)
        job.task.call(*job.args, **job.kwargs)
        return next(self.broadcasts)

    def group_state(self, group_id: str) -> GroupState:
        try:
            members, callback = self.groups[group_id]
        except KeyError:
            raise TaskResultDoesNotExist(group_id) from None
        failed = sum(self.results[m].status == TaskResultStatus.FAILED for m in members)
        return GroupState(
            group_id, len(members), len(members), len(members), failed, callback or "", 0, 0, False
        )

    def group_results(self, group_id: str) -> list[Any]:
        self.group_state(group_id)  # raises for an unknown group
        results = [self.results[member] for member in self.groups[group_id][0]]
        return [
            r.return_value if r.status == TaskResultStatus.SUCCESSFUL else None for r in results
        ]

    def get_group(self, group_id: str) -> GroupResult:
        state = self.group_state(group_id)
        return GroupResult(group_id, self.alias, *self.groups[group_id], state=state)

    def wait_group(self, group_id: str, timeout: float | None = None) -> None:
        """Return at once: a group's members ran when it was enqueued."""
        self.group_state(group_id)

    def cancel_group(self, group_id: str) -> int:
        """Cancel nothing: every member has already run."""
        self.group_state(group_id)
        return 0

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

    def stop(self, result_id: str) -> bool:
        """Return False: every job has already ended."""
        self.get_result(result_id)
        return False


def _fail_unrun(result: RedisTaskResult, error: BaseException) -> None:
    """Record a job as FAILED without running it."""
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    result.errors.append(TaskError(**error_info(error)))
