"""The job envelope (the JSON a job travels as) and the job record it becomes.

Envelope, version 1: ``{"v": 1, "task": "app.tasks.func", "args": [...],
"kwargs": {...}, "queue": "default", "priority": 0, "backend": "default",
"enqueued_at": 1700000000.123, "run_after": null}``, times in seconds since the epoch.
Unknown fields are ignored, so an older worker can read a newer job of the same
version; a newer version is refused with a clear reason.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .exceptions import InvalidPayload

ENVELOPE_VERSION = 1


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def ensure_json(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` comes back equal from a JSON round trip.

    Tuples are accepted and arrive as lists, as in Django's tasks framework.
    """
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {value!r}, which JSON cannot represent.")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            ensure_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has the key {key!r} ({type(key).__name__}); JSON object "
                    "keys must be strings."
                )
            ensure_json(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which does "
        "not survive a JSON round trip; pass plain data (e.g. a primary key) instead."
    )


def ensure_json_arguments(task_path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise TypeError, naming the argument, unless every argument survives JSON."""
    for i, value in enumerate(args):
        ensure_json(value, f"Argument {i} of {task_path}()")
    for name, value in kwargs.items():
        ensure_json(value, f"Argument {name!r} of {task_path}()")


@dataclass(frozen=True, slots=True)
class Envelope:
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue_name: str
    priority: int
    backend: str
    enqueued_at: float  # seconds since the epoch
    run_after: float | None = None  # seconds since the epoch

    def dumps(self) -> str:
        return to_json(
            {
                "v": ENVELOPE_VERSION,
                "task": self.task_path,
                "args": self.args,
                "kwargs": self.kwargs,
                "queue": self.queue_name,
                "priority": self.priority,
                "backend": self.backend,
                "enqueued_at": self.enqueued_at,
                "run_after": self.run_after,
            }
        )

    @classmethod
    def loads(cls, payload: bytes | str, max_bytes: int) -> Envelope:
        """Parse a payload read from Redis; raise InvalidPayload saying what is wrong.

        Checked in order: size, JSON, envelope version, field types.
        """
        if not payload:
            raise InvalidPayload("no payload is stored for this job")
        if len(payload) > max_bytes:
            raise InvalidPayload(
                f"payload is {len(payload)} bytes, over the {max_bytes}-byte limit"
            )
        try:
            data = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidPayload(f"payload is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidPayload("payload is not a JSON object")
        version = data.get("v")
        if version != ENVELOPE_VERSION:
            raise InvalidPayload(
                f"envelope version {version!r} is not supported (this worker reads "
                f"version {ENVELOPE_VERSION})"
            )
        try:
            envelope = cls(
                task_path=data["task"],
                args=data.get("args", []),
                kwargs=data.get("kwargs", {}),
                queue_name=data.get("queue", ""),
                priority=data.get("priority", 0),
                backend=data.get("backend", ""),
                enqueued_at=data.get("enqueued_at", 0.0),
                run_after=data.get("run_after"),
            )
        except KeyError:
            raise InvalidPayload("envelope names no task") from None
        if not (
            isinstance(envelope.task_path, str)
            and isinstance(envelope.args, list)
            and isinstance(envelope.kwargs, dict)
            and isinstance(envelope.priority, int)
            and isinstance(envelope.enqueued_at, int | float)
            and isinstance(envelope.run_after, int | float | None)
        ):
            raise InvalidPayload("envelope fields have the wrong types")
        return envelope


def error_info(exc: BaseException) -> dict[str, str]:
    """Describe an exception in the shape of Django's ``TaskError``."""
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def from_ms(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


def from_seconds(value: float | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromtimestamp(value, tz=UTC)
