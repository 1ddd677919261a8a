"""Settings for the test suite. The suite starts a private redis-server and passes
its URL in REDISQUEUE_TEST_URL, to this process and to the workers it starts; the
database file's path goes the same way, in REDISQUEUE_TEST_DB_<xdist worker>."""

import json
import os
import tempfile

import django

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redisqueue",
    "tests.support",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

# A file, not ":memory:", so that the workers the tests start see the rows the tests
# commit. Its path travels to them in the environment, like the Redis URL, under a name
# of each pytest-xdist worker's own: they inherit the controller's environment.
DB_FILE = os.environ.setdefault(
    f"REDISQUEUE_TEST_DB_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
    os.path.join(tempfile.gettempdir(), f"redisqueue-tests-{os.getpid()}.sqlite3"),
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DB_FILE,
        "TEST": {"NAME": DB_FILE},
    }
}

# PostgreSQL and MariaDB, as the machine runs them (trust auth, root without a password),
# for the outbox's tests: one database per pytest-xdist worker, named alike in the
# workers the tests start. REDISQUEUE_TEST_PG and _MARIADB give other servers' settings.
# The processes the tests start have them only when a test asks (tests.conftest's
# child_env): Django's system checks, which every runworker runs, load the driver of
# every database and ask MariaDB's server for its settings. REDISQUEUE_TEST_DB_PREFIX
# names them otherwise, for two runs at once on one server.
TEST_DB = (
    f"{os.environ.get('REDISQUEUE_TEST_DB_PREFIX', 'redisqueue_tests')}_"
    f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
)
OTHER_DATABASES = {
    "postgresql": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": 5432,
        "USER": "postgres",
        **json.loads(os.environ.get("REDISQUEUE_TEST_PG", "{}")),
    },
    "mariadb": {
        "ENGINE": "django.db.backends.mysql",
        "HOST": "127.0.0.1",
        "PORT": 3306,
        "USER": "root",
        **json.loads(os.environ.get("REDISQUEUE_TEST_MARIADB", "{}")),
    },
}
for alias, database in OTHER_DATABASES.items():
    if not os.environ.get("REDISQUEUE_TEST_SQLITE_ONLY"):
        DATABASES[alias] = {**database, "NAME": TEST_DB, "TEST": {"NAME": TEST_DB}}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.support.urls"
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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDISQUEUE_TEST_URL", "redis://127.0.0.1:6379/15")
# Set when REDIS_URL names a node of a Redis Cluster (REDISQUEUE_TEST_TOPOLOGY=cluster).
REDIS_CLUSTER = bool(os.environ.get("REDISQUEUE_TEST_CLUSTER"))
REDIS = {"URL": REDIS_URL, **({"CLUSTER": True} if REDIS_CLUSTER else {})}

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
        "OPTIONS": REDIS,
    },
    # Short leases, for the tests of lost workers.
    "leased": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {**REDIS, "LEASE": 1, "MAX_RECOVERIES": 2},
    },
    # Any queue name is valid, as Django reads an empty QUEUES.
    "anyqueue": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": [],
        "OPTIONS": REDIS,
    },
    "cached": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"CONNECTION": "default"},
    },  # A fair queue between two that are not (tests/test_fair.py).
    "fair": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["high", "imports", "default"],
        "OPTIONS": {**REDIS, "FAIR_QUEUES": ["imports"]},
    },
    # A fair queue with short leases, for the chaos of tests/test_fair.py.
    "fair-leased": {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {**REDIS, "LEASE": 1, "MAX_RECOVERIES": 5, "FAIR_QUEUES": ["default"]},
    },
}
# The outbox's backends, "outbox-<database alias>" (tests/test_outbox*.py). In the
# tests' own processes only "outbox-default", so that the pages and metrics that show
# every backend read no other database (the outbox's tests add the others: the
# outbox_backends fixture); in the processes the tests start, one per database they have.
STARTED_BY_A_TEST = "REDISQUEUE_TEST_SQLITE_ONLY" in os.environ
for alias in DATABASES if STARTED_BY_A_TEST else ["default"]:
    TASKS[f"outbox-{alias}"] = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {**REDIS, "OUTBOX": alias},
    }

# Periodic jobs (tests/test_periodic.py): the schedules of the schedulers a test starts
# travel as JSON; the tests in this process build their own with override_settings.
TASKS["periodic"] = {
    "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
    "QUEUES": ["high", "default", "low"],
    "OPTIONS": {**REDIS, "PERIODIC": json.loads(os.environ.get("REDISQUEUE_TEST_PERIODIC", "{}"))},
}

# The failover tests' backend (tests/test_failover.py): its OPTIONS, naming a Sentinel
# group or a cluster they started, travel as JSON to the workers they start.
if os.environ.get("REDISQUEUE_TEST_FAILOVER"):
    TASKS["failover"] = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": json.loads(os.environ["REDISQUEUE_TEST_FAILOVER"]),
    }

# Tests log users in often; a slow hasher only slows them down.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The traces' tests (tests/test_tracing.py): the processes they start write their
# spans to this file.
if os.environ.get("REDISQUEUE_TEST_SPANS"):
    from tests.support.traces import export_spans_to

    export_spans_to(os.environ["REDISQUEUE_TEST_SPANS"])
