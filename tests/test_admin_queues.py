"""The dashboard with QUEUES empty: queue names read back from Redis that break the
queue-name rule are skipped by every reader."""

import os

import pytest
from django.test import Client

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.worker import Worker
from tests import tasks
from tests.conftest import run_worker_here
from tests.topology import make_client

pytestmark = pytest.mark.django_db

ANY = "/admin/django_redisqueue/dashboard/anyqueue/"
# Members of the known queues that no enqueue writes: by hand, an older version, a bug.
NOT_QUEUE_NAMES = [
    b"a/b",
    b"",
    b"x" * 500,
    b"\xff\xfe",
    b"with space",
    b"good\n",
    "caf\u00e9".encode(),
    b"<script>alert(1)</script>",
]


def raw_client():
    """A client of the test's Redis that reads and writes bytes, not text."""
    return make_client(os.environ["REDISQUEUE_TEST_URL"])


def test_names_in_the_known_queues_that_are_no_queue_names_are_skipped(manager):
    backend = task_backends["anyqueue"]
    job = tasks.add.using(backend="anyqueue", queue_name="good").enqueue(1, 2)
    raw_client().sadd(backend.keys.known_queues, *NOT_QUEUE_NAMES)

    assert backend.served_queues() == ["good"]
    pages = [
        "",
        "?partial=1",
        "queue/good/",
        "delayed/",
        "delayed/good/",
        "failed/",
        "failed/good/",
        "running/",
        f"job/{job.id}/",
        "groups/",
        "broadcasts/",
        "schedules/",
        "confirm/empty/?queue=good",
    ]
    for page in pages:
        response = manager.get(ANY + page, follow=True)
        assert response.status_code == 200, page
        assert "/queue/good/" in response.text, page
        assert "with space" not in response.text and "<script>alert" not in response.text, page
    # A name that breaks the rule is no queue of the dashboard's, even if Redis holds it.
    for name in ("with%20space", "caf%C3%A9", "x" * 500):
        assert manager.get(ANY + f"queue/{name}/").status_code == 404, name

    metrics = Client().get("/metrics")
    assert metrics.status_code == 200
    assert 'backend="anyqueue",queue="good"' in metrics.text
    assert 'queue="with space"' not in metrics.text and 'queue="a/b"' not in metrics.text

    # A worker given no queue discovers the valid ones only, and serves them.
    worker = Worker(backend, burst=True)
    worker._refresh_queues()
    assert worker.queues == ["good"]
    run_worker_here(backend)
    assert backend.get_result(job.id).status == TaskResultStatus.SUCCESSFUL
