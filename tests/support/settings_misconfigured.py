"""The test settings with everything ``manage.py check`` should catch."""

from tests.support.settings import *  # noqa: F403
from tests.support.settings import INSTALLED_APPS

INSTALLED_APPS = ["tests.support.shadow_app", *INSTALLED_APPS]

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}

TASKS = {
    "default": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["high", "high", "no spaces"],
        "OPTIONS": {"URLL": "redis://", "LEASE": 0},
    },
    "cached": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "OPTIONS": {"CONNECTION": "default"},
    },
    "both": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": "default",
        "OPTIONS": {"CONNECTION": "default", "URL": "redis://127.0.0.1:6379/0"},
    },
}
