"""Broadcast messages on a worker: received in turn (``Inbox``), each run once, on
this worker (``run_broadcast``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from django_redisqueue.core.conf import Options
from django_redisqueue.core.jobs import FAILED, SUCCESSFUL, Envelope
from django_redisqueue.core.registry import registry
from django_redisqueue.exceptions import InvalidPayload, UnknownTask, WorkerShutdown
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.alarms import time_limit
from django_redisqueue.runtime.stopping import StopToken, call_task
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.gateway import REDIS_ERRORS, Reconnector

logger = logging.getLogger(WORKER_LOGGER)

# Tries to receive broadcasts before the worker gives up on them and runs jobs again.
RECEIVE_ATTEMPTS = 5


def run_broadcast(
    number: int,
    payload: str,
    config: Options,
    in_task: Callable[[], AbstractContextManager[StopToken]],
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
        with (
            in_task() as token,
            time_limit(getattr(task, "timeout", None), envelope.task_path, token),
        ):
            call_task(task, envelope.args, envelope.kwargs, token)
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


class Inbox:
    """A worker's broadcast messages: the number of the last it received, and the
    outcomes of those it ran that no call has stored yet."""

    def __init__(
        self,
        worker_id: str,
        broker: Broker,
        config: Options,
        in_task: Callable[[], AbstractContextManager[StopToken]],
    ) -> None:
        self.worker_id, self.broker, self.config, self.in_task = worker_id, broker, config, in_task
        self.seen = 0  # the last broadcast message this worker received
        self.unreported: list[tuple[int, str]] = []  # run, outcomes not stored
        self.failures = 0

    @property
    def waiting(self) -> bool:
        """A message was sent since the last one received (as the last claim read)."""
        return self.broker.last_broadcast != self.seen

    def receive(self, queues: Sequence[str], backoff: Reconnector) -> None:
        """Run the messages this worker has not read, and record how each ended. A
        message is taken once: one whose worker dies while running it is not run again
        (a new worker starts with fresh local state anyway)."""
        latest = self.broker.last_broadcast
        try:
            while True:
                # The outcomes in hand are kept until a call stores them (a repeat after
                # a lost reply writes the same again).
                received = self.broker.receive(self.worker_id, queues, self.unreported)
                self.unreported = []
                for number, body in received.messages:
                    outcome = run_broadcast(number, body, self.config, self.in_task)
                    self.unreported.append((number, outcome))
                # Those read may all have been for other queues: read on while any remain.
                if not received.messages and not received.more:
                    break
        except REDIS_ERRORS as exc:
            self.failures += 1
            if self.failures < RECEIVE_ATTEMPTS:
                backoff.failed(exc)
                return
            # Jobs must not wait behind a broadcast Redis keeps refusing to hand over.
            logger.error(
                "Worker %s: broadcasts not received after %d tries (%s); back to jobs",
                self.worker_id,
                self.failures,
                exc,
            )
        self.failures = 0
        self.seen = latest
