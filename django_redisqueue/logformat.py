"""``runworker --log-format json``: one JSON object per log line.

Every line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, and
``error`` (the traceback) when it carries an exception. A job's line also has the
fields the worker passes with ``extra=`` (``job_fields``): ``job_id``, ``task``,
``queue``, ``status``, ``duration_ms``, ``attempt``, and ``wait_ms`` when known (the
first attempt's time from ready to started). Any other ``extra=`` field of a log call
is added as it is, so a project's own log calls can add fields too.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import JobEvent

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
