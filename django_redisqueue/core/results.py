"""What a stored job reads as: the Task its envelope names, and its TaskResult. Shared
by the backends (``get_result``) and the worker, which builds the result it runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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


def ready_result(
    alias: str,
    task: Task,
    job_id: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    payload: str = "",
    options: str = "",
) -> RedisTaskResult:
    """The READY result of a job just prepared, whose arguments are plain JSON
    (``ensure_json_arguments``): what ``make_result`` makes of its empty record, built
    at a third of the cost, as every enqueue builds one. The arguments are copied as
    Django's result copies them (a tuple becomes a list) only where one is not a scalar."""
    result = _NEW(RedisTaskResult)
    for name, value in _READY_VALUES:
        _SET(result, name, value)
    for name, factory in _READY_FACTORIES:
        _SET(result, name, factory())
    _SET(result, "task", task)
    _SET(result, "id", job_id)
    _SET(result, "backend", alias)
    _SET(result, "args", _plain(list(args)))
    _SET(result, "kwargs", _plain(dict(kwargs)))
    _SET(result, "_payload", payload)
    _SET(result, "_options", options)
    return result


def _plain(values: list[Any] | dict[str, Any]) -> Any:
    items = values.values() if isinstance(values, dict) else values
    return values if all(type(v) in _SCALARS for v in items) else _json_copy(values)


def _json_copy(value: Any) -> Any:
    """Plain JSON data as JSON reads it back: lists for tuples, copies of containers."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(item) for item in value]
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})
_NEW = object.__new__
_SET = object.__setattr__


def _ready_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """Every field of a result as a READY job's empty record makes it: values, and
    factories of fresh lists. Fields a newer Django adds get their defaults."""
    values: dict[str, Any] = {}
    factories: dict[str, Any] = {"errors": list, "worker_ids": list}
    for field in dataclasses.fields(RedisTaskResult):
        if field.default_factory is not dataclasses.MISSING:
            factories.setdefault(field.name, field.default_factory)
        elif field.name not in factories:
            values[field.name] = None if field.default is dataclasses.MISSING else field.default
    values["status"] = TaskResultStatus.READY
    return values, factories


_READY_VALUES, _READY_FACTORIES = (tuple(d.items()) for d in _ready_defaults())


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
