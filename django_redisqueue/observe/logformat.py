"""``runworker --log-format json``: one JSON object per log line.

The fields are listed in docs/reference/commands.md; any ``extra=`` field of a log call
is added as it is. ``json_everywhere`` changes formats only, never which records are
written, nor how many times.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import warnings
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from django_redisqueue.compat import (
    log_task_finished,
    log_task_started,
    task_finished,
    task_started,
)

if TYPE_CHECKING:
    from django_redisqueue.observe.events import JobEvent

# The attributes every LogRecord has; the others came with extra=.
STANDARD_ATTRIBUTES = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime"}
)


def job_fields(event: JobEvent) -> dict[str, Any]:
    """The ``extra=`` of a job's log line."""
    fields: dict[str, Any] = {
        "job_id": event.job_id,
        "task": event.task,
        "queue": event.queue,
        "status": event.status,
        "duration_ms": round(event.duration * 1000, 3),
        "attempt": event.attempt,
    }
    if event.wait is not None:
        fields["wait_ms"] = round(event.wait * 1000, 3)
    return fields


def start_fields(event: JobEvent) -> dict[str, Any]:
    """The ``extra=`` of a job's start line: its fields, but for a duration."""
    fields = job_fields(event)
    del fields["duration_ms"]
    return fields


def leave_out_framework_lines() -> None:
    """From now on, in this process, disconnect the framework's receivers that log each
    job's start and end: the worker logs them itself, with its timings and fields.
    ``runworker`` calls it; a Worker run in a test keeps the framework's lines, for
    ``assertLogs("django.tasks")``."""
    task_started.disconnect(log_task_started)
    task_finished.disconnect(log_task_finished)


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in STANDARD_ATTRIBUTES and name not in line:
                line[name] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def json_everywhere() -> None:
    """Make every line the process writes to stdout or stderr a JSON object: give the
    JSON format to every handler that writes there (of the loggers configured so far,
    and Python's last resort, which prints the records of loggers without a handler),
    and print as JSON lines what Python prints itself: warnings, uncaught exceptions."""
    for handler in _console_handlers():
        handler.setFormatter(JsonFormatter())
    warnings.showwarning = _show_warning
    sys.excepthook = _on_uncaught
    threading.excepthook = _on_uncaught_in_thread


def _console_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]  # fmt: skip
    handlers = [handler for logger in loggers for handler in logger.handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    consoles = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return [h for h in handlers if isinstance(h, logging.StreamHandler) and h.stream in consoles]


def json_line(name: str, level: int, message: str, exc_info: Any = None) -> str:
    """``message`` as a JSON line of logger ``name``, without going through logging:
    for what is printed whatever the project's LOGGING."""
    record = logging.LogRecord(name, level, "", 0, message, None, exc_info)
    return JsonFormatter().format(record) + "\n"


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
    (file or _stderr()).write(json_line("py.warnings", logging.WARNING, text))


def _on_uncaught(
    kind: type[BaseException], error: BaseException, trace: TracebackType | None
) -> None:
    line = json_line("py.uncaught", logging.CRITICAL, "Uncaught exception", (kind, error, trace))
    _stderr().write(line)


def _on_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # ends its thread quietly, as by default
        return
    kind, name = args.exc_type, args.thread.name if args.thread else "?"
    exc_info = (kind, args.exc_value or kind(), args.exc_traceback)
    _stderr().write(
        json_line("py.uncaught", logging.ERROR, f"Exception in thread {name}", exc_info)
    )


def _stderr() -> TextIO:
    """The process's own stderr: sys.stderr may be a JsonLines, which would wrap a JSON
    line in another."""
    return sys.__stderr__ or sys.stderr


class JsonLines(io.TextIOBase):
    """A text stream that writes each line it is given to ``stream`` as a JSON line (a
    command's stdout or stderr, and sys.stdout and stderr, where tasks print). A line is
    written once it ends (print writes it in pieces), or on flush; blank lines are left
    out, and one that is a JSON object already goes as it is."""

    def __init__(self, stream: TextIO, name: str, level: int) -> None:
        self.stream = stream
        self.name = name
        self.level = level
        self.pending = ""

    def writable(self) -> bool:
        return True

    # What code expects of sys.stdout besides write(): the stream's own (bytes written
    # to ``buffer`` or the file descriptor go as they are, not as JSON).
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    @property
    def buffer(self) -> Any:
        return self.stream.buffer

    def fileno(self) -> int:
        return self.stream.fileno()

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        self._emit(self.pending)
        self.pending = ""
        self.stream.flush()

    def _emit(self, line: str) -> None:
        if line.startswith("{") and _is_json_object(line):
            self.stream.write(line + "\n")
        elif line.strip():
            self.stream.write(json_line(self.name, self.level, line))


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def log_end(logger: logging.Logger, event: JobEvent, raised: BaseException | None,
            retry_in_ms: int, *, note: str = "") -> None:  # fmt: skip
    """Log how an attempt ended: a line per job, its fields for ``--log-format json``
    (made only for a log that shows it: a busy worker logs thousands a second, or none).
    ``note``: added to a retry's line (that no scheduler runs to start it)."""
    elapsed = event.duration * 1000
    said = _said(raised)
    if raised is None:
        if logger.isEnabledFor(logging.INFO):
            logger.info("Job %s %s %s in %.1f ms", event.job_id, event.task, event.status,
                        elapsed, extra=job_fields(event))  # fmt: skip
    elif event.status == "RETRY":
        logger.warning("Job %s %s raised %s: %s in %.1f ms; again in %.1f s%s", event.job_id,
                       event.task, type(raised).__name__, said, elapsed, retry_in_ms / 1000,
                       note, extra=job_fields(event))  # fmt: skip
    else:
        logger.error("Job %s %s FAILED in %.1f ms: %s: %s", event.job_id, event.task, elapsed,
                     type(raised).__name__, said, exc_info=raised,
                     extra=job_fields(event))  # fmt: skip


def _said(error: BaseException | None) -> str:
    """What an exception says, or that it cannot say it (its ``__str__`` raised)."""
    try:
        return str(error)
    except Exception:  # a task's own exception class: anything may go wrong in it
        return f"<{type(error).__name__} whose message raised>"
