"""Settings for Django's ``tests/tasks/``: what Django's own runner gives them
(``tests/runtests.py`` with ``tests/test_sqlite.py``), plus this app. ``TASKS`` is left
to Django's default, as there; the harness routes Django's backends to this app's (see
``backends.py``), on the Redis whose URL ``python -m tests.django_suite`` passes in
``DJANGO_SUITE_REDIS_URL``."""

import copy
import os

from django.utils.log import DEFAULT_LOGGING

SECRET_KEY = "django_tests_secret_key"
USE_TZ = False

DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3"},
    "other": {"ENGINE": "django.db.backends.sqlite3"},
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_redisqueue",
    "tasks",  # Django's tests/tasks, an app as runtests.py makes it
]
MIGRATION_MODULES = {"auth": None, "contenttypes": None}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

REDIS_URL = os.environ.get("DJANGO_SUITE_REDIS_URL", "")

# As runtests.py: only errors from Django's loggers, unless a test captures them. The
# worker's own lines (django_redisqueue.*) are shown with --verbosity 2 or more.
LOGGING = copy.deepcopy(DEFAULT_LOGGING)
LOGGING["loggers"]["django"]["level"] = "ERROR"
LOGGING["loggers"]["django_redisqueue"] = {
    "handlers": ["console_debug"],
    "level": "DEBUG" if int(os.environ.get("DJANGO_SUITE_VERBOSITY", "1")) >= 2 else "CRITICAL",
    "propagate": False,
}
LOGGING["handlers"]["console_debug"] = {
    "level": "DEBUG",
    "class": "logging.StreamHandler",
}
