"""Django's connections around each job, as around a request: a connection left broken
between two jobs (here by a task_finished receiver of the first, which runs once the
claim that brings the second has stored the first's outcome) is closed before the
second job runs, which then connects again."""

import psycopg
import pytest
from django.db import OperationalError, connections

from django_redisqueue import task
from django_redisqueue.compat import TaskResultStatus, task_finished
from django_redisqueue.runtime.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgresql"])


@task
def select_one(label):
    with connections["postgresql"].cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


def drop_own_connection() -> None:
    """The server drops this thread's connection (a restart, a failover, an idle
    connection killer), and a query finds out."""
    connection = connections["postgresql"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings.get("PASSWORD") or None,
        dbname=settings["NAME"],
        autocommit=True,
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_a_connection_broken_between_two_jobs_is_not_handed_to_the_second(backend):
    first = select_one.enqueue("first")
    second = select_one.enqueue("second")
    met = []

    def on_finished(sender, task_result, **kwargs):
        if not met:
            met.append(task_result.id)
            drop_own_connection()

    task_finished.connect(on_finished, weak=False)
    try:
        Worker(backend, burst=True).run()
    finally:
        task_finished.disconnect(on_finished)
    assert met == [first.id]
    result = backend.get_result(second.id)
    assert result.status == TaskResultStatus.SUCCESSFUL, [e.traceback for e in result.errors]
