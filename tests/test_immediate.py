"""Immediate mode for tests: ``django_redisqueue.immediate.ImmediateBackend`` runs each
job as it is enqueued, with no Redis and no worker, whatever DEBUG says."""

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.test import override_settings

from django_redisqueue import RedisTaskResult, TaskFailed
from django_redisqueue.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from django_redisqueue.exceptions import NotCancellable
from tests.support import tasks

IMMEDIATE = {
    "default": {
        "BACKEND": "django_redisqueue.immediate.ImmediateBackend",
        "QUEUES": ["high", "default", "low"],
    }
}


@pytest.fixture(autouse=True)
def immediate():
    with override_settings(TASKS=IMMEDIATE):
        yield task_backends["default"]


@pytest.mark.parametrize("debug", [False, True])
def test_jobs_run_as_they_are_enqueued_whatever_debug_says(r, debug):
    with override_settings(DEBUG=debug):
        result = tasks.add.enqueue(2, 3)
        coroutine = async_to_sync(tasks.meaning_of_life_async.aenqueue)()
    assert isinstance(result, RedisTaskResult)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.wait(timeout=0) == 5
    assert coroutine.return_value == 42
    assert r.keys("*") == []  # Redis was never used


def test_results_can_be_fetched_and_refreshed(immediate):
    result = tasks.add.enqueue(1, 1)
    assert tasks.add.get_result(result.id) is result
    result.refresh()
    assert result.return_value == 2
    with pytest.raises(TaskResultDoesNotExist):
        immediate.get_result("no-such-job")


def test_failures_context_and_delays():
    failed = tasks.fail.enqueue("boom")
    assert failed.status == TaskResultStatus.FAILED
    with pytest.raises(TaskFailed, match="ValueError: boom"):
        failed.wait()
    with pytest.raises(NotCancellable):
        failed.cancel()
    assert tasks.attempt_number.enqueue("x").return_value["attempt"] == 1
    # Accepted, so that code that delays jobs runs; the job still runs now.
    assert tasks.add.using(delay=3600).enqueue(1, 2).return_value == 3
    assert tasks.urgent.using(priority=-100).enqueue("high").status == "SUCCESSFUL"


def test_arguments_are_checked_as_the_redis_backend_checks_them():
    with pytest.raises(TypeError, match="object keys must be strings"):
        tasks.add.enqueue({1: "x"}, 2)
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
        tasks.add.using(queue_name="elsewhere")


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_runs_the_job_once_committed():
    with transaction.atomic():
        result = tasks.add.enqueue_on_commit(20, 22)
        assert result.status == TaskResultStatus.READY
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42

    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.add.enqueue_on_commit(1, 1)
        raise RuntimeError
    assert rolled_back.status == TaskResultStatus.READY
    with pytest.raises(TaskResultDoesNotExist):
        rolled_back.refresh()


def test_unique_and_limited_tasks_run_at_once_each_time(r):
    first = tasks.unique_report.enqueue("monday")
    again = tasks.unique_report.enqueue("monday")
    assert first.id != again.id and again.return_value == "monday"
    assert tasks.rate_limited.enqueue("a").status == TaskResultStatus.SUCCESSFUL
    assert r.keys("{drq*") == []
