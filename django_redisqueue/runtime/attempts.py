"""One attempt at a claimed job: read its payload, call its task with the hooks every
attempt has around it, and make the outcome to store.

What is not the task's own work (the log lines, the signals, the database connections,
the time limit, the metrics) is a ``Hook``: an attempt runs the same way whoever runs
it, and a new concern is a hook, not a new branch in the worker.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django_redisqueue.compat import TaskError, TaskResultStatus, task_finished
from django_redisqueue.compat import task_started as task_started_signal
from django_redisqueue.core.jobs import (
    FAILED,
    SUCCESSFUL,
    Envelope,
    JobRecord,
    ensure_json,
    error_info,
    to_json,
)
from django_redisqueue.core.progress import JobProgress
from django_redisqueue.core.registry import registry
from django_redisqueue.core.tasks import JobContext, RedisTask, RedisTaskResult
from django_redisqueue.exceptions import InvalidPayload, JobStopped, LeaseLost, WorkerShutdown
from django_redisqueue.observe.events import JobEvent
from django_redisqueue.observe.logformat import job_fields, log_end, start_fields
from django_redisqueue.observe.metrics import JobMetrics
from django_redisqueue.runtime.alarms import time_limit
from django_redisqueue.runtime.stopping import StopToken
from django_redisqueue.store.wire import RELEASE, RETRY, Claimed, Outcome

Context = contextlib.AbstractContextManager[None]
# How a task is called: (task, args, kwargs, its stop token) -> its return value
# (``EventLoop.call``).
Call = Callable[[Any, Sequence[Any], dict[str, Any], StopToken], Any]


@dataclass(frozen=True, slots=True)
class Finished:
    """A job that has run: its outcome to store, its result for the task_finished
    signal (None when the job never reached its task), what the task raised, and the
    event to log and count once the outcome is stored."""

    outcome: Outcome
    result: RedisTaskResult | None = None
    error: BaseException | None = None
    event: JobEvent | None = None


@dataclass(slots=True)
class Attempt:
    """An attempt whose task is about to run, as the hooks see it; ``outcome``,
    ``raised`` and ``event`` once it ended."""

    claimed: Claimed
    record: JobRecord  # as claimed: its attempts so far decide a retry
    envelope: Envelope
    task: Any  # the registered Task
    result: RedisTaskResult
    token: StopToken  # how it is stopped while it runs
    began: float = field(default_factory=time.perf_counter)
    report: Callable[[JobProgress], None] = field(default=lambda progress: None)  # its progress
    outcome: Outcome | None = None
    raised: BaseException | None = None
    event: JobEvent | None = None


class Hook:
    """Something every attempt has around its task; each method does nothing unless a
    hook overrides it. ``started`` and ``around`` run in the order of the hooks (the
    first one's context is the outermost), ``ended`` and ``stored`` in reverse."""

    def started(self, attempt: Attempt) -> None:
        """The task is about to be called."""

    def around(self, attempt: Attempt) -> Context | None:
        """A context around the task's call (what the task raises passes through it),
        or None for none: a job without a timeout enters no time limit."""
        return None

    def ended(self, attempt: Attempt) -> None:
        """The attempt ended: ``attempt.outcome`` (and ``raised``, ``event``) are set."""

    def stored(self, finished: Finished, stored: bool) -> None:
        """Redis stored the outcome (``stored``), or refused it (the lease ran out);
        also for a job that never reached its task (``finished.result`` is None)."""


class LogLines(Hook):
    """A line when a task starts and when it ends (``log_end``); ``note(status)``: what
    the end line adds (that no scheduler runs to start a retry)."""

    def __init__(self, logger: logging.Logger, note: Callable[[str], str]) -> None:
        self.logger, self.note = logger, note

    def started(self, attempt: Attempt) -> None:
        # Its fields are made only for a log that shows it: a busy worker logs
        # thousands of jobs a second, or none.
        if self.logger.isEnabledFor(logging.INFO):
            claimed = attempt.claimed
            begun = JobEvent.of(claimed, attempt.envelope, TaskResultStatus.RUNNING, 0.0)
            self.logger.info(
                "Job %s %s started (attempt %d)",
                claimed.job_id,
                attempt.envelope.task_path,
                begun.attempt,
                extra=start_fields(begun),
            )

    def ended(self, attempt: Attempt) -> None:
        assert attempt.event is not None and attempt.outcome is not None
        status, retry_in = attempt.outcome.status, attempt.outcome.retry_in_ms
        log_end(self.logger, attempt.event, attempt.raised, retry_in, note=self.note(status))


class Signals(Hook):
    """task_started before the call; task_finished once the final outcome is stored
    (not for a retry or a job given back), while the task's exception, if any, is the
    one being handled: receivers log a failure with logger.exception (Django's do)."""

    def __init__(self, sender: type) -> None:
        self.sender = sender

    def started(self, attempt: Attempt) -> None:
        task_started_signal.send_robust(self.sender, task_result=attempt.result)

    def stored(self, finished: Finished, stored: bool) -> None:
        if not stored or finished.result is None or finished.outcome.status in (RETRY, RELEASE):
            return
        if finished.error is None or not task_finished.has_listeners(self.sender):
            task_finished.send_robust(self.sender, task_result=finished.result)
            return
        try:
            raise finished.error
        except BaseException:
            task_finished.send_robust(self.sender, task_result=finished.result)


class TimeLimit(Hook):
    """A task that runs past its ``timeout`` stopped through its token (JobTimeout)."""

    def around(self, attempt: Attempt) -> Context | None:
        timeout = getattr(attempt.task, "timeout", None)
        return time_limit(timeout, attempt.envelope.task_path, attempt.token) if timeout else None


class Around(Hook):
    """A context of the worker's around each call (its database connections, the stop
    token running)."""

    def __init__(self, context: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        self.context = context

    def around(self, attempt: Attempt) -> contextlib.AbstractContextManager[Any]:
        return self.context()


class Metrics(Hook):
    """Each stored outcome counted (observe/metrics.py)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics

    def stored(self, finished: Finished, stored: bool) -> None:
        if stored and finished.event is not None:
            self.metrics.record(finished.event, registry.get(finished.event.task) is not None)


def unreadable(
    claimed: Claimed, envelope: Envelope | None, exc: InvalidPayload, logger: logging.Logger
) -> Finished:
    """A job whose payload cannot be read, or whose task no worker knows: FAILED,
    logged, never started."""
    event = JobEvent.of(claimed, envelope, FAILED, 0.0)
    logger.error("Job %s FAILED: %s", claimed.job_id, exc, extra=job_fields(event))
    error = to_json(error_info(exc))
    return Finished(Outcome(claimed.job_id, claimed.owner, FAILED, error=error), event=event)


def given_up(attempt: Attempt, hooks: Sequence[Hook]) -> Finished | None:
    """How an attempt whose thread did not let go of its stop (stuck in a C call) ends,
    as if its task had raised the stop's reason: FAILED or RETRY by the task's retry
    policy (a time limit's), RELEASE (a second SIGTERM's: it runs again, uncounted), or
    None (a lost lease: the job is another's). Made on a copy of the attempt, which its
    thread may still end."""
    reason = attempt.token.reason
    if reason is None or isinstance(reason, LeaseLost):
        return None
    ended = copy.copy(attempt)
    ended.result = copy.copy(attempt.result)
    object.__setattr__(ended.result, "errors", list(attempt.result.errors))
    if isinstance(reason, WorkerShutdown):
        return _end(ended, Outcome(attempt.claimed.job_id, attempt.claimed.owner, RELEASE), hooks)
    return _end(ended, _failed(ended, reason), hooks)


def run(
    attempt: Attempt,
    args: Sequence[Any],
    hooks: Sequence[Hook],
    max_bytes: int,
    call: Call,
) -> Finished:
    """Call the attempt's task with ``args`` (and its envelope's kwargs) inside the
    hooks, by ``call``, and make the outcome: SUCCESSFUL with its return value (JSON, at most
    ``max_bytes``), RETRY or FAILED as its retry policy says, RELEASE when the worker
    was told to stop a second time."""
    claimed, envelope, result = attempt.claimed, attempt.envelope, attempt.result
    for hook in hooks:
        hook.started(attempt)
    try:
        if attempt.task.takes_context:
            args = [JobContext(task_result=result, _report=attempt.report), *args]
        with contextlib.ExitStack() as contexts:
            for hook in hooks:
                context = hook.around(attempt)
                if context is not None:
                    contexts.enter_context(context)
            value = call(attempt.task, args, envelope.kwargs, attempt.token)
        encoded = _encoded(value, envelope.task_path, max_bytes)
        outcome = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result=encoded)
        # As get_result() will return it: the value after a JSON round trip.
        object.__setattr__(result, "_return_value", json.loads(encoded))
    except WorkerShutdown:
        outcome = Outcome(claimed.job_id, claimed.owner, RELEASE)
    # A task that calls sys.exit() fails; it does not stop the worker. Nor does one that
    # raises KeyboardInterrupt: Ctrl-C reaches the worker's handler, not a task.
    except (Exception, SystemExit, KeyboardInterrupt, JobStopped) as exc:
        outcome = _failed(attempt, exc)
    return _end(attempt, outcome, hooks)


def _failed(attempt: Attempt, exc: BaseException) -> Outcome:
    """The outcome of an attempt whose task raised ``exc``: FAILED, or RETRY later if
    the task's retry policy says so; the error kept on its result."""
    reason = attempt.token.reason  # raised by its class in another thread: the message
    raised: BaseException = exc
    if reason is not None and reason is not exc and isinstance(exc, type(reason)):
        raised = reason.with_traceback(exc.__traceback__)
    attempt.raised = raised
    info = error_info(raised)
    attempt.result.errors.append(TaskError(**info))
    claimed, error = attempt.claimed, to_json(info)
    failures = attempt.record.attempts - attempt.record.lost  # attempts that raised
    task = attempt.task
    # A job asked to stop is never retried (Redis ends it FAILED in any case).
    retries = isinstance(task, RedisTask) and not isinstance(raised, JobStopped)
    delay = task.retry_delay(raised, failures) if retries else None
    if delay is None:
        return Outcome(claimed.job_id, claimed.owner, FAILED, error=error)
    return Outcome(
        claimed.job_id, claimed.owner, RETRY, error=error, retry_in_ms=int(delay * 1000)
    )


def _end(attempt: Attempt, outcome: Outcome, hooks: Sequence[Hook]) -> Finished:
    """The attempt ended with ``outcome``: its result's status, its event, the hooks
    told (in reverse)."""
    retrying = outcome.status in (RETRY, RELEASE)
    result = attempt.result
    object.__setattr__(result, "status", TaskResultStatus.READY if retrying else outcome.status)
    if not retrying:
        object.__setattr__(result, "finished_at", datetime.now(tz=UTC))
    attempt.outcome = outcome
    attempt.event = JobEvent.of(
        attempt.claimed, attempt.envelope, outcome.status, time.perf_counter() - attempt.began
    )
    for hook in reversed(hooks):
        hook.ended(attempt)
    return Finished(outcome, result, attempt.raised, attempt.event)


def _encoded(value: Any, task_path: str, max_bytes: int) -> str:
    """A task's return value as JSON, within the payload limit (else InvalidPayload)."""
    ensure_json(value, f"The return value of {task_path}()")
    encoded = to_json(value)
    if len(encoded.encode()) > max_bytes:
        raise InvalidPayload(
            f"the return value is {len(encoded.encode())} bytes of JSON, over "
            f"the {max_bytes}-byte MAX_PAYLOAD_BYTES limit"
        )
    return encoded
