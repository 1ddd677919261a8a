"""``enqueue_on_commit`` and the ENQUEUE_ON_COMMIT option, with real transactions on
the test database (a sqlite file the workers share) and ``runworker --burst``."""

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_redisqueue import RedisTaskResult
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_enqueued
from django_redisqueue.exceptions import BrokerUnavailable
from django_redisqueue.store.gateway import now_ms
from tests.conftest import manage, wait_until
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS
from tests.support.models import Report
from tests.support.servers import free_port
from tests.support.topology import keys_server, scripts_run

pytestmark = pytest.mark.django_db(transaction=True)


def queued_ids(r, queue="default"):
    return r.zrange(DEFAULT_KEYS.queue(queue), 0, -1)


@pytest.fixture
def enqueued():
    """The ids task_enqueued is sent for in this process, in order."""
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    yield seen
    task_enqueued.disconnect(receiver)


def test_the_job_is_queued_when_the_transaction_commits_with_the_id_handed_back(
    r, backend, enqueued
):
    with transaction.atomic():
        report = Report.objects.create(title="Q3 figures")
        result = tasks.report_title.enqueue_on_commit(report.pk)

        assert isinstance(result, RedisTaskResult)
        assert result.status == TaskResultStatus.READY
        assert result.enqueued_at is None
        assert queued_ids(r) == []
        assert enqueued == []
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result.id)

    assert queued_ids(r) == [result.id]
    assert enqueued == [result.id]
    assert result.enqueued_at is not None
    done = manage("runworker", "--burst")
    assert done.returncode == 0, done.stderr
    assert result.wait(timeout=5) == "Q3 figures"  # the worker found the committed row


def test_nothing_is_queued_when_the_transaction_rolls_back(r, backend, enqueued):
    with pytest.raises(RuntimeError), transaction.atomic():
        report = Report.objects.create(title="never")
        result = tasks.report_title.enqueue_on_commit(report.pk)
        raise RuntimeError("roll back")

    assert r.keys(DEFAULT_KEYS.prefix + "*") == []
    assert enqueued == []
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()


def test_outside_a_transaction_the_job_is_queued_at_once(r, enqueued):
    result = tasks.add.enqueue_on_commit(1, 2)
    assert queued_ids(r) == [result.id]
    assert enqueued == [result.id]
    assert result.enqueued_at is not None


def test_bad_arguments_raise_at_the_call_site_and_queue_nothing(r):
    with transaction.atomic():
        with pytest.raises(TypeError, match=r"Argument 0 of tests\.support\.tasks\.add"):
            tasks.add.enqueue_on_commit(object(), 2)
        with pytest.raises(ValueError, match="MAX_PAYLOAD_BYTES"):
            tasks.record.enqueue_on_commit("x" * (600 * 1024))
    assert r.keys(DEFAULT_KEYS.prefix + "*") == []


def test_a_delayed_job_waits_for_the_commit_then_for_its_time(r):
    with transaction.atomic():
        result = tasks.add.using(delay=0.5).enqueue_on_commit(2, 2)
        assert r.zcard(DEFAULT_KEYS.delayed("default")) == 0

    due = r.zscore(DEFAULT_KEYS.delayed("default"), result.id)
    assert due == pytest.approx(result.task.run_after.timestamp() * 1000, abs=1)
    wait_until(lambda: now_ms() >= due, 10, "the due time")
    assert manage("runscheduler", "--burst").returncode == 0
    assert manage("runworker", "--burst").returncode == 0
    assert result.wait(timeout=5) == 4
    assert result.started_at >= result.task.run_after


def test_the_enqueue_on_commit_option_makes_enqueue_wait(r, enqueued):
    options = {**settings.TASKS["default"]["OPTIONS"], "ENQUEUE_ON_COMMIT": True}
    conf = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": options,
    }
    with override_settings(TASKS={"default": conf}):
        with transaction.atomic():
            result = tasks.add.enqueue(3, 4)
            assert queued_ids(r) == []
            assert result.enqueued_at is None
        assert queued_ids(r) == [result.id]
        assert enqueued == [result.id]
        assert manage("runworker", "--burst").returncode == 0
        assert result.wait(timeout=5) == 7


def test_redis_down_at_the_commit_raises_after_the_commit(r):
    dead = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    conf = {"BACKEND": "django_redisqueue.backend.RedisQueueBackend", "OPTIONS": dead}
    with (
        override_settings(TASKS={"default": conf}),
        pytest.raises(BrokerUnavailable),
        transaction.atomic(),
    ):
        report = Report.objects.create(title="kept")
        tasks.report_title.enqueue_on_commit(report.pk)
    assert Report.objects.filter(title="kept").exists()


def test_the_jobs_of_one_transaction_are_sent_in_one_call_at_the_commit(r, enqueued):
    keys_server(r).config_resetstat()
    with transaction.atomic():
        results = [tasks.add.enqueue_on_commit(i, 1) for i in range(10)]
        results += tasks.add.enqueue_many([((i, 2), {}) for i in range(3)])  # with the option off
        assert scripts_run(r) == 1  # enqueue_many did not wait: ENQUEUE_ON_COMMIT is off
        assert len(queued_ids(r)) == 3

    assert scripts_run(r) == 2
    assert queued_ids(r) == [result.id for result in results[10:] + results[:10]]
    assert enqueued == [result.id for result in results[10:] + results[:10]]


def test_a_rolled_back_savepoint_drops_its_jobs_from_the_batch(r):
    with transaction.atomic():
        before = tasks.noop.enqueue_on_commit()
        with pytest.raises(RuntimeError), transaction.atomic():
            dropped = tasks.noop.enqueue_on_commit()
            raise RuntimeError("rolled back")
        after = tasks.noop.enqueue_on_commit()
    assert queued_ids(r) == [before.id, after.id]
    assert dropped.id not in queued_ids(r)


def test_other_on_commit_callbacks_keep_their_place_between_jobs(r):
    seen = []
    with transaction.atomic():
        first = tasks.noop.enqueue_on_commit()
        transaction.on_commit(lambda: seen.append(list(queued_ids(r))))
        second = tasks.noop.enqueue_on_commit()
    assert seen == [[first.id]]
    assert queued_ids(r) == [first.id, second.id]
