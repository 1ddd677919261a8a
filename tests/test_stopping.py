"""The stop token: how a running task is stopped from outside its own code (a lost
lease, a time limit, a second SIGTERM)."""

import signal
import threading
import time

import pytest

from django_redisqueue.exceptions import JobTimeout, LeaseLost, WorkerShutdown
from django_redisqueue.runtime import alarms
from django_redisqueue.runtime.alarms import time_limit
from django_redisqueue.runtime.stopping import STOP_SIGNAL, StopToken
from tests.conftest import run_worker_here, wait_until
from tests.support import tasks


@pytest.fixture
def token():
    token = StopToken()
    previous = signal.signal(STOP_SIGNAL, lambda signum, frame: token.deliver())
    yield token
    signal.signal(STOP_SIGNAL, previous)


def test_a_stop_from_another_thread_ends_the_tasks_blocking_sleep(token):
    def stop_once_running():
        wait_until(lambda: token.is_running, 10, "the task to run")
        assert token.stop(LeaseLost("gone"))

    stopper = threading.Thread(target=stop_once_running)
    stopper.start()
    with pytest.raises(LeaseLost, match="gone"), token.running():
        time.sleep(60)  # ended by the signal, not sat out
    stopper.join()
    assert not token.is_running


def test_the_first_reason_wins_and_a_stop_from_the_tasks_thread_raises_at_once(token):
    with pytest.raises(WorkerShutdown), token.running():
        token.stop(WorkerShutdown())
    assert not token.stop(LeaseLost("later"))
    assert isinstance(token.reason, WorkerShutdown)


def test_a_token_stopped_before_its_task_runs_stops_it_as_it_begins(token):
    assert token.stop(LeaseLost("before"))
    ran = []
    with pytest.raises(LeaseLost), token.running():
        ran.append(1)
    assert ran == []


def test_a_stop_after_the_task_ended_raises_nothing(token):
    with token.running():
        pass
    assert token.stop(LeaseLost("late"))  # recorded, nothing to interrupt
    token.deliver()  # a signal arriving late is ignored


def test_the_time_limit_stops_the_task_through_its_token(token):
    with (
        pytest.raises(JobTimeout, match="ran past its timeout"),
        token.running(),
        time_limit(0.05, "tests.slow", token),
    ):
        time.sleep(60)
    assert isinstance(token.reason, JobTimeout)


def run_in_a_thread(body):
    """Run ``body`` on a thread of its own; return what it raised (None if nothing)."""
    raised = []

    def target():
        try:
            body()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, raised


def busy(seconds):
    """Python code that runs for ``seconds`` (a stop lands at its next bytecode)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_task_on_another_thread_is_stopped_with_the_reasons_class():
    token = StopToken()

    def task():
        with token.running():
            busy(60)

    thread, raised = run_in_a_thread(task)
    wait_until(lambda: token.is_running, 10, "the task to run")
    assert token.stop(LeaseLost("gone"))
    thread.join(30)
    assert not thread.is_alive()
    [exc] = raised
    assert isinstance(exc, LeaseLost)
    assert token.reason is not None and str(token.reason) == "gone"


def test_the_time_limit_stops_a_task_on_another_thread_by_the_time_limit_thread():
    token = StopToken()

    def task():
        with token.running(), time_limit(0.05, "tests.slow", token):
            busy(60)

    thread, raised = run_in_a_thread(task)
    thread.join(30)
    assert not thread.is_alive()
    [exc] = raised
    assert isinstance(exc, JobTimeout)
    assert "ran past its timeout" in str(token.reason)


@pytest.mark.pure
def test_time_limits_off_the_main_thread_share_one_thread_and_drop_what_is_cancelled(caplog):
    """Each in turn, never early, none of those cancelled, whatever one before them
    raised; many cancelled limits do not pile up (a job that ends well inside its
    limit, thousands of times)."""
    deadlines, called = alarms._Deadlines(), []
    before, added_at = set(threading.enumerate()), time.monotonic()
    for n, seconds in enumerate([0.3, 0.1, 0.2, 0.15]):
        number = deadlines.add(seconds, lambda n=n, s=seconds: called.append((n, s)))
        if n == 3:
            deadlines.cancel(number)
    deadlines.add(0.05, lambda: 1 / 0)  # a stop that fails stops none of the others
    wait_until(lambda: len(called) == 3, 10, "the three limits left")
    assert time.monotonic() - added_at >= 0.3
    assert called == [(1, 0.1), (2, 0.2), (0, 0.3)]
    assert "A time limit's stop failed" in caplog.text
    for _ in range(5000):
        deadlines.cancel(deadlines.add(600, lambda: called.append("too soon")))
    assert len(deadlines._heap) <= 2 * 64 + 1 and called[3:] == []
    started = [t for t in set(threading.enumerate()) - before if t.name.startswith("redis")]
    assert started == [deadlines._thread]  # one thread for them all


def test_a_worker_off_the_main_thread_keeps_its_jobs_time_limits(r, backend):
    """A worker run on a thread of the caller's (no signals there) still stops a task
    past its timeout, with the time limit's message."""
    from django_redisqueue.core.jobs import FAILED

    job = tasks.overruns_in_steps.enqueue(30)
    thread = threading.Thread(target=run_worker_here, args=(backend,))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    stored = backend.get_result(job.id)
    assert stored.status == FAILED
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback


def test_a_task_on_another_thread_takes_its_stop_once_and_its_finally_blocks_run_out():
    """As on the main thread: the task's clean-up (a finally block, an except that
    cleans up) runs to its end, not cut short by the same stop raised again."""
    token = StopToken()
    cleaned = []

    def task():
        with token.running():
            try:
                busy(60)
            finally:
                for step in range(10):  # Python steps, for longer than a raise again
                    busy(0.02)
                    cleaned.append(step)

    thread, raised = run_in_a_thread(task)
    wait_until(lambda: token.is_running, 10, "the task to run")
    assert token.stop(JobTimeout("too long"))
    thread.join(30)
    assert not thread.is_alive()
    assert cleaned == list(range(10))
    [exc] = raised
    assert isinstance(exc, JobTimeout)
