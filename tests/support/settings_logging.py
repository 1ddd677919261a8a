"""tests/support/settings.py with the project LOGGING named by REDISQUEUE_TEST_LOGGING, for the
tests of ``runworker``'s log lines, in text and JSON (tests/test_worker_ops.py)."""

import os

from django.core import checks

from tests.support.settings import *  # noqa: F403


@checks.register
def _a_project_warning(app_configs, **kwargs):
    """A finding of the system checks, which Django writes to a command's stderr."""
    return [checks.Warning("a warning of the project's", id="tests.W001")]


_TEXT = {"text": {"format": "%(levelname)s %(name)s: %(message)s"}}
_CONSOLE = {"class": "logging.StreamHandler", "formatter": "text"}


def _logging(loggers: dict, root: dict | None = None) -> dict:
    """A LOGGING whose handlers print plain text: "console" on stderr, "out" on stdout."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": _TEXT,
        "handlers": {"console": _CONSOLE, "out": {**_CONSOLE, "stream": "ext://sys.stdout"}},
        "loggers": loggers,
        **({"root": root} if root else {}),
    }


VARIANT = os.environ.get("REDISQUEUE_TEST_LOGGING", "")
if VARIANT == "django-debug":  # Django's default LOGGING, whose console handler prints
    DEBUG = True
elif VARIANT == "root":
    LOGGING = _logging({}, root={"handlers": ["console"], "level": "INFO"})
elif VARIANT == "django":
    LOGGING = _logging({"django": {"handlers": ["console"], "level": "INFO"}})
elif VARIANT == "app":  # the app's logger routed, and propagating to the root's
    LOGGING = _logging(
        {"django_redisqueue": {"handlers": ["console"], "level": "INFO"}},
        root={"handlers": ["out"], "level": "INFO"},
    )
elif VARIANT == "unconfigured":
    LOGGING_CONFIG = None
elif VARIANT:
    raise ValueError(f"REDISQUEUE_TEST_LOGGING={VARIANT!r}")
