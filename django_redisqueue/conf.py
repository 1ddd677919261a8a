"""The backend's settings: ``TASKS[alias]["QUEUES"]`` and ``["OPTIONS"]``, parsed once
per backend instance (Django rebuilds backends when ``TASKS`` changes)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .compat import DEFAULT_TASK_QUEUE_NAME
from .exceptions import ConfigurationError

DEFAULT_URL = "redis://127.0.0.1:6379/0"

# A queue name becomes part of Redis keys and of command-line arguments.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Options:
    """Everything a backend reads from its settings, with defaults."""

    queues: tuple[str, ...]
    connection: str | None = None  # a django-redis CACHES alias
    url: str | None = None
    key_prefix: str = ""
    result_ttl: int = 24 * 3600  # seconds a finished job's result is kept
    lease: float = 60.0  # seconds a worker holds a job without a heartbeat
    max_payload_bytes: int = 512 * 1024
    max_recoveries: int = 2  # times a job whose worker was lost is queued again

    @property
    def redis_url(self) -> str:
        return self.url or DEFAULT_URL


OPTION_NAMES = {
    "CONNECTION": "connection",
    "URL": "url",
    "KEY_PREFIX": "key_prefix",
    "RESULT_TTL": "result_ttl",
    "LEASE": "lease",
    "MAX_PAYLOAD_BYTES": "max_payload_bytes",
    "MAX_RECOVERIES": "max_recoveries",
}


def parse_options(alias: str, params: Mapping[str, Any]) -> Options:
    """Validate ``TASKS[alias]`` and return its options; raise ConfigurationError."""
    where = f"TASKS[{alias!r}]"
    queues = params.get("QUEUES") or [DEFAULT_TASK_QUEUE_NAME]
    if isinstance(queues, str) or not isinstance(queues, Sequence):
        raise ConfigurationError(
            f"{where}['QUEUES'] must be a list of queue names in priority order, "
            f"e.g. ['high', 'default', 'low']; got {queues!r}."
        )
    for name in queues:
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            raise ConfigurationError(
                f"{where}['QUEUES'] has an invalid queue name {name!r}: use 1 to 64 "
                "letters, digits, '_', '.' or '-'."
            )
    if len(set(queues)) != len(queues):
        raise ConfigurationError(f"{where}['QUEUES'] lists a queue twice: {queues!r}.")

    raw = params.get("OPTIONS") or {}
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise ConfigurationError(
            f"{where}['OPTIONS'] has unknown option(s) {', '.join(unknown)}; "
            f"known options are {', '.join(sorted(OPTION_NAMES))}."
        )
    values: dict[str, Any] = {OPTION_NAMES[name]: value for name, value in raw.items()}
    if values.get("connection") and values.get("url"):
        raise ConfigurationError(
            f"{where}['OPTIONS'] sets both CONNECTION and URL; keep one of them."
        )
    for name, least in (("result_ttl", 1), ("max_payload_bytes", 1), ("max_recoveries", 0)):
        value = values.get(name, least)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ConfigurationError(
                f"{where}['OPTIONS']['{name.upper()}'] must be a whole number >= {least}."
            )
    if "lease" in values and (not isinstance(values["lease"], int | float) or values["lease"] < 1):
        raise ConfigurationError(
            f"{where}['OPTIONS']['LEASE'] must be a number of seconds, at least 1."
        )
    values.setdefault("key_prefix", f"drq:{alias}")
    return Options(queues=tuple(queues), **values)
