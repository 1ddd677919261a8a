"""A broadcast message run by a worker: its task, once, on this worker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from django_redisqueue.core.conf import Options
from django_redisqueue.core.jobs import FAILED, SUCCESSFUL, Envelope
from django_redisqueue.core.registry import registry
from django_redisqueue.exceptions import InvalidPayload, UnknownTask, WorkerShutdown
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.alarms import time_limit

logger = logging.getLogger(WORKER_LOGGER)


def run_broadcast(
    number: int,
    payload: str,
    config: Options,
    in_task: Callable[[], AbstractContextManager[None]],
) -> str:
    """Run one broadcast message's task within ``in_task()``; return SUCCESSFUL or
    FAILED. Whatever the task raises is logged, never raised."""
    started = time.perf_counter()
    try:
        envelope = Envelope.loads(payload, config.max_payload_bytes)
        task = registry.get(envelope.task_path)
        if task is None:
            raise UnknownTask(f"task {envelope.task_path!r} is not registered in this worker")
    except InvalidPayload as exc:
        logger.error("Broadcast %d FAILED: %s", number, exc)
        return FAILED
    try:
        with in_task(), time_limit(getattr(task, "timeout", None), envelope.task_path):
            task.call(*envelope.args, **envelope.kwargs)
    except (Exception, SystemExit, KeyboardInterrupt, WorkerShutdown) as exc:
        logger.error(
            "Broadcast %d %s FAILED: %s: %s",
            number,
            envelope.task_path,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        return FAILED
    logger.info(
        "Broadcast %d %s SUCCESSFUL in %.1f ms",
        number,
        envelope.task_path,
        (time.perf_counter() - started) * 1000,
    )
    return SUCCESSFUL
