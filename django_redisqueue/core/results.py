"""What a stored job reads as: the Task its envelope names, and its TaskResult. Shared
by the backends (``get_result``) and the worker, which builds the result it runs."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from django_redisqueue.compat import InvalidTask, Task, TaskError, TaskResultStatus
from django_redisqueue.core.jobs import Envelope, JobRecord, from_seconds
from django_redisqueue.core.registry import registry
from django_redisqueue.core.tasks import RedisTask, RedisTaskResult
from django_redisqueue.exceptions import UnknownTask


def unregistered_task(*args: Any, **kwargs: Any) -> None:
    """Stands in for the task of a job whose task is unknown or unreadable."""
    raise UnknownTask("this job's task is not registered")


def task_for(envelope: Envelope | None, backend: str, default_queue: str) -> Task:
    """The registered Task an envelope names, with the envelope's queue and priority;
    for an unknown or unreadable task, ``unregistered_task`` on ``default_queue``."""
    if envelope is None or registry.get(envelope.task_path) is None:
        return _unregistered(backend, default_queue)
    return _task_variant(
        envelope.task_path, envelope.queue_name, envelope.priority, backend, envelope.run_after
    )


def make_result(alias: str, task: Task, record: JobRecord) -> RedisTaskResult:
    """The TaskResult of a job as its record stands: the one place results are built."""
    envelope = record.envelope
    result = RedisTaskResult(
        task=task,
        id=record.id,
        status=TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=envelope.args if envelope else [],
        kwargs=envelope.kwargs if envelope else {},
        backend=alias,
        errors=[TaskError(**error) for error in record.errors],
        worker_ids=record.worker_ids,
    )
    has_value, value = record.return_value
    if result.status == TaskResultStatus.SUCCESSFUL and has_value:
        object.__setattr__(result, "_return_value", value)
    return result


@lru_cache(maxsize=64)
def _unregistered(backend: str, queue_name: str) -> Task:
    return RedisTask(
        func=unregistered_task,
        priority=0,
        queue_name=queue_name,
        backend=backend,
        run_after=None,
    )


@lru_cache(maxsize=1024)
def _task_variant(
    path: str, queue_name: str, priority: int, backend: str, run_after: float | None
) -> Task:
    task = registry.get(path)
    assert task is not None
    wanted = (queue_name, priority, backend, from_seconds(run_after))
    if (task.queue_name, task.priority, task.backend, task.run_after) == wanted:
        return task
    try:
        return dataclasses.replace(
            task,
            queue_name=queue_name,
            priority=priority,
            backend=backend,
            run_after=from_seconds(run_after),
        )
    except (InvalidTask, ValueError):
        # The settings changed since the job was queued; the registered task still runs.
        return task
