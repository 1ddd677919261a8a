"""Settings for the test suite. The suite starts a private redis-server and passes
its URL in REDISQUEUE_TEST_URL, to this process and to the workers it starts; the
database file's path goes the same way, in REDISQUEUE_TEST_DB."""

import os
import tempfile

import django

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_redisqueue",
    "tests",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

# A file, not ":memory:", so that the workers the tests start see the rows the tests
# commit. Its path travels to them in the environment, like the Redis URL.
DB_FILE = os.environ.setdefault(
    "REDISQUEUE_TEST_DB",
    os.path.join(tempfile.gettempdir(), f"redisqueue-tests-{os.getpid()}.sqlite3"),
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DB_FILE,
        "TEST": {"NAME": DB_FILE},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDISQUEUE_TEST_URL", "redis://127.0.0.1:6379/15")

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    }
}

TASKS = {
    "default": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["high", "default", "low"],
        "OPTIONS": {"URL": REDIS_URL},
    },
    # Short leases, for the tests of lost workers.
    "leased": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"URL": REDIS_URL, "LEASE": 1, "MAX_RECOVERIES": 2},
    },
    "cached": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"CONNECTION": "default"},
    },
}
