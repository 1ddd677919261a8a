"""``async def`` tasks on the worker process's one event loop: many at once, each
holding one of its slots; a time limit, a lost lease or a second SIGTERM cancels one on
the loop and spares the others; their ORM calls run on the thread that waits for them."""

import os
import signal
from unittest.mock import patch

import pytest

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.runtime import event_loop
from tests.conftest import run_worker_here, wait_until
from tests.support import slot_tasks, tasks
from tests.test_slots import log, run_slots_here


def run_here(backend, threads, **options):
    """A burst worker run in this process: one slot on the main thread, or several."""
    if threads == 1:
        return run_worker_here(backend, **options)
    return run_slots_here(backend, threads=threads, **options)


def test_slot_tasks_of_one_process_run_at_once_on_its_one_loop(r, backend):
    names = ["a", "b", "c", "d"]
    jobs = [
        slot_tasks.meets_on_the_loop.enqueue(me, [n for n in names if n != me], 20) for me in names
    ]
    run_slots_here(backend, threads=4)
    assert [job.wait(timeout=5) for job in jobs] == [True] * 4  # all four at once
    [where] = {entry for entry in log(r) if entry.startswith("loop:")}  # one loop
    assert where.endswith("@redisqueue-loop")


@pytest.mark.parametrize("threads", [1, 2], ids=["main thread", "slots"])
def test_a_time_limit_cancels_an_async_task_on_the_loop_and_spares_the_others(r, backend, threads):
    slow = slot_tasks.awaits_past_its_timeout.enqueue(30)  # timeout=0.5
    quick = [tasks.meaning_of_life_async.enqueue() for _ in range(3)]
    run_here(backend, threads)
    stored = backend.get_result(slow.id)
    assert stored.status == TaskResultStatus.FAILED
    assert "JobTimeout" in stored.errors[0].exception_class_path
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback
    assert log(r) == ["cancelled"]  # at its await, on the loop
    assert [job.wait(timeout=5) for job in quick] == [42] * 3


@pytest.mark.parametrize("threads", [1, 2], ids=["main thread", "slots"])
def test_an_async_tasks_orm_calls_run_on_the_thread_that_waits_for_it(r, backend, threads):
    """There its database connections are the job's own, closed or kept around it as
    a sync task's are; not the one thread every async task would share."""
    jobs = [slot_tasks.thread_of_its_sync_calls.enqueue() for _ in range(2)]
    run_here(backend, threads)
    ran_on = {job.wait(timeout=5) for job in jobs}
    if threads == 1:
        assert ran_on == {"MainThread"}
    else:
        assert all(name.startswith("redisqueue-slot") for name in ran_on), ran_on


def test_before_asgiref_3_13_an_async_tasks_orm_calls_have_a_thread_of_their_own(r, backend):
    with patch.object(event_loop, "_CONTEXT_TAKES_EXECUTOR", False):
        jobs = [slot_tasks.thread_of_its_sync_calls.enqueue() for _ in range(2)]
        run_slots_here(backend, threads=2)
    ran_on = {job.wait(timeout=5) for job in jobs}
    assert len(ran_on) == 2 and not any(n.startswith("redisqueue-") for n in ran_on), ran_on


def test_a_second_sigterm_cancels_the_async_jobs_and_gives_them_back(r, backend, procs):
    held = [slot_tasks.awaits_until_released.enqueue(label, 60) for label in ("a", "b")]
    worker = procs.start("runworker", "--threads", "2")
    wait_until(lambda: {"started:a", "started:b"} <= set(log(r)), 30, "both starts")
    os.kill(worker.pid, signal.SIGTERM)
    procs.expect(worker, "SIGTERM received")
    os.kill(worker.pid, signal.SIGTERM)
    procs.expect(worker, "SIGTERM again, giving the running jobs back to their queue")
    wait_until(lambda: worker.poll() is not None, 30, "the worker's exit")
    assert {"cancelled:a", "cancelled:b"} <= set(log(r))
    for job in held:
        stored = backend.get_result(job.id)
        assert stored.status == TaskResultStatus.READY, stored.status  # back in its queue
        assert stored.attempts == 0


@pytest.mark.parametrize("threads", [1, 2], ids=["main thread", "slots"])
@pytest.mark.parametrize(
    "task",
    [slot_tasks.swallows_its_cancellation, slot_tasks.catches_the_time_limit_in_a_sync_call],
    ids=["swallows the cancellation", "catches it in a sync call"],
)
def test_an_async_task_that_outlives_its_time_limit_ends_with_the_stop_all_the_same(
    r, backend, threads, task
):
    """docs/howto/many-jobs.md: the attempt ends with the stop's reason, however the
    coroutine ended: one that swallowed the cancellation and returned; one whose time
    limit came (by SIGALRM, on the main thread) inside its thread-sensitive call, which
    would have handed it to the task as that call's error, for the task to catch."""
    job = task.enqueue()
    run_here(backend, threads)
    stored = backend.get_result(job.id)
    if task is slot_tasks.swallows_its_cancellation:
        assert log(r) == ["swallowed"]
    assert stored.status == TaskResultStatus.FAILED, stored.status
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_task_that_blocks_the_loop_has_the_async_jobs_waiting_for_it_given_back(
    r, backend, procs, threads
):
    """The loop stops answering: past a grace, the worker gives back the async jobs
    that wait for it (the blocker ends by its time limit) and its process exits."""
    blocker = slot_tasks.blocks_the_loop.enqueue(120)  # timeout=0.5
    waiting = slot_tasks.awaits_until_released.enqueue("waiting", 120)
    worker = procs.start("runworker", "--threads", threads)
    procs.expect(worker, "has blocked the event loop", timeout=60)
    wait_until(lambda: worker.poll() is not None, 30, "the worker's exit")
    assert worker.returncode == 0
    failed = backend.get_result(blocker.id)
    assert failed.status == TaskResultStatus.FAILED
    assert "ran past its timeout of 0.5 s" in failed.errors[0].traceback
    given_back = backend.get_result(waiting.id)
    assert given_back.status == TaskResultStatus.READY and given_back.attempts == 0
