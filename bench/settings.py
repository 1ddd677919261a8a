"""Settings for the benchmark: the private redis-server's URL comes from BENCH_REDIS_URL."""

import os

import django

SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["django_redisqueue", "bench"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {
    "default": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")},
    }
}
