"""Stopping a running job (``result.stop()``, the dashboard's Abort): its worker learns
it within a second, whatever runs the task (the main thread, a slot's thread, the event
loop, a pool's child), stops it through its stop token, and the job ends FAILED with
``JobStopped``, never retried; a task that does not let go is given up; a job whose
worker died with the stop pending is not run again; a job that ended first is left as
it was, and one that has not started is refused."""

import signal

import pytest

from django_redisqueue import TaskFailed
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus
from django_redisqueue.exceptions import NotStoppable
from tests.conftest import run_worker_here, wait_until
from tests.support import tasks
from tests.test_admin import BASE

STOPPED = "django_redisqueue.exceptions.JobStopped"


def log(r):
    return r.lrange(tasks.LOG, 0, -1)


def ended_stopped(job) -> None:
    """The job ended FAILED with one JobStopped error, after one attempt."""
    with pytest.raises(TaskFailed):
        job.wait(timeout=30)
    assert [error.exception_class_path for error in job.errors] == [STOPPED]
    assert job.status == TaskResultStatus.FAILED and job.attempts == 1


@pytest.mark.parametrize(
    ("task", "options"),
    [
        (tasks.runs_until_stopped, ()),
        (tasks.runs_until_stopped, ("--threads", "2")),
        (tasks.runs_until_stopped_async, ("--threads", "2")),
        (tasks.runs_until_stopped, ("--concurrency", "2")),
    ],
    ids=["main thread", "slot thread", "event loop", "pool child"],
)
def test_a_running_job_is_stopped_from_another_process_and_not_retried(r, procs, task, options):
    job = task.enqueue(60)
    procs.start("runworker", *options)
    wait_until(lambda: "running:1" in log(r), 30, "the job's start")
    assert job.stop() is True
    ended_stopped(job)  # its retries=3 not used
    assert "running:2" not in log(r)
    assert job.stop() is False  # it has ended: nothing changes
    assert job.status == TaskResultStatus.FAILED


def test_a_task_blocked_in_c_is_given_up_after_a_grace(r, procs):
    job = tasks.blocked_in_c.using(backend="leased").enqueue(60)
    worker = procs.start("runworker", "--backend", "leased", "--threads", "2")
    wait_until(lambda: "running:1" in log(r), 30, "the job's start")
    assert job.stop() is True
    ended_stopped(job)
    procs.expect(worker, "its thread has not let go")  # given up: the process recycles


def test_a_job_whose_worker_died_with_the_stop_pending_does_not_run_again(r, procs):
    job = tasks.runs_until_stopped.using(backend="leased").enqueue(60)
    worker = procs.start("runworker", "--backend", "leased")
    wait_until(lambda: "running:1" in log(r), 30, "the job's start")
    worker.send_signal(signal.SIGSTOP)  # frozen: it cannot take the stop
    assert job.stop() is True
    procs.kill(worker)
    procs.start("runscheduler", "--backend", "leased")  # recovers it once its lease ran out
    procs.start("runworker", "--backend", "leased")
    ended_stopped(job)
    assert "running:2" not in log(r)


def test_stopping_a_job_that_has_not_started_is_refused(r, backend):
    job = tasks.add.enqueue(1, 2)
    with pytest.raises(NotStoppable, match="cancel"):
        job.stop()
    assert job.status == TaskResultStatus.READY
    with pytest.raises(TaskResultDoesNotExist):
        backend.stop("0" * 26)


def test_a_job_that_finished_first_is_left_as_it_was(r, backend):
    job = tasks.add.enqueue(1, 2)
    run_worker_here(backend)
    assert job.stop() is False
    assert job.status == TaskResultStatus.SUCCESSFUL and job.return_value == 3


def test_the_outcome_of_an_attempt_asked_to_stop_is_never_a_retry(r, backend):
    """Whatever its worker sends (a retry, a give-back), Redis ends the job FAILED."""
    from django_redisqueue.store.wire import RELEASE, RETRY, Outcome

    broker = backend.broker
    jobs = [tasks.add.enqueue(n, n) for n in range(2)]
    for status in (RETRY, RELEASE):
        _, claimed = broker.claim(["default"], "w1", None, broadcasts=False)
        assert backend.stop(claimed.job_id) is True
        assert broker.finish(Outcome(claimed.job_id, claimed.owner, status, retry_in_ms=0))
    for job in jobs:
        job.refresh()
        assert job.status == TaskResultStatus.FAILED
        assert job.errors[-1].exception_class_path == STOPPED


@pytest.mark.django_db
def test_the_job_page_aborts_a_running_job_after_a_confirm(r, manager, backend):
    job = tasks.add.enqueue(1, 2)
    backend.broker.claim(["default"], "w1", None, broadcasts=False)
    page = manager.get(BASE + f"job/{job.id}/").text
    assert "Abort</a>" in page
    confirm = BASE + f"confirm/stop/?queue=default&job_id={job.id}"
    assert manager.get(confirm).status_code == 200
    done = manager.post(
        BASE + "act/stop/", {"queue": "default", "job_id": job.id, "confirmed": "yes"}, follow=True
    )
    assert "aborted: its worker stops it within a second" in done.text
    assert r.lrange(backend.keys.stops("w1"), 0, -1) == [job.id]
