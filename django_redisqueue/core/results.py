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
    """The TaskResult of a job as its record stands: the one place results are built.
    Every enqueue and every attempt builds one, so it is set field by field: the
    dataclass's own pass copies the arguments, which only a container among them needs."""
    envelope = record.envelope
    status = TaskResultStatus(record.status)
    result = _NEW(RedisTaskResult)
    for name, value in _DEFAULTS:
        _SET(result, name, value)
    for name, factory in _FACTORIES:
        _SET(result, name, factory())
    _SET(result, "task", task)
    _SET(result, "id", record.id)
    _SET(result, "status", status)
    _SET(result, "enqueued_at", record.enqueued_at)
    _SET(result, "started_at", record.started_at)
    _SET(result, "finished_at", record.finished_at)
    _SET(result, "last_attempted_at", record.last_attempted_at)
    _SET(result, "args", _plain(envelope.args) if envelope else [])
    _SET(result, "kwargs", _plain(envelope.kwargs) if envelope else {})
    _SET(result, "backend", alias)
    _SET(result, "errors", [TaskError(**error) for error in record.errors])
    _SET(result, "worker_ids", record.worker_ids)
    if "progress" in record.fields:
        _SET(result, "_progress", record.progress)
    has_value, value = record.return_value
    if status == TaskResultStatus.SUCCESSFUL and has_value:
        _SET(result, "_return_value", value)
    return result


def _plain(values: list[Any] | dict[str, Any]) -> Any:
    """The arguments as Django's result keeps them: JSON's (a tuple becomes a list)."""
    items = values.values() if isinstance(values, dict) else values
    return values if all(type(v) in _SCALARS for v in items) else _json_copy(values)


def _json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(item) for item in value]
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})
_NEW = object.__new__
_SET = object.__setattr__
# The fields make_result does not set, with their defaults: the private ones, and any
# a newer Django adds (None where it gives no default).
_OTHERS = [
    field
    for field in dataclasses.fields(RedisTaskResult)
    if field.name not in {"task", "id", "status", "enqueued_at", "started_at", "finished_at",
                          "last_attempted_at", "args", "kwargs", "backend", "errors",
                          "worker_ids"}
]  # fmt: skip
_FACTORIES = tuple(
    (field.name, field.default_factory)
    for field in _OTHERS
    if field.default_factory is not dataclasses.MISSING
)
_DEFAULTS = tuple(
    (field.name, None if field.default is dataclasses.MISSING else field.default)
    for field in _OTHERS
    if field.default_factory is dataclasses.MISSING
)


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
