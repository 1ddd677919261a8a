"""The worker loop: claim a job, run it, finish it and claim the next in one call.

A worker process runs one job at a time; ``pool.py`` forks several for
``--concurrency``. Idle, it blocks on the wake-up lists of its queues (BLPOP), so it
sends Redis about one command per second and starts a new job as soon as it lands.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import FrameType

from django.db import close_old_connections

from .backend import RedisQueueBackend
from .base import RedisTask, RedisTaskResult
from .broker import FAILED, RETRY, SUCCESSFUL, Claimed, Outcome, now_ms
from .compat import TaskContext, TaskError, TaskResultStatus, task_finished, task_started
from .exceptions import InvalidPayload, UnknownTask
from .jobs import Envelope, error_info, from_seconds, to_json
from .registry import registry

logger = logging.getLogger(__name__)

# Seconds an idle worker blocks on its wake-up lists per call.
WAIT_TIMEOUT = 1.0
# Wake-ups are hints; an idle worker claims anyway after this many quiet waits.
IDLE_WAITS_BEFORE_CLAIM = 5


class QueueOrder:
    """The order in which a worker tries its queues on each claim.

    Strict (no weights): always the configured order, so a busy first queue starves
    the others. Weighted: a smooth weighted round-robin picks the queue tried first
    (``high:5 low:1`` puts ``low`` first once in six claims); the rest follow in the
    configured order, so no job waits for ever while work remains anywhere.
    """

    def __init__(self, queues: Sequence[str], weights: Mapping[str, int] | None = None):
        self.queues = list(queues)
        self.weights = dict(weights or {})
        self._current = dict.fromkeys(self.queues, 0)

    def next(self) -> list[str]:
        if not self.weights:
            return self.queues
        total = 0
        for queue in self.queues:
            weight = self.weights.get(queue, 1)
            self._current[queue] += weight
            total += weight
        first = max(self.queues, key=self._current.__getitem__)
        self._current[first] -= total
        return [first, *(q for q in self.queues if q != first)]


class Heartbeat(threading.Thread):
    """Extends the lease of the running job while it runs longer than a third of it."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="redisqueue-heartbeat", daemon=True)
        self.worker = worker
        self.interval = worker.backend.config.lease / 3
        self.owned: dict[str, str] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            owned = dict(self.owned)
            if not owned:
                continue
            try:
                lost = self.worker.broker.extend_leases(owned)
            except Exception:
                logger.exception("Could not extend the job leases; will retry")
                continue
            for job_id in lost:
                logger.warning("Job %s: lease lost, another worker may run it", job_id)


class Worker:
    def __init__(
        self,
        backend: RedisQueueBackend,
        queues: Sequence[str] | None = None,
        *,
        weights: Mapping[str, int] | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
    ) -> None:
        self.backend = backend
        self.broker = backend.broker
        self.queues = list(queues or backend.queue_names)
        self.order = QueueOrder(self.queues, weights)
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.jobs_done = 0
        self.stopping = False

    def run(self) -> None:
        """Run jobs until stopped (``stop()``), out of work (burst) or max_jobs."""
        heartbeat = Heartbeat(self)
        heartbeat.start()
        self.heartbeat = heartbeat
        logger.info(
            "Worker %s serving %s (backend %r)",
            self.worker_id,
            ", ".join(self.queues),
            self.backend.alias,
        )
        pending: tuple[Outcome, RedisTaskResult | None] | None = None
        try:
            while not self._should_stop():
                claimed = self._finish_and_claim(pending)
                pending = None
                if claimed is None:
                    if self.burst:
                        break
                    self._wait_for_work()
                    continue
                pending = self.execute(claimed)
                self.jobs_done += 1
        finally:
            if pending is not None:
                self._report(pending, self.broker.finish(pending[0]))
            heartbeat.stopped.set()
        logger.info("Worker %s stopped after %d job(s)", self.worker_id, self.jobs_done)

    def _should_stop(self) -> bool:
        return self.stopping or (self.max_jobs is not None and self.jobs_done >= self.max_jobs)

    def _finish_and_claim(
        self, pending: tuple[Outcome, RedisTaskResult | None] | None
    ) -> Claimed | None:
        outcome = pending[0] if pending else None
        finished, claimed = self.broker.claim(self.order.next(), self.worker_id, outcome)
        if pending is not None:
            self._report(pending, bool(finished))
        if claimed is not None:
            self.heartbeat.owned = {claimed.job_id: claimed.owner}
        return claimed

    def _wait_for_work(self) -> None:
        for _ in range(IDLE_WAITS_BEFORE_CLAIM):
            if self.stopping or self.broker.wait_for_work(self.queues, WAIT_TIMEOUT):
                return

    def _report(self, pending: tuple[Outcome, RedisTaskResult | None], stored: bool) -> None:
        outcome, result = pending
        self.heartbeat.owned = {}
        if not stored:
            logger.warning(
                "Job %s: its lease ran out before it finished; this outcome (%s) is "
                "dropped and the job's current owner decides it",
                outcome.job_id,
                outcome.status,
            )
        elif result is not None and outcome.status != RETRY:
            task_finished.send_robust(type(self.backend), task_result=result)

    def execute(self, claimed: Claimed) -> tuple[Outcome, RedisTaskResult | None]:
        """Run one claimed job; never raises for anything the job does."""
        started = time.perf_counter()
        try:
            envelope = Envelope.loads(claimed.payload, self.backend.config.max_payload_bytes)
            if registry.get(envelope.task_path) is None:
                raise UnknownTask(
                    f"task {envelope.task_path!r} is not registered in this worker; "
                    "define it with @task in an installed app's tasks module"
                )
        except InvalidPayload as exc:
            logger.error("Job %s FAILED: %s", claimed.job_id, exc)
            error = to_json(error_info(exc))
            return Outcome(claimed.job_id, claimed.owner, FAILED, error=error), None

        now = datetime.now(tz=UTC)
        task = self.backend.task_for(envelope)
        result = RedisTaskResult(
            task=task,
            id=claimed.job_id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=from_seconds(envelope.enqueued_at),
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=envelope.args,
            kwargs=envelope.kwargs,
            backend=self.backend.alias,
            errors=[],
            worker_ids=claimed.worker_ids,
        )
        task_started.send_robust(type(self.backend), task_result=result)
        close_old_connections()
        try:
            args = envelope.args
            if task.takes_context:
                args = [TaskContext(task_result=result), *args]
            value = task.call(*args, **envelope.kwargs)
            outcome = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result=to_json(value))
        except Exception as exc:
            info = error_info(exc)
            result.errors.append(TaskError(**info))
            outcome = self._failure(task, claimed, exc, to_json(info))
        else:
            object.__setattr__(result, "_return_value", value)
        finally:
            close_old_connections()
        retrying = outcome.status == RETRY
        object.__setattr__(
            result, "status", TaskResultStatus.READY if retrying else outcome.status
        )
        if not retrying:
            object.__setattr__(result, "finished_at", datetime.now(tz=UTC))
        logger.info(
            "Job %s %s %s in %.1f ms%s",
            claimed.job_id,
            envelope.task_path,
            outcome.status,
            (time.perf_counter() - started) * 1000,
            f", again in {(outcome.retry_at - now_ms()) / 1000:.1f} s" if retrying else "",
        )
        return outcome, result

    def _failure(self, task: object, claimed: Claimed, exc: Exception, error: str) -> Outcome:
        """FAILED, or RETRY later if the task's retry policy says so."""
        failures = claimed.attempts - claimed.lost  # attempts that ended in an exception
        delay = task.retry_delay(exc, failures) if isinstance(task, RedisTask) else None
        if delay is None:
            return Outcome(claimed.job_id, claimed.owner, FAILED, error=error)
        retry_at = now_ms() + int(delay * 1000)
        return Outcome(claimed.job_id, claimed.owner, RETRY, error=error, retry_at=retry_at)

    def stop(self) -> None:
        """Finish the job in hand, take no new one, and return from ``run()``."""
        self.stopping = True

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT (Ctrl-C) stop the worker gracefully."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            logger.info(
                "Worker %s: %s received, finishing the job in hand and stopping",
                self.worker_id,
                signal.Signals(signum).name,
            )
        self.stop()
