"""The worker loop: claim a job, run it, finish it and claim the next in one call.

A worker process runs one job at a time; ``pool.py`` forks several for
``--concurrency``. Idle, it blocks on the wake-up lists of its queues (BLPOP), so it
sends Redis about one command per second and starts a new job as soon as it lands.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType

from django.db import close_old_connections

from .backend import RedisQueueBackend
from .base import RedisTask, RedisTaskResult
from .broker import (
    CONNECTION_ERRORS,
    FAILED,
    RELEASE,
    RETRY,
    SUCCESSFUL,
    Claimed,
    Outcome,
    Reconnector,
    WorkerSession,
    now_ms,
)
from .compat import TaskContext, TaskError, TaskResultStatus, task_finished, task_started
from .exceptions import InvalidPayload, JobTimeout, UnknownTask, WorkerShutdown
from .jobs import Envelope, error_info, from_seconds, to_json
from .registry import registry

logger = logging.getLogger(__name__)

# A job that has run, with its outcome, and its result for the task_finished signal.
Finished = tuple[Outcome, RedisTaskResult | None]

# Seconds an idle worker blocks on its wake-up lists per call.
WAIT_TIMEOUT = 1.0
# Wake-ups are hints; an idle worker claims anyway after this many quiet waits.
IDLE_WAITS_BEFORE_CLAIM = 5
# A worker claims several short jobs at once, up to this many and this much expected
# work: a job claimed ahead, or a newly arrived job of a higher queue, waits that long
# at most behind them.
MAX_CLAIM_AHEAD = 20
CLAIM_AHEAD_SECONDS = 0.02
# Longest time between two heartbeats (s).
HEARTBEAT_INTERVAL = 10.0
# Tries to store the last outcome when stopping while Redis is unreachable.
FINISH_ATTEMPTS_ON_EXIT = 5


@contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise JobTimeout inside the block once it has run ``seconds`` (SIGALRM).

    Only in the main thread, where the worker runs its jobs. A task blocked inside C
    code that does not return to Python is stopped only when it does.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise JobTimeout(f"{what} ran past its timeout of {seconds} s and was stopped")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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

    def next(self, size: int = 1) -> tuple[list[str], int]:
        """The queue order for the next claim, and how many jobs it may take: with
        weights, only as many as the first queue would win in a row, so that a claim of
        several jobs keeps the proportions."""
        if not self.weights or size == 0:
            return self.queues, size
        first = self._pick()
        count = 1
        while count < size and self._winner() == first:
            self._pick()
            count += 1
        return [first, *(q for q in self.queues if q != first)], count

    def _winner(self) -> str:
        return max(self.queues, key=lambda q: self._current[q] + self.weights.get(q, 1))

    def _pick(self) -> str:
        total = 0
        for queue in self.queues:
            weight = self.weights.get(queue, 1)
            self._current[queue] += weight
            total += weight
        first = max(self.queues, key=self._current.__getitem__)
        self._current[first] -= total
        return first


class Heartbeat(threading.Thread):
    """Keeps the worker's record alive for the dashboard, and extends the lease of the
    running job, every few seconds (at most a third of the lease)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="redisqueue-heartbeat", daemon=True)
        self.worker = worker
        self.interval = min(worker.backend.config.lease / 3, HEARTBEAT_INTERVAL)
        self.owned: dict[str, str] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                lost = self.worker.register(dict(self.owned))
            except CONNECTION_ERRORS as exc:
                logger.warning("Could not send the heartbeat (%s); will retry", exc)
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
        self.started_at = now_ms()
        self.jobs_done = 0
        self.stopping = False
        self.in_task = False
        self.job_seconds: float | None = None  # moving average of job run times

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
        reconnect = Reconnector(logger, f"Worker {self.worker_id}")
        session = self.broker.session()
        ahead: deque[Claimed] = deque()  # claimed, not started yet
        try:
            self.register()
        except CONNECTION_ERRORS as exc:
            reconnect.failed(exc)  # the heartbeat registers it once Redis answers
        try:
            while not self._should_stop():
                if not ahead:
                    try:
                        ahead.extend(self._claim(session))
                        reconnect.succeeded()
                        if not ahead:
                            if self.burst:
                                break
                            self._wait_for_work(session)
                            continue
                    except CONNECTION_ERRORS as exc:
                        reconnect.failed(exc)  # outcomes not yet stored go with the next claim
                        continue
                outcome, result = self.execute(ahead.popleft())
                self.jobs_done += 1
                starting = ahead[0] if ahead and not self._should_stop() else None
                session.finish_soon(outcome, result, starting)
        finally:
            heartbeat.stopped.set()
            # Jobs claimed ahead and never started go back to their queue, uncounted.
            for job in ahead:
                session.finish_soon(Outcome(job.job_id, job.owner, RELEASE))
            self._settle(session, reconnect)
            with contextlib.suppress(*CONNECTION_ERRORS):
                self.broker.unregister_worker(self.worker_id)
        logger.info("Worker %s stopped after %d job(s)", self.worker_id, self.jobs_done)

    def register(self, owned: Mapping[str, str] | None = None) -> list[str]:
        """Tell the dashboard this worker is alive and what it serves, and extend the
        leases of the jobs it ``owned``; return the ids it no longer owns."""
        info = {
            "queues": ",".join(self.queues),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": self.started_at,
            "jobs_done": self.jobs_done,
        }
        return self.broker.heartbeat(self.worker_id, info, owned or {})

    def _settle(self, session: WorkerSession, reconnect: Reconnector) -> None:
        """Make sure every outcome sent is stored before the worker goes."""
        for _ in range(FINISH_ATTEMPTS_ON_EXIT):
            try:
                self._claim(session, count=0)
                return
            except CONNECTION_ERRORS as exc:
                reconnect.failed(exc)
        logger.error(
            "Could not store the outcome of job(s) %s; they run again once their lease runs out",
            ", ".join(outcome.job_id for outcome, _ in session.unsent),
        )

    def _should_stop(self) -> bool:
        return self.stopping or (self.max_jobs is not None and self.jobs_done >= self.max_jobs)

    def _claim_size(self) -> int:
        """How many jobs to claim at once: more when jobs are short, so that one round
        trip serves several, but never more than CLAIM_AHEAD_SECONDS of expected work,
        which bounds how long a job held ahead waits, and how long a newly arrived job
        of a higher queue waits behind them."""
        size = MAX_CLAIM_AHEAD
        if self.max_jobs is not None:
            size = min(size, self.max_jobs - self.jobs_done)
        if self.job_seconds is None:
            return 1
        return max(1, min(size, int(CLAIM_AHEAD_SECONDS / max(self.job_seconds, 1e-6))))

    def _claim(self, session: WorkerSession, count: int | None = None) -> list[Claimed]:
        """Settle the outcomes sent so far and claim the next jobs, in one round trip."""
        queues, size = self.order.next(self._claim_size() if count is None else count)
        settled, claimed = session.claim(queues, self.worker_id, size)
        for outcome, result, stored in settled:
            self._report(outcome, result, stored)
        if count is None:
            self.heartbeat.owned = {job.job_id: job.owner for job in claimed}
        return claimed

    def _wait_for_work(self, session: WorkerSession) -> None:
        for _ in range(IDLE_WAITS_BEFORE_CLAIM):
            if self.stopping or session.wait_for_work(self.queues, WAIT_TIMEOUT):
                return

    def _report(self, outcome: Outcome, result: RedisTaskResult | None, stored: bool) -> None:
        if not stored:
            logger.warning(
                "Job %s: its lease ran out before it finished (or its outcome was stored "
                "before the connection dropped); this outcome (%s) is not stored again",
                outcome.job_id,
                outcome.status,
            )
        elif result is not None and outcome.status not in (RETRY, RELEASE):
            task_finished.send_robust(type(self.backend), task_result=result)

    def execute(self, claimed: Claimed) -> Finished:
        """Run one claimed job; never raises for anything the job does."""
        started = time.perf_counter()
        try:
            return self._execute(claimed, started)
        finally:
            elapsed = time.perf_counter() - started
            last = self.job_seconds
            self.job_seconds = elapsed if last is None else 0.8 * last + 0.2 * elapsed

    def _execute(self, claimed: Claimed, started: float) -> Finished:
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
        self.in_task = True
        try:
            args = envelope.args
            if task.takes_context:
                args = [TaskContext(task_result=result), *args]
            with time_limit(getattr(task, "timeout", None), envelope.task_path):
                value = task.call(*args, **envelope.kwargs)
            encoded = to_json(value)
            outcome = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result=encoded)
        except WorkerShutdown:
            outcome = Outcome(claimed.job_id, claimed.owner, RELEASE)
        # A task that calls sys.exit() fails; it does not stop the worker.
        except (Exception, SystemExit) as exc:
            info = error_info(exc)
            result.errors.append(TaskError(**info))
            outcome = self._failure(task, claimed, exc, to_json(info))
        else:
            # As get_result() will return it: the value after a JSON round trip.
            object.__setattr__(result, "_return_value", json.loads(encoded))
        finally:
            self.in_task = False
            close_old_connections()
        retrying = outcome.status in (RETRY, RELEASE)
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
            f", again in {(outcome.retry_at - now_ms()) / 1000:.1f} s"
            if outcome.status == RETRY
            else "",
        )
        return outcome, result

    def _failure(self, task: object, claimed: Claimed, exc: BaseException, error: str) -> Outcome:
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

    def install_signal_handlers(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """Stop gracefully on the first of ``signals``; on the second, give the running
        job back to its queue and stop at once."""
        for signum in signals:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            if self.in_task:
                logger.warning(
                    "Worker %s: %s again, giving the running job back to its queue",
                    self.worker_id,
                    name,
                )
                raise WorkerShutdown
            return
        # Stop first: a second signal may arrive while this one is being logged.
        self.stop()
        logger.info(
            "Worker %s: %s received, finishing the job in hand and stopping "
            "(send it again to give the job back and stop now)",
            self.worker_id,
            name,
        )
