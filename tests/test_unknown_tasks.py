"""A job of a task the worker does not know (the worker started before the task was
added, or a deploy reached the web servers first): it waits, given back, for a worker
that knows the task, uncounted, for a bounded time; then it fails saying what to do."""

import logging
from unittest import mock

import pytest

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.core.registry import registry
from django_redisqueue.runtime.scheduler import Scheduler
from django_redisqueue.runtime.unknown_tasks import (
    UNKNOWN_TASK_RETRY_MS,
    UNKNOWN_TASK_WAIT_MS,
    waited_ms,
)
from tests.conftest import run_worker_here
from tests.support import tasks
from tests.support.entries import as_hash
from tests.support.keys import DEFAULT_KEYS as K


def an_older_worker_runs(backend, caplog):
    """A burst worker to which tests.support.tasks.add is unknown, as to one that started
    before the task was added; returns what it logged."""
    known = registry.get

    def get(path):
        return None if path == "tests.support.tasks.add" else known(path)

    caplog.clear()
    with mock.patch.object(registry, "get", get), caplog.at_level(logging.WARNING):
        run_worker_here(backend)
    return caplog.text


def make_due(r, backend, job_id):
    r.zadd(K.delayed("default"), {job_id: 0}, xx=True)
    Scheduler(backend, burst=True).run()


def test_a_worker_that_does_not_know_the_task_gives_the_job_back_for_one_that_does(
    r, backend, caplog
):
    job = tasks.add.enqueue(2, 3)
    said = an_older_worker_runs(backend, caplog)
    assert "'tests.support.tasks.add' is not registered in worker" in said
    assert "runworker --reload" in said and "restart the workers" in said
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.READY and stored.attempts == 0
    assert stored.errors == []
    due = r.zscore(K.delayed("default"), job.id)
    assert due is not None
    assert due - backend.broker.clock_ms() <= UNKNOWN_TASK_RETRY_MS[0]  # waited ~0 ms

    make_due(r, backend, job.id)
    run_worker_here(backend)  # a worker that knows it
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL and stored.return_value == 5
    assert stored.attempts == 1


def test_the_job_is_given_back_for_longer_each_time(r, backend, caplog):
    job = tasks.add.enqueue(2, 3)
    r.hset(as_hash(r, K, job.id), "enqueued_at", backend.broker.clock_ms() - 20_000)
    an_older_worker_runs(backend, caplog)
    due = r.zscore(K.delayed("default"), job.id) - backend.broker.clock_ms()
    assert 15_000 < due <= 20_000 + 1_000  # as long as it has waited, 20 s


def test_past_its_wait_the_job_fails_saying_what_to_do(r, backend, caplog):
    job = tasks.add.enqueue(2, 3)
    r.hset(as_hash(r, K, job.id), "enqueued_at", backend.broker.clock_ms() - UNKNOWN_TASK_WAIT_MS)
    an_older_worker_runs(backend, caplog)
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.FAILED
    error = stored.errors[-1]
    assert error.exception_class_path.endswith("UnknownTask")
    assert "restart the workers" in error.traceback and "--reload" in error.traceback


@pytest.mark.parametrize(
    ("fields", "run_after", "waited"),
    [
        ({"enqueued_at": "1000", "last_attempted_at": "4000"}, None, 3000),
        ({"enqueued_at": "1000", "last_attempted_at": "4000"}, 2.5, 1500),  # due at 2.5 s
        ({"enqueued_at": "junk", "last_attempted_at": "4000"}, None, 4000),
        ({"enqueued_at": "5000", "last_attempted_at": "4000"}, None, 0),
        ({}, float("nan"), 0),
    ],
)
def test_how_long_a_job_has_waited_reads_redis_s_clock_leniently(fields, run_after, waited):
    assert waited_ms(fields, run_after) == waited
