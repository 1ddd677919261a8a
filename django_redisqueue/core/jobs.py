"""The job envelope (the JSON a job travels as) and the job record it becomes.

Envelope, version 1: ``{"v":1,"task":"app.tasks.func","args":[...],"kwargs":{...},
"priority":5,"run_after":1767225600.0}``, ``run_after`` in seconds since the epoch.
Fields holding their default (no arguments, priority 0, no ``run_after``) are left
out, and the queue is a field of the job's hash, not of the envelope: a small job's
envelope stays under the 64 bytes up to which Redis keeps a hash in its compact
encoding (see docs/protocol.md, "Memory"). Unknown fields are ignored, so an older
worker can read a newer job of the same version; a newer version is refused with a
clear reason. Times the job records as it moves (enqueued, started, finished) are
fields of its hash, in ms by Redis's clock, not part of the envelope.

Everything read from Redis is checked here: ``Envelope.loads`` refuses a payload with
a reason, and ``JobRecord.parse`` reads whatever a job hash holds without raising.
"""

from __future__ import annotations

import json
import math
import re
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django_redisqueue.core.progress import JobProgress, read_progress
from django_redisqueue.exceptions import InvalidPayload

ENVELOPE_VERSION = 1

MIN_PRIORITY, MAX_PRIORITY = -100, 100
# The latest instant a datetime holds (year 9999), in seconds since the epoch.
MAX_TIMESTAMP = 253402300799
# A queue name becomes part of Redis keys and of command-line arguments.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # whole names: use fullmatch
# What a job id can be (claim.lua refuses any other queue member as malformed).
JOB_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")  # whole ids: use fullmatch
# Longest traceback kept per error: the head and the tail survive, the middle is cut.
MAX_TRACEBACK_CHARS = 16_000
# Deepest nesting of lists and objects in arguments: deeper ones would exhaust the
# recursion of code that walks them (Django's TaskResult does).
MAX_DEPTH = 100

# A job's status, as its hash stores it (docs/protocol.md, "States"); a cancelled job is
# FAILED with JobCancelled.
READY = "READY"
RUNNING = "RUNNING"
SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"
STATUSES = (READY, RUNNING, SUCCESSFUL, FAILED)


# Made once: json.dumps() with options builds an encoder on every call (every enqueue
# and every job's result pay it).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def to_json(value: Any) -> str:
    """Compact JSON, UTF-8 where it can be: a string holding a lone surrogate (which no
    UTF-8 text can carry, so Redis could not be sent it) makes the whole text ASCII,
    with escapes."""
    text = _COMPACT.encode(value)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = _COMPACT_ASCII.encode(value)
    return text


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True if lists and objects nest deeper than ``limit`` (walked without recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [
            item
            for container in level
            if isinstance(container, list | tuple | dict)
            for item in (container.values() if isinstance(container, dict) else container)
        ]
        if not level:
            return False
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a JSON number")
    return value


# Made once: json.loads() with hooks builds a decoder on every call.
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def from_json(text: str | bytes) -> Any:
    """Parse JSON strictly: no NaN, Infinity or numbers that overflow to them."""
    if isinstance(text, str) and not text.startswith("\ufeff"):
        return _STRICT_DECODER.decode(text)
    # Bytes (told apart by encoding as json.loads does), or a BOM it refuses.
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def _plain_json(value: Any, depth: int = 0) -> bool:
    """True if ``value`` surely survives a JSON round trip, nesting at most
    MAX_DEPTH - 2 levels: the quick check of every enqueue, which builds no message.
    False leaves the verdict to the slow walk, which says what is wrong."""
    if value is None or isinstance(value, str | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if depth >= MAX_DEPTH - 2:
        return False
    if isinstance(value, list | tuple):
        return all(_plain_json(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _plain_json(item, depth + 1) for key, item in value.items()
        )
    return False


def ensure_json(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` comes back equal from a JSON round trip.

    Tuples are accepted and arrive as lists, as in Django's tasks framework. Messages
    start as Django's do (``Unsupported type: ...``), then say which value it was.
    """
    if not _plain_json(value):
        _explain_json(value, where)


def _explain_json(value: Any, where: str) -> None:
    """ensure_json's slow walk: raise TypeError naming the value that is not JSON."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(
                f"Unsupported value: {value!r}. {where} is {value!r}, which JSON cannot represent."
            )
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _explain_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"Unsupported type: {type(key)}. {where} has the key {key!r}; JSON "
                    "object keys must be strings."
                )
            _explain_json(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"Unsupported type: {type(value)}. {where} is a {type(value).__module__}."
        f"{type(value).__qualname__}, which does not survive a JSON round trip; pass plain "
        "data (e.g. a primary key) instead."
    )


def ensure_json_arguments(task_path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise TypeError, naming the argument, unless every argument survives JSON."""
    if _plain_json(args, 1) and _plain_json(kwargs, 1):
        return
    if too_deep([list(args), dict(kwargs)], MAX_DEPTH + 1):
        raise TypeError(
            f"Unsupported value: the arguments of {task_path}() nest lists or dicts deeper "
            f"than {MAX_DEPTH} levels."
        )
    for i, value in enumerate(args):
        _explain_json(value, f"Argument {i} of {task_path}()")
    for name, value in kwargs.items():
        _explain_json(value, f"Argument {name!r} of {task_path}()")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Envelope:
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue_name: str  # stored in the job's hash, beside the envelope
    priority: int = 0
    run_after: float | None = None  # seconds since the epoch
    # The W3C trace context of the enqueue (core/tracing.py), as headers; None: none.
    trace: Mapping[str, str] | None = None

    def dumps(self) -> str:
        """The payload: compact JSON without the queue and without default fields."""
        data: dict[str, Any] = {"v": ENVELOPE_VERSION, "task": self.task_path}
        if self.args:
            data["args"] = self.args
        if self.kwargs:
            data["kwargs"] = self.kwargs
        if self.priority:
            data["priority"] = self.priority
        if self.run_after is not None:
            data["run_after"] = self.run_after
        if self.trace:
            data["trace"] = self.trace
        return to_json(data)

    @classmethod
    def loads(cls, payload: bytes | str, max_bytes: int, queue: str = "") -> Envelope:
        """Parse a payload read from Redis; raise InvalidPayload saying what is wrong.
        ``queue`` is the job's queue as its hash names it (an envelope naming one, as
        older ones did, is checked and wins).

        Checked in order: size, JSON, envelope version, then every field's type and
        range. Whatever the bytes, nothing else is raised.
        """
        if not payload:
            raise InvalidPayload("no payload is stored for this job")
        if len(payload) > max_bytes:
            raise InvalidPayload(
                f"payload is {len(payload)} bytes, over the {max_bytes}-byte limit"
            )
        try:
            data = from_json(payload)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidPayload(f"payload is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidPayload("payload is not a JSON object")
        version = data.get("v")
        if version != ENVELOPE_VERSION or isinstance(version, bool):
            raise InvalidPayload(
                f"envelope version {version!r:.40} is not supported (this worker reads "
                f"version {ENVELOPE_VERSION})"
            )
        # Nesting needs a bracket per level: most payloads are cleared by counting.
        opening = (b"[", b"{") if isinstance(payload, bytes) else ("[", "{")
        brackets = payload.count(opening[0]) + payload.count(opening[1])  # type: ignore[arg-type]
        if brackets > MAX_DEPTH and too_deep(
            [data.get("args"), data.get("kwargs")], MAX_DEPTH + 1
        ):
            raise InvalidPayload(f"arguments nest deeper than {MAX_DEPTH} levels")
        return cls(
            task_path=_field(data, "task", str, required=True),
            args=_field(data, "args", list, default=[]),
            kwargs=_field(data, "kwargs", dict, default={}),
            queue_name=_queue_field(data, queue),
            priority=_priority_field(data),
            run_after=_time_field(data, "run_after"),
            trace=_trace_field(data.get("trace")),
        )


def _field(data: dict[str, Any], name: str, kind: type, *, default: Any = None,
           required: bool = False) -> Any:  # fmt: skip
    if name not in data:
        if required:
            raise InvalidPayload(f"envelope has no {name!r}")
        return default
    value = data[name]
    if not isinstance(value, kind):
        raise InvalidPayload(
            f"envelope field {name!r} is a {type(value).__name__}, not a {kind.__name__}"
        )
    return value


def _queue_field(data: dict[str, Any], default: str) -> str:
    queue = _field(data, "queue", str, default=default)
    if queue and not QUEUE_NAME_RE.fullmatch(queue):
        raise InvalidPayload(f"the job names an invalid queue {queue[:80]!r}")
    return str(queue)


def _priority_field(data: dict[str, Any]) -> int:
    priority = data.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidPayload("envelope field 'priority' is not a whole number")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidPayload(
            f"envelope priority {priority!r:.40} is outside {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    return priority


def _time_field(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if not _is_number(value) or not 0 <= value <= MAX_TIMESTAMP:
        raise InvalidPayload(f"envelope field {name!r} is not a time ({value!r:.40})")
    return float(value)


# The most headers, and the longest, an envelope's trace context keeps (W3C's
# tracestate holds at most 32 entries of 256 characters; baggage is held to 8 KiB).
MAX_TRACE_HEADERS = 8
MAX_TRACE_HEADER_CHARS = 8192


def _trace_field(value: Any) -> dict[str, str] | None:
    """The envelope's trace context: a few short strings by name. Anything else is
    ignored, not refused: a bad trace context never stops a job."""
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_TRACE_HEADERS:
        return None
    for name, text in value.items():
        if not isinstance(text, str) or len(name) > 64 or len(text) > MAX_TRACE_HEADER_CHARS:
            return None
    return value


def cut_traceback(text: str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """Keep the head and the tail of a long traceback (the tail names the error)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... {len(text) - limit} characters cut ...\n{text[-half:]}"


def error_info(exc: BaseException) -> dict[str, str]:
    """Describe an exception in the shape of Django's ``TaskError``."""
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": cut_traceback("".join(traceback.format_exception(exc))),
    }


def from_ms(value: Any) -> datetime | None:
    """A time stored in ms since the epoch, or None for anything that is not one."""
    if value is None:
        return None
    try:
        ms = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not 0 < ms <= MAX_TIMESTAMP * 1000:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def from_seconds(value: float | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def first_wait(fields: Mapping[str, str], run_after: float | None) -> float | None:
    """Seconds from when a job could first run (enqueued, or due) to its first start,
    by Redis's clock, from the fields of its first attempt; None when they do not tell
    (a job that waited for another: its hash does not say when that one let it go)."""
    if fields.get("after"):
        return None
    started = whole_number(fields.get("last_attempted_at"))
    ready = whole_number(fields.get("enqueued_at"))
    if run_after and math.isfinite(run_after):
        ready = max(ready, int(run_after * 1000))
    if not started or not ready:
        return None
    return max(0.0, (started - ready) / 1000)


def owner_worker(owner: str) -> str:
    """The worker id of a job's fencing token, ``<worker id>/<attempt>`` ('' for none)."""
    return owner.rpartition("/")[0]


def owner_attempt(owner: str) -> int:
    """The attempt number of a job's fencing token (0 for none)."""
    return whole_number(owner.rpartition("/")[2])


def whole_number(value: Any) -> int:
    """A count read from Redis: a whole number >= 0, 0 for anything else."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def _errors(value: str) -> list[dict[str, str]]:
    try:
        errors = from_json(value) if value else []
    except (ValueError, RecursionError):
        return []
    if not isinstance(errors, list):
        return []
    return [
        {
            "exception_class_path": str(error.get("exception_class_path", "")),
            "traceback": str(error.get("traceback", "")),
        }
        for error in errors
        if isinstance(error, dict)
    ]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored in its hash, read leniently: whatever the fields hold, parsing
    never raises. ``problem`` says why the envelope could not be read (or is '')."""

    id: str
    fields: Mapping[str, str]
    envelope: Envelope | None
    problem: str = ""
    errors: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, job_id: str, fields: Mapping[str, str], max_payload_bytes: int) -> JobRecord:
        try:
            envelope: Envelope | None = Envelope.loads(
                fields.get("payload", ""), max_payload_bytes, fields.get("queue", "")
            )
            problem = ""
        except InvalidPayload as exc:
            envelope, problem = None, str(exc)
        return cls(job_id, fields, envelope, problem, _errors(fields.get("errors", "")))

    @property
    def exists(self) -> bool:
        return bool(self.fields)

    @property
    def status(self) -> str:
        """One of STATUSES; READY for a hash whose status is unreadable."""
        status = self.fields.get("status", "")
        return status if status in STATUSES else READY

    @property
    def queue(self) -> str:
        return self.fields.get("queue", "")

    @property
    def priority(self) -> int:
        try:
            return min(max(int(self.fields.get("priority", 0)), MIN_PRIORITY), MAX_PRIORITY)
        except (TypeError, ValueError):
            return 0

    @property
    def attempts(self) -> int:
        return whole_number(self.fields.get("attempts"))

    @property
    def lost(self) -> int:
        return whole_number(self.fields.get("lost"))

    @property
    def worker_ids(self) -> list[str]:
        workers = self.fields.get("workers", "")
        return workers.split(",") if workers else []

    @property
    def owner(self) -> str:
        return self.fields.get("owner", "")

    @property
    def cancelled(self) -> bool:
        return bool(self.fields.get("cancelled"))

    @property
    def progress(self) -> JobProgress | None:
        return read_progress(self.fields.get("progress"), self.attempts)

    @property
    def enqueued_at(self) -> datetime | None:
        return from_ms(self.fields.get("enqueued_at"))

    @property
    def started_at(self) -> datetime | None:
        return from_ms(self.fields.get("started_at"))

    @property
    def last_attempted_at(self) -> datetime | None:
        return from_ms(self.fields.get("last_attempted_at"))

    @property
    def finished_at(self) -> datetime | None:
        return from_ms(self.fields.get("finished_at"))

    @property
    def return_value(self) -> tuple[bool, Any]:
        """(True, value) if a readable JSON result is stored, else (False, None)."""
        return stored_value(self.fields.get("result"))


def stored_value(text: str | None) -> tuple[bool, Any]:
    """A return value as a job's hash stores it: (True, value) if it is readable JSON,
    else (False, None)."""
    if not text:
        return False, None
    try:
        return True, from_json(text)
    except (ValueError, RecursionError):
        return False, None
