"""Settings for the benchmark: the private redis-server's URL comes from BENCH_REDIS_URL.

BENCH_REDIS_OPTIONS, a JSON object, replaces the backend's OPTIONS (a replica, a cluster);
BENCH_REDIS_ALIASES, JSON ``{alias: OPTIONS}``, adds backends (``bench/scaling.py``,
``bench/outbox.py``).
"""

import json
import os

import django

SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["django_redisqueue", "bench"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")
# BENCH_DATABASE, a JSON object, replaces the in-memory SQLite database (bench/outbox.py).
DATABASES = {
    "default": json.loads(os.environ.get("BENCH_DATABASE") or "null")
    or {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
}
_OPTIONS = json.loads(os.environ.get("BENCH_REDIS_OPTIONS") or "null") or {
    "URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
}
TASKS = {
    alias: {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": options,
    }
    for alias, options in {
        "default": _OPTIONS,
        **json.loads(os.environ.get("BENCH_REDIS_ALIASES") or "{}"),
    }.items()
}
