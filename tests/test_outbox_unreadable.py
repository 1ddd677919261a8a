"""An outbox that cannot be read (its table missing, its database down): found by
``check --database`` without stopping ``migrate``, said by ``runscheduler``, which goes
on with its other work, and loud in the metrics."""

import dataclasses
import logging
import math
import os
from unittest import mock

import pytest
from django.core import checks
from django.db import DatabaseError, OperationalError, transaction

from django_redisqueue.backends import outbox
from django_redisqueue.compat import task_backends
from django_redisqueue.models import OutboxJob
from django_redisqueue.runtime import outbox_watch
from django_redisqueue.runtime.outbox_watch import OTHER_WORK as OTHER
from django_redisqueue.runtime.outbox_watch import OutboxWatch
from tests.conftest import manage, not_on_cluster, wait_until
from tests.support import tasks
from tests.support.outboxes import outbox_table_gone
from tests.test_metrics import samples

DATABASES = ["default", "postgresql", "mariadb"]
MIGRATE = "python manage.py migrate django_redisqueue --database default"

pytestmark = not_on_cluster


@pytest.fixture
def empty_database(tmp_path, monkeypatch) -> None:
    """The processes this test starts use a new SQLite database, with no table yet."""
    name = f"REDISQUEUE_TEST_DB_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    monkeypatch.setenv(name, str(tmp_path / "new.sqlite3"))


def findings(databases):
    """This app's findings among the database checks (``check --database``)."""
    found = checks.run_checks(tags=[checks.Tags.database], databases=databases)
    return [m for m in found if m.id.startswith("django_redisqueue.")]


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.usefixtures("outbox_backends")
@pytest.mark.parametrize("database", DATABASES)
def test_check_database_finds_an_outbox_without_its_table(database):
    assert findings([database]) == []
    with outbox_table_gone(database):
        found = findings([database])
        assert findings(None) == []  # plain `check` reads no database
    assert [m.id for m in found] == ["django_redisqueue.W005"]
    assert found[0].level == checks.WARNING  # migrate runs it too, and must not stop
    assert f"Database {database!r} has no outbox table" in found[0].msg
    assert f"TASKS['outbox-{database}']" in found[0].msg
    assert f"`python manage.py migrate django_redisqueue --database {database}`" in found[0].hint
    assert findings([database]) == []


def test_check_and_migrate_where_the_outbox_migration_is_not_applied(empty_database):
    assert manage("migrate", "django_redisqueue", "0001").returncode == 0  # before the outbox
    found = manage("check", "--database", "default")
    assert found.returncode == 0, found.stderr
    assert "(django_redisqueue.W005) Database 'default' has no outbox table" in found.stderr
    assert MIGRATE in found.stderr
    assert "W005" not in manage("check").stderr
    migrated = manage("migrate", "django_redisqueue")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying django_redisqueue.0002_outbox... OK" in migrated.stdout
    assert "W005" not in manage("check", "--database", "default").stderr


def test_a_scheduler_without_the_outbox_table_promotes_and_says_why_once(empty_database, procs):
    backend = task_backends["outbox-default"]
    scheduler = procs.start("runscheduler", "--backend", backend.alias)
    first = tasks.add.using(backend=backend.alias, delay=1).enqueue(1, 1)
    wait_until(lambda: backend.queries.queue_length("default") == 1, 30, "the promotion")
    # A promotion 3 s later: the relay has been tried at least twice more meanwhile.
    tasks.add.using(backend=backend.alias, delay=3).enqueue(2, 2)
    wait_until(lambda: backend.queries.queue_length("default") == 2, 30, "the promotion")
    assert backend.get_result(first.id).status == "READY"
    log = scheduler.output
    assert log.count("the outbox's table is missing from database 'default'") == 1, log
    assert f"run `{MIGRATE}`" in log

    migrated = manage("migrate", "django_redisqueue")
    assert migrated.returncode == 0, migrated.stderr
    procs.expect(scheduler, "the outbox can be read again")
    assert "Traceback" not in procs.stop(scheduler)
    assert scheduler.returncode == 0


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.usefixtures("outbox_backends")
@pytest.mark.parametrize("database", DATABASES)
def test_an_outbox_that_cannot_be_read_is_loud_in_the_metrics(client, database):
    """A threshold alert on the oldest job's age fires: +Inf, not silence."""
    at = frozenset({"backend": f"outbox-{database}"}.items())
    with outbox_table_gone(database):
        found = samples(client.get("/metrics").content.decode())
    assert found["redisqueue_outbox_readable", at] == 0
    assert found["redisqueue_outbox_oldest_seconds", at] == math.inf
    assert ("redisqueue_outbox_jobs", at) not in found  # unknown, not 0
    assert found["redisqueue_up", at] == 1  # Redis answered

    found = samples(client.get("/metrics").content.decode())
    assert found["redisqueue_outbox_readable", at] == 1
    assert found["redisqueue_outbox_oldest_seconds", at] == 0
    assert found["redisqueue_outbox_jobs", at] == 0


@pytest.mark.django_db
def test_a_scheduler_says_again_while_the_outbox_cannot_be_read_and_when_it_can(caplog):
    caplog.set_level(logging.INFO)
    clock = [1000.0]
    watch = OutboxWatch(logging.getLogger("tests"), "Scheduler s", ["default"])
    with mock.patch.object(outbox_watch.time, "monotonic", lambda: clock[0]):
        for _ in range(3):
            watch.failed(OperationalError("server closed the connection"))
            clock[0] += outbox_watch.REMIND_EVERY / 2
        watch.succeeded()
        watch.succeeded()
        watch.failed(OperationalError("server closed the connection"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            f"Scheduler s: the outbox cannot be read: server closed the connection; {OTHER}",
        ),
        (
            "WARNING",
            "Scheduler s: the outbox cannot be read (for 300 s): server closed the connection; "
            f"{OTHER}",
        ),
        ("INFO", "Scheduler s: the outbox can be read again (after 450 s); relaying its jobs"),
        (
            "WARNING",
            f"Scheduler s: the outbox cannot be read: server closed the connection; {OTHER}",
        ),
    ]


@pytest.fixture
def broken_database():
    """A database Django cannot even load (its ENGINE's driver missing): its alias
    raises ImproperlyConfigured, as Django's own connection handler does."""
    from django.db import connections

    connections.settings["broken"] = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.no_such_driver",
    }
    try:
        yield "broken"
    finally:
        del connections.settings["broken"]


@pytest.mark.django_db
def test_an_outbox_database_django_cannot_load_is_said_and_the_scheduler_goes_on(
    broken_database, caplog
):
    from django_redisqueue.runtime.scheduler import Scheduler

    backend = task_backends["outbox-default"]
    config = dataclasses.replace(backend.config, outbox=(broken_database,))
    with mock.patch.object(backend, "config", config):
        scheduler = Scheduler(backend, burst=True)
        assert scheduler._relay_step(backend.broker.clock_ms()) == 0
    [said] = [r.getMessage() for r in caplog.records if "outbox cannot be read" in r.getMessage()]
    assert "no_such_driver" in said


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.usefixtures("outbox_backends")
def test_an_outbox_that_cannot_be_read_leaves_the_others_relayed():
    """OUTBOX names two databases; one loses its table: the other's rows still reach
    Redis, and the error is raised after them, for the scheduler to say."""
    from tests.support.outboxes import waiting

    backend = task_backends["outbox-default"]
    config = dataclasses.replace(backend.config, outbox=("postgresql", "default"))
    with transaction.atomic(using="default"):
        outbox.write("default", backend.alias, [waiting("e" * 26, 1)])
    with (
        mock.patch.object(backend, "config", config),
        outbox_table_gone("postgresql"),
        pytest.raises(DatabaseError),
    ):
        backend.outbox.relay_left(settle=0)
    assert not OutboxJob.objects.using("default").exists()
    assert backend.queries.get_job("e" * 26) is not None
