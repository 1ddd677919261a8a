"""django_redisqueue.testing: the jobs a test enqueued run in the test, through Redis,
delayed ones and retries included, with no wall-clock wait; on the test's database."""

from __future__ import annotations

import io
import sys
import time
import warnings
from datetime import timedelta

import pytest
from django.test import TestCase, override_settings

from django_redisqueue import chain, group, task
from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.testing import JobsStillDue, LiveWorkersWarning, RunJobsMixin, run_jobs
from tests.support.models import Report
from tests.support.topology import ON_CLUSTER

pytest_plugins = ["pytester"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(ON_CLUSTER, reason="one worker in the test's process is enough"),
]

# Attempts per label, for the tasks that fail before they succeed.
ATTEMPTS: dict[str, int] = {}


@task
def double(x: int) -> int:
    return 2 * x


@task
def total(values: list[int], extra: int) -> int:
    return sum(values) + extra


@task(retries=2, retry_backoff=300, retry_jitter=False)
def flaky(label: str) -> str:
    """Fails twice, then succeeds: with 5 and 10 minutes of backoff between."""
    ATTEMPTS[label] = ATTEMPTS.get(label, 0) + 1
    if ATTEMPTS[label] < 3:
        raise ConnectionError(f"attempt {ATTEMPTS[label]}")
    return f"{label} after {ATTEMPTS[label]} attempts"


@task(retries=1000, retry_backoff=1, retry_jitter=False)
def never_works() -> None:
    raise ConnectionError("never")


@task
def file_report(title: str) -> int:
    return Report.objects.create(title=title).pk


def timed(function, *args, **kwargs):
    started = time.monotonic()
    value = function(*args, **kwargs)
    return value, time.monotonic() - started


def test_a_delayed_job_runs_at_once(report):
    result = double.using(delay=timedelta(hours=2)).enqueue(21)
    ran, took = timed(run_jobs)
    assert [r.id for r in ran] == [result.id]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    report(f"run_jobs, a job delayed by 2 hours: {took:.3f} s")


def test_a_job_beyond_the_horizon_stays_delayed():
    result = double.using(delay=timedelta(days=2)).enqueue(1)
    assert run_jobs() == []
    assert run_jobs(horizon=timedelta(days=3))[0].id == result.id


def test_retries_with_minutes_of_backoff_run_without_waiting(report):
    result = flaky.enqueue("retried")
    ran, took = timed(run_jobs)
    assert [r.status for r in ran] == [
        TaskResultStatus.READY,
        TaskResultStatus.READY,
        TaskResultStatus.SUCCESSFUL,
    ]
    assert [len(r.errors) for r in ran[:2]] == [1, 1]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "retried after 3 attempts"
    report(f"run_jobs, 3 attempts with minutes of backoff: {took:.3f} s")


def test_a_group_and_its_callback(report):
    handle = group([double.job(n) for n in (1, 2, 3)], callback=total.job(100)).enqueue()
    ran, took = timed(run_jobs)
    assert len(ran) == 4
    assert handle.callback is not None
    assert handle.callback.status == TaskResultStatus.SUCCESSFUL
    assert handle.callback.return_value == 112
    report(f"run_jobs, a group of 3 and its callback: {took:.3f} s")


def test_a_chain_runs_step_by_step():
    steps = chain(double.job(1), double.using(delay=timedelta(minutes=5)).job(2)).enqueue()
    ran = run_jobs()
    assert [r.id for r in ran] == [s.id for s in steps]
    for step in steps:
        step.refresh()
        assert step.status == TaskResultStatus.SUCCESSFUL


def test_a_cancelled_delayed_job_does_not_run():
    result = double.using(delay=timedelta(minutes=1)).enqueue(3)
    result.cancel()
    assert run_jobs() == []
    result.refresh()
    assert result.status == TaskResultStatus.FAILED


@task(unique=True)
def rebuild(site_id: int) -> int:
    return site_id


@task(rate_limit="1/h")
def call_partner(order_id: int) -> int:
    return order_id


def test_a_delayed_job_holding_a_unique_key_runs_once_and_lets_the_key_go():
    first = rebuild.using(delay=timedelta(hours=2)).enqueue(3)
    assert rebuild.enqueue(3).id == first.id  # the delayed job holds the key
    assert [r.id for r in run_jobs()] == [first.id]
    again = rebuild.enqueue(3)
    assert again.id != first.id
    assert [r.id for r in run_jobs()] == [again.id]


def test_a_job_over_its_rate_stays_parked_until_its_window_has_room():
    first, second = call_partner.enqueue(1), call_partner.enqueue(2)
    assert [r.id for r in run_jobs()] == [first.id]
    second.refresh()
    assert second.status == TaskResultStatus.READY  # parked: its hour's start is taken
    assert run_jobs() == []


def test_only_the_queues_named(backend):
    low = double.using(queue_name="low").enqueue(1)
    high = double.using(queue_name="high", delay=timedelta(minutes=1)).enqueue(2)
    assert [r.id for r in run_jobs(backend, queues=["high"])] == [high.id]
    assert [r.id for r in run_jobs("default")] == [low.id]


def test_the_rounds_are_bounded():
    never_works.enqueue()
    with pytest.raises(JobsStillDue, match="after 5 rounds"):
        run_jobs(max_rounds=5)


def test_the_immediate_backend_has_nothing_left():
    immediate = {"default": {"BACKEND": "django_redisqueue.immediate.ImmediateBackend"}}
    with override_settings(TASKS=immediate):
        assert double.enqueue(2).return_value == 4
        assert run_jobs() == []


def test_the_pytest_fixture(pytester):
    pytester.makeconftest('pytest_plugins = ["django_redisqueue.pytest_plugin"]')
    pytester.makepyfile(
        """
        from django_redisqueue.testing import run_jobs as the_function

        def test_it(run_jobs):
            assert run_jobs is the_function
        """
    )
    pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:django"
    ).assert_outcomes(passed=1)


class ReportTests(RunJobsMixin, TestCase):
    """A plain TestCase: the job writes in the test's transaction, which stays open."""

    def test_the_job_writes_a_row_the_test_sees(self):
        result = file_report.using(delay=timedelta(minutes=10)).enqueue("monthly")
        ran = self.run_jobs()
        self.assertEqual([r.status for r in ran], [TaskResultStatus.SUCCESSFUL])
        self.assertTrue(Report.objects.filter(pk=ran[0].return_value, title="monthly").exists())
        result.refresh()
        self.assertEqual(result.return_value, ran[0].return_value)


HOWTO_EXAMPLES = ("DelayedJobTests", "RetryTests", "GroupTests")


def test_the_howto_examples_run_and_report_their_time(report):
    """docs/howto/testing.md's examples (tests/test_docs.py runs the whole page): each
    test case, with its minutes and hours of delays and backoff, runs to the end and
    reports its time (a figure, not an assert: a loaded host must not fail it)."""
    import types
    import unittest

    from tests.support.doc_samples import DOCS, blocks
    from tests.test_docs import RUN, source_for_this_django

    name = "docs_sample_howto_testing_timed"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        for block in blocks(DOCS / "howto" / "testing.md"):
            if block.marker == RUN:
                exec(block.compiled(source_for_this_django(block.code)), vars(module))
        for case_name in HOWTO_EXAMPLES:
            suite = unittest.defaultTestLoader.loadTestsFromTestCase(getattr(module, case_name))
            outcome, took = timed(unittest.TextTestRunner(stream=io.StringIO()).run, suite)
            assert outcome.wasSuccessful() and outcome.testsRun == 1, case_name
            report(f"docs/howto/testing.md, {case_name}: {took:.3f} s")
    finally:
        del sys.modules[name]


def a_worker_of_another_process(backend, host: str = "dev-laptop") -> None:
    """Registered as a worker's heartbeat registers it: alive, on ``backend``."""
    info = {"queues": "", "pid": 4242, "host": host, "started_at": 0, "jobs_done": 0}
    backend.broker.heartbeat(f"{host}:4242:ab12", info, {})


def test_live_workers_on_the_backend_are_warned_of(backend):
    a_worker_of_another_process(backend)
    job = double.enqueue(2)
    with pytest.warns(LiveWorkersWarning) as caught:
        ran = run_jobs()
    [warning] = caught
    assert str(warning.message).startswith(
        "run_jobs(): 1 live worker(s) (on dev-laptop) share backend 'default' (Redis "
    )
    assert "key prefix 'drq:default'" in str(warning.message)
    assert "redis://127.0.0.1:6379/15" in str(warning.message)
    assert warning.filename == __file__  # the caller's line
    assert [result.id for result in ran] == [job.id]  # it still runs the jobs


def test_without_live_workers_nothing_is_said(backend):
    ATTEMPTS.clear()
    job = flaky.enqueue("alone")  # three rounds, a worker of run_jobs() in each
    with warnings.catch_warnings():
        warnings.simplefilter("error", LiveWorkersWarning)
        ran = run_jobs()
    assert [result.id for result in ran] == [job.id] * 3


def test_a_worker_whose_heartbeat_stopped_long_ago_is_not_warned_of(r, backend):
    a_worker_of_another_process(backend, "gone")
    r.zadd(backend.keys.workers, {"gone:4242:ab12": 0})  # last heard of in 1970
    with warnings.catch_warnings():
        warnings.simplefilter("error", LiveWorkersWarning)
        assert run_jobs() == []
