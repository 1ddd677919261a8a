"""An outbox that cannot be read (its table missing, its database down): found by
``check --database`` without stopping ``migrate``, said by ``runscheduler``, which goes
on with its other work, and loud in the metrics."""

import os

import pytest
from django.core import checks

from tests.conftest import manage, not_on_cluster
from tests.outboxes import outbox_table_gone

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
