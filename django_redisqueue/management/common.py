"""What the management commands share: their log set-up and the backend they serve."""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

from django.core.management.base import CommandError

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.compat import task_backends
from django_redisqueue.exceptions import ConfigurationError
from django_redisqueue.observe.logformat import (
    JsonFormatter,
    JsonLines,
    json_everywhere,
    leave_out_framework_lines,
)

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
# Django's (6.0+) and the django-tasks backport's.
TASKS_FRAMEWORK_LOGGERS = ("django.tasks", "django_tasks")


def configure_logging(verbosity: int, log_format: str = "text") -> None:
    """Show the worker's log lines unless the project's LOGGING already routes them
    (``log_format`` "json": one JSON object per line, in the app's handlers and in
    every handler that writes to stdout or stderr, over the project's formats)."""
    # Each job's start and end is one record, the worker's, not the framework's too.
    leave_out_framework_lines()
    logger = logging.getLogger("django_redisqueue")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    if log_format == "json":
        for routed in logger.handlers:
            routed.setFormatter(JsonFormatter())
        # The tasks framework's records of this worker's jobs are left out (above), but
        # it logs others (a task that runs a task on Django's immediate backend, say);
        # unrouted, Python would print those as plain text.
        for name in TASKS_FRAMEWORK_LOGGERS:
            framework = logging.getLogger(name)
            if not framework.handlers:
                framework.addHandler(logging.StreamHandler(sys.stderr))
        json_everywhere()
        # What tasks print, or write to sys.stderr, becomes JSON lines too. The handlers
        # above keep the streams they were given.
        sys.stdout = cast(
            TextIO, JsonLines(sys.__stdout__ or sys.stdout, "py.stdout", logging.INFO)
        )
        sys.stderr = cast(
            TextIO, JsonLines(sys.__stderr__ or sys.stderr, "py.stderr", logging.WARNING)
        )


def get_backend(
    alias: str, command: str = "runworker", *, connect: bool = True
) -> RedisQueueBackend:
    try:
        backend = task_backends[alias]
    except Exception as exc:
        raise CommandError(f"No task backend {alias!r} in settings.TASKS: {exc}") from exc
    if not isinstance(backend, RedisQueueBackend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__module__}.{type(backend).__name__}; "
            f"{command} serves django_redisqueue.backend.RedisQueueBackend only."
        )
    try:
        _ = backend.config  # wrong settings: what the system checks report, if skipped
    except ConfigurationError as exc:
        raise CommandError(f"TASKS[{alias!r}] cannot be used:\n{exc}") from exc
    if connect:
        backend.connect()
    return backend
