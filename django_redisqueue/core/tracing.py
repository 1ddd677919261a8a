"""OpenTelemetry traces of jobs (docs/howto/tracing.md).

An enqueue's producer span puts its trace context in each job's envelope; each attempt's
consumer span continues it, linked to the attempt before it. Without opentelemetry-api
(the ``[otel]`` extra) every call here is a no-op. Where an attempt was traced is kept
in the job's hash as a *trace record* (docs/protocol.md, "Traces").
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from importlib import metadata
from types import TracebackType
from typing import Any

from django_redisqueue.core.jobs import JobRecord, first_wait, from_json

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the [otel] extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

ON = trace is not None
logger = logging.getLogger(__name__)

SYSTEM = "django_redisqueue"
# Span attributes: OpenTelemetry's messaging conventions, then this app's own.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"
TASK = "redisqueue.task"
REDISQUEUE_OPERATION = "redisqueue.operation"  # enqueue, enqueue_group, ...
AT_COMMIT = "redisqueue.at_commit"  # sent when the transaction commits
ATTEMPT = "redisqueue.job.attempt"
RECOVERIES = "redisqueue.job.recoveries"
OUTCOME = "redisqueue.job.outcome"
WAIT_MS = "redisqueue.job.wait_ms"
# How an attempt the next one links to ended when its record says RUNNING: it was lost.
LOST = "LOST"
# Most links a group's callback makes to its members (the SDK keeps 128 by default,
# one of them for the callback's attempt before).
MAX_MEMBER_LINKS = 127

# A trace record: the attempt's number, how it ended, its span as a W3C traceparent.
_RECORD = re.compile(r"([0-9]{1,9}) ([A-Z]{1,16}) 00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_tracer: Any = None
# W3C Trace Context only (traceparent, tracestate): a job carries its trace, not the
# baggage a request brought in (which anyone calling the site can fill).
_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None


def tracer() -> Any:
    """This app's tracer (the API's proxy until an SDK is set up, then the SDK's)."""
    global _tracer
    if _tracer is None:
        try:
            version = metadata.version("django-redisqueue")
        except metadata.PackageNotFoundError:  # run from a source tree
            version = ""
        _tracer = trace.get_tracer("django_redisqueue", version)
    return _tracer


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers, for a job's envelope; None without
    an SDK set up or without a span (nothing to continue)."""
    if not set_up() or not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    _PROPAGATOR.inject(headers)
    # W3C lets a tracestate over 512 characters be cut; it comes from whoever called
    # the site, and would ride in every job.
    if len(headers.get("tracestate", "")) > MAX_TRACESTATE:
        del headers["tracestate"]
    return headers or None


MAX_TRACESTATE = 512


# Longest a stopping worker waits for its spans' export (ms).
FLUSH_TIMEOUT_MS = 5000


def flush() -> None:
    """Export the spans a process still holds (a worker about to exit), waiting at most
    FLUSH_TIMEOUT_MS: in a thread, as an exporter may not keep to the timeout it is
    given (a collector that is down)."""
    if set_up():
        force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if force_flush is not None:
            exporting = threading.Thread(target=force_flush, args=(FLUSH_TIMEOUT_MS,), daemon=True)
            exporting.start()
            exporting.join(FLUSH_TIMEOUT_MS / 1000)


def _traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _link(record: str, before: int | None = None) -> Any:
    """A link to the attempt a trace record names, or None if it names none.
    ``before``: the number of the attempt about to run; the record must be of the
    attempt just before it (the same number after a give-back, which forgets its
    attempt), else one in between was lost unrecorded and nothing is linked."""
    found = _RECORD.fullmatch(record)
    if found is None:
        return None
    number, how, trace_id, span_id, flags = found.groups()
    if before is not None and int(number) != (before if how == "RELEASE" else before - 1):
        return None
    linked = trace.SpanContext(
        int(trace_id, 16), int(span_id, 16), True, trace.TraceFlags(int(flags, 16))
    )
    if not linked.is_valid:
        return None
    return trace.Link(linked, {ATTEMPT: int(number), OUTCOME: LOST if how == "RUNNING" else how})


class NotTraced:
    """What ``sending`` and ``attempt`` give without OpenTelemetry: nothing done."""

    carrier: dict[str, str] | None = None
    record = ""

    def __enter__(self) -> NotTraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sent(self, job_ids: Sequence[str], *, at_commit: bool = False) -> None:
        """See Sending.sent."""

    def link_members(self, records: Iterable[str]) -> None:
        """See Attempt.link_members."""

    def ended(self, status: str, error: BaseException | None, error_json: str = "") -> str:
        """See Attempt.ended."""
        return ""


NOT_TRACED = NotTraced()


class _Current:
    """A span made current for the length of a ``with`` block (``_start`` in
    ``__enter__``); an exception out of the block is recorded on it."""

    def _start(self, name: str, **options: Any) -> Any:
        self._current = tracer().start_as_current_span(name, **options)
        self.span = self._current.__enter__()
        return self.span

    def _ending(self, error: BaseException | None) -> None:
        """Called as the block ends, before the span does (``error``: what left it)."""

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._ending(error)
        return self._current.__exit__(kind, error, tb)


class Sending(_Current):
    """The producer span of one enqueue call: current while its jobs are prepared
    (each envelope carries its context, ``carrier``) and pushed."""

    def __init__(self, operation: str, queue: str) -> None:
        self.operation, self.queue = operation, queue
        self.carrier: dict[str, str] | None = None

    def __enter__(self) -> Sending:
        attributes = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "send",
            REDISQUEUE_OPERATION: self.operation,
        }
        if self.queue:
            attributes[DESTINATION] = self.queue
        self._start(
            f"send {self.queue}" if self.queue else "send",
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
        )
        self.carrier = carrier()
        return self

    def sent(self, job_ids: Sequence[str], *, at_commit: bool = False) -> None:
        """Name the jobs sent (their ids as stored: a unique job's is its holder's);
        ``at_commit``: they go to Redis when the transaction commits."""
        if not self.span.is_recording():
            return
        if len(job_ids) == 1:
            self.span.set_attribute(MESSAGE_ID, job_ids[0])
        elif job_ids:
            self.span.set_attribute(BATCH_COUNT, len(job_ids))
        if at_commit:
            self.span.set_attribute(AT_COMMIT, True)


def set_up() -> bool:
    """Whether a tracer provider (an SDK) is set up: until one is, every span would be
    the API's no-op span, and nothing is done (the cost of an installed API is nil).
    Once set, a provider stays: that answer is kept."""
    global _provider_set
    if not _provider_set and trace is not None:
        provider = trace.get_tracer_provider()
        # (An SDK turned off, OTEL_SDK_DISABLED, hands out no-op tracers.)
        _provider_set = not isinstance(provider, trace.ProxyTracerProvider) and not isinstance(
            tracer(), trace.NoOpTracer
        )
    return _provider_set


_provider_set = False


def sending(operation: str, queue: str = "") -> Sending | NotTraced:
    """The producer span of one enqueue call (``operation``: enqueue, enqueue_group...)
    to ``queue`` ('' for jobs to several queues)."""
    return Sending(operation, queue) if set_up() else NOT_TRACED


class Attempt(_Current):
    """The consumer span of one attempt at a job, in the worker: a child of the
    enqueue's span (from the envelope), linked to the attempt before it."""

    def __init__(self, record: JobRecord, worker_id: str) -> None:
        self.job, self.worker_id = record, worker_id
        self.number = record.attempts or 1  # this attempt's
        self.record = ""  # this attempt's trace record while it runs (for the heartbeat)

    def __enter__(self) -> Attempt:
        job, envelope = self.job, self.job.envelope
        headers = envelope.trace if envelope is not None else None
        # Without context in the envelope, a new trace: never the worker's own context.
        parent = otel_context.Context()
        before = None
        try:  # whatever the job holds, it runs: a context that cannot be read is none
            if headers:
                parent = _PROPAGATOR.extract(headers)
            before = _link(job.fields.get("trace", ""), self.number)
        except Exception:  # the propagator's own parsing, whatever it raises
            logger.debug("Job %s: its trace context is unreadable", job.id, exc_info=True)
        attributes: dict[str, Any] = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            DESTINATION: job.queue,
            MESSAGE_ID: job.id,
            CLIENT_ID: self.worker_id,
            ATTEMPT: self.number,
        }
        if envelope is not None:
            attributes[TASK] = envelope.task_path
            # The first attempt's wait (not a give-back's second start, which keeps
            # the number 1 and has a record of the first).
            first = job.attempts <= 1 and "trace" not in job.fields
            wait = first_wait(job.fields, envelope.run_after) if first else None
            if wait is not None:
                attributes[WAIT_MS] = round(wait * 1000, 3)
        if job.lost:
            attributes[RECOVERIES] = job.lost
        span = self._start(
            f"process {job.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=[before] if before is not None else None,
        )
        if span.is_recording():
            self.record = self._record("RUNNING")
        return self

    def _record(self, how: str) -> str:
        """This attempt's trace record, saying how it ended (or RUNNING)."""
        return f"{self.number} {how} {_traceparent(self.span)}"

    def _ending(self, error: BaseException | None) -> None:
        self.record = ""  # ended: the heartbeat no longer records it
        if error is not None and not isinstance(error, Exception):
            # Stopped from outside (its lease lost: LeaseLost), which the API's span
            # does not record, as it records only an Exception.
            self.ended(LOST, error)

    def link_members(self, records: Iterable[str]) -> None:
        """A group's callback: link to its members' last attempts."""
        if not self.span.is_recording():
            return
        links = 0
        for record in records:
            link = _link(record)
            if link is not None and links < MAX_MEMBER_LINKS:
                self.span.add_link(link.context, link.attributes)
                links += 1

    def ended(self, status: str, error: BaseException | None, error_json: str = "") -> str:
        """Record how the attempt ended (``error``: what the task raised; or only
        ``error_json``, the outcome's error, for a job that never reached its task);
        return the trace record to store with the outcome ('' when the span is not
        recorded)."""
        span = self.span
        if not span.is_recording():
            return ""
        span.set_attribute(OUTCOME, status)
        error_type = ""
        if error is not None:
            error_type = f"{type(error).__module__}.{type(error).__qualname__}"
            try:
                span.record_exception(error)
            except Exception:  # an exception whose str() raises
                span.add_event("exception", {"exception.type": error_type})
        elif error_json:
            error_type = error_class(error_json)
        if error_type:
            span.set_attribute(ERROR_TYPE, error_type)
            span.set_status(trace.StatusCode.ERROR, error_type)
        return self._record(status)


def attempt(record: JobRecord, worker_id: str) -> Attempt | NotTraced:
    """The consumer span of the attempt at ``record``'s job that is about to run."""
    return Attempt(record, worker_id) if set_up() else NOT_TRACED


def error_class(error_json: str) -> str:
    """The exception class path an outcome's error JSON names ('' if none)."""
    try:
        error = from_json(error_json)
    except (ValueError, RecursionError):
        return ""
    return str(error.get("exception_class_path", "")) if isinstance(error, dict) else ""
