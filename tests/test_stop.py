"""Stopping a running job (``result.stop()``, the dashboard's Abort): its worker learns
it within a second, whatever runs the task (the main thread, a slot's thread, the event
loop, a pool's child), stops it through its stop token, and the job ends FAILED with
``JobStopped``, never retried; a task that does not let go is given up; a job whose
worker died with the stop pending is not run again; a job that ended first is left as
it was, and one that has not started is refused."""

import json
import signal
import threading

import pytest

from django_redisqueue import TaskFailed, group
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.core.jobs import FAILED
from django_redisqueue.exceptions import JobStopped, NotStoppable
from django_redisqueue.runtime.stop_requests import StopRequests
from django_redisqueue.runtime.stopping import StopToken
from django_redisqueue.store.wire import Outcome
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


def test_a_stopped_group_member_is_that_members_failure_and_the_callback_runs(r, procs):
    result = group(
        [tasks.add.job(1, 1), tasks.runs_until_stopped.job(60)],
        callback=tasks.collect.job("after the stop"),
    ).enqueue()
    procs.start("runworker")
    wait_until(lambda: "running:1" in log(r), 30, "the long member's start")
    stopped = tasks.runs_until_stopped.get_result(result.member_ids[1])
    assert stopped.stop() is True
    ended_stopped(stopped)
    assert result.wait(timeout=30) == [2, None]
    wait_until(lambda: json.dumps(["after the stop", [2, None]]) in log(r), 30, "the callback")
    assert result.progress.failed == 1


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


def test_stopping_a_job_that_waits_to_be_tried_again_is_refused_as_such(r, backend):
    job = tasks.always_fails.enqueue("stop-me")
    run_worker_here(backend)  # its first attempt fails; the retry waits in its delayed set
    with pytest.raises(NotStoppable, match="waits to be tried again after 1 attempt"):
        job.stop()
    job.refresh()
    assert job.status == TaskResultStatus.READY and job.attempts == 1


def test_a_job_that_finished_first_is_left_as_it_was(r, backend):
    job = tasks.add.enqueue(1, 2)
    run_worker_here(backend)
    assert job.stop() is False
    assert job.status == TaskResultStatus.SUCCESSFUL and job.return_value == 3


def test_the_outcome_of_an_attempt_asked_to_stop_is_never_a_retry(r, backend):
    """Whatever its worker sends (a retry, a give-back), Redis ends the job FAILED."""
    from django_redisqueue.store.wire import RELEASE, RETRY

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
    _, claimed = backend.broker.claim(["default"], "w1", None, broadcasts=False)
    page = manager.get(BASE + f"job/{job.id}/").text
    assert "Abort</a>" in page
    confirm = BASE + f"confirm/stop/?queue=default&job_id={job.id}"
    assert manager.get(confirm).status_code == 200
    done = manager.post(
        BASE + "act/stop/", {"queue": "default", "job_id": job.id, "confirmed": "yes"}, follow=True
    )
    assert "aborted: its worker stops it within a second" in done.text
    assert r.lrange(backend.keys.stops("w1"), 0, -1) == [f"{job.id} {claimed.owner}"]


def test_a_stop_whose_list_entry_was_missed_is_taken_from_the_heartbeat(r, procs):
    """The id on the worker's stop list lost (a lost reply, the list expired): its next
    heartbeat names the job, and the worker stops it all the same."""
    job = tasks.runs_until_stopped.using(backend="leased").enqueue(60)
    worker = procs.start("runworker", "--backend", "leased")
    wait_until(lambda: "running:1" in log(r), 30, "the job's start")
    worker.send_signal(signal.SIGSTOP)  # frozen: it cannot take the stop
    assert job.stop() is True
    stops = list(r.scan_iter(match=task_backends["leased"].keys.stops("*")))
    assert len(stops) == 1 and r.delete(*stops) == 1  # the id never reaches it
    worker.send_signal(signal.SIGCONT)
    ended_stopped(job)
    assert "running:2" not in log(r)


ERROR = '{"exception_class_path":"builtins.ValueError","traceback":""}'


@pytest.mark.parametrize(("stops", "taken"), [(2, 1), (1, 0)], ids=["asked twice", "raced"])
def test_a_stop_of_an_earlier_attempt_does_not_stop_the_operators_retry(r, backend, stops, taken):
    """A stop asked twice, or one that raced the attempt's own failure, leaves an entry
    on the worker's stop list or in its early requests; the operator's retry (which
    cleared the job's stop field) runs on the same worker, and its attempt runs on."""
    broker = backend.broker
    job = tasks.add.enqueue(1, 2)
    _, first = broker.claim(["default"], "w1", None, broadcasts=False)
    for _ in range(stops):
        assert backend.stop(job.id) is True
    running: list = []
    requests = StopRequests("w1", broker, lambda: list(running))
    token = StopToken()
    running.append((first, token))
    for _ in range(taken):  # the heartbeat takes the first: the task is stopped
        requests.wait(0.1)
        assert isinstance(token.reason, JobStopped)
    running.clear()  # the attempt ends FAILED
    assert broker.finish(Outcome(first.job_id, first.owner, FAILED, error=ERROR))
    assert broker.operate("retry_failed", "default", [job.id]) == 1
    _, second = broker.claim(["default"], "w1", None, broadcasts=False)
    assert second.job_id == job.id and second.owner != first.owner
    again = StopToken()
    running.append((second, again))
    requests.starting(second, again)
    requests.wait(0.1)  # the heartbeat, while the retried attempt runs
    assert again.reason is None, "the operator's retry was stopped by the old request"


def test_a_stop_taken_as_the_job_starts_is_not_lost(r, backend):
    """The job starts (its ``starting`` call) just as the heartbeat's thread looks
    for it: the request is found by one or the other."""
    broker = backend.broker
    tasks.add.enqueue(1, 2)
    _, claimed = broker.claim(["default"], "w1", None, broadcasts=False)
    assert backend.stop(claimed.job_id) is True
    token = StopToken()
    running: list = []
    starts: list[threading.Thread] = []

    def start():  # as Worker.execute: the job is running, then starting()
        running.append((claimed, token))
        requests.starting(claimed, token)

    def running_now():
        seen = list(running)
        starts.append(threading.Thread(target=start))  # just after the look
        starts[0].start()
        starts[0].join(0.5)
        return seen

    requests = StopRequests("w1", broker, running_now)
    requests.wait(0.1)
    starts[0].join(5)
    assert isinstance(token.reason, JobStopped), "the stop was lost"
