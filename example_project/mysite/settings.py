"""Settings of the example project: SQLite, console email, django-redisqueue."""

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redisqueue",
    "shop",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the tasks framework backport

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "mysite.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DATABASE", BASE_DIR / "db.sqlite3"),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}}

TASKS = {
    "default": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["high", "default", "imports", "low"],  # the order is the priority order
        "OPTIONS": {
            # Customers' imports take turns: a big one does not hold back a small one.
            "FAIR_QUEUES": ["imports"],
            "CONNECTION": "default",  # reuse the django-redis cache's connection
            # Jobs enqueued in a transaction are written to the database with it, and
            # reach Redis once it commits, whatever Redis does then (the signup view).
            "OUTBOX": True,
            # Periodic jobs: runscheduler enqueues each run once, however many run.
            "PERIODIC": {
                "purge-old-logs": {
                    "task": "shop.tasks.purge_old_logs",
                    "cron": "30 3 * * *",  # every night at 03:30, TIME_ZONE
                    "kwargs": {"days": 7},
                },
            },
        },
    }
}
