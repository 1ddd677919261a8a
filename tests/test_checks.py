"""System checks: ``manage.py check`` reports wrong settings with IDs and hints, an
unreachable Redis at deploy checks, and another app's ``runworker`` taking the name."""

import socket
import time

import pytest
from django.core import checks
from django.db import DEFAULT_DB_ALIAS
from django.test import override_settings

from django_redisqueue import checks as redisqueue_checks
from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.compat import TASKS_PACKAGE
from django_redisqueue.core.conf import parse_options, validate
from django_redisqueue.exceptions import ConfigurationError
from tests.conftest import manage
from tests.support.servers import free_port

pytestmark = pytest.mark.pure

BACKEND = "django_redisqueue.backend.RedisQueueBackend"


def run_checks(**kwargs):
    """Django's system checks, on the default database only: from Django 6.1 they look
    at every database, and the test settings' MariaDB (the outbox's tests) would be
    asked for its settings, which a test without its database may not do. The database
    checks read the default one's tables (W005) where an OUTBOX names it."""
    return checks.run_checks(databases=[DEFAULT_DB_ALIAS], **kwargs)


def our_messages(deploy=False):
    """Run every registered check, Django's included; keep this app's messages."""
    found = run_checks(include_deployment_checks=deploy)
    return [m for m in found if m.id.startswith("django_redisqueue.")]


def test_manage_py_check_reports_every_problem_with_its_id_and_hint():
    done = manage("check", "--settings", "tests.support.settings_misconfigured")
    assert done.returncode == 1, done.stderr
    for check_id in ("E001", "E002", "E003", "E004", "E005", "E006", "E007", "W002"):
        assert f"(django_redisqueue.{check_id})" in done.stderr
    assert done.stderr.count("HINT:") == 8
    assert "Traceback" not in done.stderr  # Django's own tasks check ran too, unharmed

    # The commands run the checks first: a scheduler does not start on such settings.
    scheduler = manage(
        "runscheduler", "--burst", "--settings", "tests.support.settings_misconfigured"
    )
    assert scheduler.returncode == 1
    assert "(django_redisqueue.E004)" in scheduler.stderr
    # Without the checks, the command says the same, as a command error.
    skipped = manage(
        "runscheduler",
        "--burst",
        "--skip-checks",
        "--settings",
        "tests.support.settings_misconfigured",
    )
    assert skipped.returncode == 1
    assert "CommandError: TASKS['default'] cannot be used:\n" in skipped.stderr
    assert "(django_redisqueue.E004) TASKS['default']['OPTIONS'] has unknown" in skipped.stderr
    assert "Traceback" not in skipped.stderr


@pytest.mark.django_db
def test_the_test_settings_pass_every_check_against_a_live_redis():
    assert our_messages(deploy=True) == []


@pytest.mark.parametrize(
    ("params", "check_id", "text"),
    [
        ({"QUEUES": "default"}, "E001", "must be a list of queue names"),
        ({"QUEUES": ["a:b"]}, "E002", "invalid queue name 'a:b'"),
        ({"QUEUES": ["{tag}"]}, "E002", "invalid queue name '{tag}'"),
        ({"QUEUES": ["a" * 65]}, "E002", "invalid queue name"),
        ({"QUEUES": ["a", "b", "a"]}, "E003", "lists a queue twice"),
        ({"OPTIONS": {"LEASES": 5}}, "E004", "unknown option(s) LEASES"),
        (
            {"OPTIONS": {"URL": "redis://", "CONNECTION": "default"}},
            "E005",
            "both CONNECTION and URL",
        ),
        ({"OPTIONS": {"RESULT_TTL": 0}}, "E006", "['RESULT_TTL'] is 0"),
        ({"OPTIONS": {"MAX_RECOVERIES": True}}, "E006", "['MAX_RECOVERIES'] is True"),
        ({"OPTIONS": {"LEASE": "60"}}, "E006", "['LEASE'] is '60'"),
        ({"OPTIONS": {"ENQUEUE_ON_COMMIT": "yes"}}, "E006", "['ENQUEUE_ON_COMMIT']"),
        ({"OPTIONS": {"URL": "http://example.com"}}, "E006", "not a Redis URL"),
        ({"OPTIONS": ["URL"]}, "E006", "['OPTIONS'] is ['URL']"),
        (
            {"OPTIONS": {"URL": "redis://", "SENTINELS": [("h", 1)], "SERVICE_NAME": "m"}},
            "E005",
            "both URL and SENTINELS",
        ),
        ({"OPTIONS": {"SENTINELS": [("h", "26379")], "SERVICE_NAME": "m"}}, "E006", "SENTINELS"),
        ({"OPTIONS": {"SENTINELS": "h:26379", "SERVICE_NAME": "m"}}, "E006", "SENTINELS"),
        ({"OPTIONS": {"SENTINELS": [("h", 26379)]}}, "E008", "SERVICE_NAME is None"),
        ({"OPTIONS": {"SERVICE_NAME": "m"}}, "E008", "SERVICE_NAME without SENTINELS"),
        ({"OPTIONS": {"SENTINEL_KWARGS": {}}}, "E008", "SENTINEL_KWARGS without SENTINELS"),
        ({"OPTIONS": {"CLUSTER": True, "CONNECTION": "default"}}, "E008", "CLUSTER with"),
        ({"OPTIONS": {"CLIENT_KWARGS": {"db": 1}, "CONNECTION": "default"}}, "E008", "KWARGS"),
        ({"OPTIONS": {"CLUSTER": "yes"}}, "E006", "['CLUSTER'] is 'yes'"),
        ({"OPTIONS": {"CLUSTER_NODES": [("h", 0)]}}, "E006", "['CLUSTER_NODES']"),
        (
            {"OPTIONS": {"CLUSTER_NODES": [("h", 7000)], "URL": "redis://"}},
            "E005",
            "both URL and CLUSTER_NODES",
        ),
        ({"OPTIONS": {"CLIENT_KWARGS": ["password"]}}, "E006", "['CLIENT_KWARGS']"),
        ({"OPTIONS": {"REPLICA_ACKS": -1}}, "E006", "['REPLICA_ACKS'] is -1"),
        ({"OPTIONS": {"REPLICA_ACKS_TIMEOUT": 0}}, "E006", "['REPLICA_ACKS_TIMEOUT'] is 0"),
        ({"OPTIONS": {"CONNECTION": "nope"}}, "E007", "'nope' is not in CACHES"),
    ],
)
def test_each_problem_has_its_id_and_the_same_text_as_the_error(params, check_id, text):
    conf = {"BACKEND": BACKEND, **params}
    with override_settings(TASKS={"default": conf}):
        messages = our_messages()
    assert [(m.id, m.level) for m in messages] == [(f"django_redisqueue.{check_id}", checks.ERROR)]
    assert text in messages[0].msg
    assert messages[0].hint
    # One set of rules: the backend raises with the very same words, and the ID.
    with pytest.raises(ConfigurationError) as raised:
        parse_options("default", conf)
    assert str(validate("default", conf)[0]) == str(raised.value)
    assert str(raised.value) == (
        f"(django_redisqueue.{check_id}) {messages[0].msg} HINT: {messages[0].hint}"
    )


def test_a_connection_that_is_not_a_redis_cache():
    caches = {"other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    conf = {"BACKEND": BACKEND, "OPTIONS": {"CONNECTION": "other"}}
    with override_settings(TASKS={"default": conf}, CACHES={**caches, "default": caches["other"]}):
        messages = our_messages()
    assert [m.id for m in messages] == ["django_redisqueue.E007"]
    assert "not a Redis one" in messages[0].msg
    assert "django.core.cache.backends.redis.RedisCache" in messages[0].hint
    assert "django_redis.cache.RedisCache" in messages[0].hint


@pytest.mark.parametrize(
    "cache", ["django.core.cache.backends.redis.RedisCache", "django_redis.cache.RedisCache"]
)
def test_a_connection_to_a_redis_cache_of_django_or_django_redis_passes(cache):
    caches = {"default": {"BACKEND": cache, "LOCATION": "redis://127.0.0.1:6379/0"}}
    conf = {"BACKEND": BACKEND, "OPTIONS": {"CONNECTION": "default"}}
    with override_settings(TASKS={"default": conf}, CACHES=caches):
        assert our_messages() == []


def test_other_backends_are_left_alone():
    conf = {"BACKEND": f"{TASKS_PACKAGE}.backends.immediate.ImmediateBackend", "OPTIONS": {"X": 1}}
    with override_settings(TASKS={"default": conf}):
        assert our_messages(deploy=True) == []


@pytest.mark.parametrize(
    ("second", "warned"),
    [
        ({"KEY_PREFIX": "drq:shared", "OUTBOX": "postgresql"}, True),
        ({"KEY_PREFIX": "drq:shared", "OUTBOX": "default"}, False),  # one outbox table
        ({"KEY_PREFIX": "drq:shared"}, False),  # no outbox: no relay records
        ({"OUTBOX": "postgresql"}, False),  # a prefix of its own
    ],
)
def test_outbox_backends_sharing_a_key_prefix_are_warned_of(second, warned):
    conf = {"BACKEND": BACKEND, "OPTIONS": {"KEY_PREFIX": "drq:shared", "OUTBOX": "default"}}
    tasks = {"orders": conf, "mail": {"BACKEND": BACKEND, "OPTIONS": second}}
    with override_settings(TASKS=tasks):
        messages = redisqueue_checks.check_outbox_prefixes()
    assert [m.id for m in messages] == (["django_redisqueue.W006"] if warned else [])
    if warned:
        assert "TASKS['orders'] and TASKS['mail']" in messages[0].msg
        assert "'drq:shared'" in messages[0].msg


def test_unreachable_redis_is_a_deploy_warning():
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    conf = {"BACKEND": BACKEND, "OPTIONS": {"URL": url}}
    with override_settings(TASKS={"default": conf}):
        assert our_messages() == []  # not a deploy check: not run
        messages = our_messages(deploy=True)
    assert [(m.id, m.level) for m in messages] == [("django_redisqueue.W001", checks.WARNING)]
    assert "did not answer (redis://127.0.0.1:" in messages[0].msg
    assert "secret" not in messages[0].msg


def test_the_redis_check_does_not_hang_on_a_server_that_never_answers(monkeypatch):
    monkeypatch.setattr(redisqueue_checks, "PING_TIMEOUT", 0.3)
    with socket.socket() as silent:  # accepts connections (the backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        conf = {"BACKEND": BACKEND, "OPTIONS": {"URL": url}}
        started = time.monotonic()
        with override_settings(TASKS={"default": conf}):
            messages = our_messages(deploy=True)
        took = time.monotonic() - started
    assert [m.id for m in messages] == ["django_redisqueue.W001"]
    assert "Timeout" in messages[0].msg
    assert took < 5  # bounded by the timeout, not by the server


class SubclassBackend(RedisQueueBackend):
    pass


@pytest.mark.parametrize("backend", [BACKEND, f"{__name__}.SubclassBackend"])
def test_the_backend_without_the_app_installed_is_a_warning(backend):
    from django.conf import settings

    without = [app for app in settings.INSTALLED_APPS if app != "django_redisqueue"]
    conf = {"BACKEND": backend, "QUEUES": ["default"]}
    with override_settings(TASKS={"default": conf}, INSTALLED_APPS=without):
        messages = [m for m in run_checks() if m.id == "django_redisqueue.W004"]
    assert [(m.id, m.level) for m in messages] == [("django_redisqueue.W004", checks.WARNING)]
    assert "'django_redisqueue' is not in INSTALLED_APPS" in messages[0].msg
    assert "runworker" in messages[0].msg
    assert "Add 'django_redisqueue' to INSTALLED_APPS" in messages[0].hint

    with override_settings(TASKS={"default": conf}):  # installed: no warning
        assert [m for m in run_checks() if m.id == "django_redisqueue.W004"] == []


@pytest.mark.django_db
def test_runworker_of_an_app_listed_first_is_reported():
    from django.conf import settings

    installed = list(settings.INSTALLED_APPS)
    with override_settings(INSTALLED_APPS=["tests.support.shadow_app", *installed]):
        messages = our_messages()
    assert [m.id for m in messages] == ["django_redisqueue.W002"]
    assert (
        "'manage.py runworker' runs the command of 'tests.support.shadow_app'" in messages[0].msg
    )
    assert "before 'tests.support.shadow_app'" in messages[0].hint

    with override_settings(INSTALLED_APPS=[*installed, "tests.support.shadow_app"]):
        assert our_messages() == []


def test_the_shadowing_runworker_is_the_one_that_runs():
    done = manage(
        "runworker", "--skip-checks", "--settings", "tests.support.settings_misconfigured"
    )
    assert "the shadowing app's runworker ran" in done.stderr
