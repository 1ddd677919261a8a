"""Unique jobs: while a job holding a unique key has not ended (or, with
``unique_for``, within its window), enqueueing another returns that job. The key is
held in the enqueue script, atomically, and let go by the job's end, however it ends."""

import subprocess
import sys

import pytest
from django.db import transaction

from django_redisqueue import chain, group, task
from django_redisqueue.core.fanout import broadcast
from django_redisqueue.store.wire import Outcome
from tests.conftest import ROOT, child_env, run_worker_here
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS, PERIODIC_KEYS


def holder(r, key: str) -> str | None:
    return r.get(DEFAULT_KEYS.unique(key))


def key_of(result) -> str:
    return result.task.job_options(result.args, result.kwargs).split('"unique":"')[1].split('"')[0]


def test_a_second_enqueue_while_the_first_waits_returns_the_first(r, backend):
    first = tasks.unique_report.enqueue("monday")
    second = tasks.unique_report.enqueue("monday")
    other = tasks.unique_report.enqueue("tuesday")
    assert second.id == first.id and other.id != first.id
    assert second.status == "READY" and second.enqueued_at == first.enqueued_at
    assert r.zcard(DEFAULT_KEYS.queue("default")) == 2
    assert holder(r, key_of(first)) == first.id
    # The key is the task and its arguments, keyword order aside.
    assert key_of(tasks.unique_report.using().job("monday")) == key_of(first)


def test_the_key_is_let_go_when_the_job_ends_and_a_new_job_can_take_it(r, backend):
    first = tasks.unique_report.enqueue("monday")
    run_worker_here(backend)
    assert holder(r, key_of(first)) is None
    again = tasks.unique_report.enqueue("monday")
    assert again.id != first.id and again.status == "READY"


def test_a_running_job_holds_its_key_through_retries_and_give_backs(r, backend):
    first = tasks.unique_report.enqueue("monday")
    claimed = backend.broker.claim(["default"], "w1")[1]
    assert tasks.unique_report.enqueue("monday").id == first.id  # RUNNING: held
    backend.broker.finish(
        Outcome(claimed.job_id, claimed.owner, "RETRY", error="{}", retry_in_ms=60_000)
    )
    assert tasks.unique_report.enqueue("monday").id == first.id  # waiting to retry
    r.zadd(DEFAULT_KEYS.delayed("default"), {first.id: 0})
    backend.broker.tick("s1", ["default"], batch=10, lost_limit=0, lost_error="{}")
    claimed = backend.broker.claim(["default"], "w1")[1]
    backend.broker.finish(Outcome(claimed.job_id, claimed.owner, "RELEASE"))
    assert tasks.unique_report.enqueue("monday").id == first.id  # given back: held


@pytest.mark.parametrize("end", ["cancel", "fail", "lost for good", "operator empties"])
def test_every_final_end_lets_the_key_go(r, backend, end):
    first = tasks.unique_report.enqueue("monday")
    broker = backend.broker
    if end == "cancel":
        first.cancel()
    elif end == "fail":
        claimed = broker.claim(["default"], "w1")[1]
        broker.finish(Outcome(claimed.job_id, claimed.owner, "FAILED", error="{}"))
    elif end == "lost for good":
        broker.claim(["default"], "w1")
        r.zadd(DEFAULT_KEYS.running, {first.id: 0})
        broker.tick("s1", ["default"], batch=10, lost_limit=0, lost_error="{}")
    else:
        assert broker.operate("empty", "default", limit=10) == 1  # deleted, unrun
    assert end == "operator empties" or backend.get_result(first.id).status == "FAILED"
    assert holder(r, key_of(first)) is None
    assert tasks.unique_report.enqueue("monday").id != first.id


def test_an_operators_retry_of_a_failed_unique_job_takes_its_key_again(r, backend):
    first = tasks.unique_report.enqueue("monday")
    claimed = backend.broker.claim(["default"], "w1")[1]
    backend.broker.finish(Outcome(claimed.job_id, claimed.owner, "FAILED", error="{}"))
    assert backend.broker.operate("retry_failed", "default", limit=10) == 1
    assert holder(r, key_of(first)) == first.id
    assert tasks.unique_report.enqueue("monday").id == first.id


def test_an_operators_retry_within_the_window_holds_the_key_until_the_job_ends(r, backend):
    first = tasks.rebuild_once_an_hour.enqueue()
    claimed = backend.broker.claim(["default"], "w1")[1]
    backend.broker.finish(Outcome(claimed.job_id, claimed.owner, "FAILED", error="{}"))
    assert r.pttl(DEFAULT_KEYS.unique("rebuild")) > 0  # ended: held for the rest of its window
    assert backend.broker.operate("retry_failed", "default", limit=10) == 1
    # Live again: held with no TTL, so the window running out cannot free the key.
    assert holder(r, "rebuild") == first.id
    assert r.pttl(DEFAULT_KEYS.unique("rebuild")) == -1
    r.hset(DEFAULT_KEYS.job(first.id), "unique_until", 1)  # the window passes
    assert tasks.rebuild_once_an_hour.enqueue().id == first.id
    claimed = backend.broker.claim(["default"], "w1")[1]
    backend.broker.finish(Outcome(claimed.job_id, claimed.owner, "SUCCESSFUL", result="1"))
    assert holder(r, "rebuild") is None  # ended past its window: free


def test_unique_for_holds_the_key_for_its_window_even_after_the_job_ended(r, backend):
    first = tasks.rebuild_once_an_hour.enqueue()
    run_worker_here(backend)
    assert backend.get_result(first.id).status == "SUCCESSFUL"
    again = tasks.rebuild_once_an_hour.enqueue()
    assert again.id == first.id and again.status == "SUCCESSFUL"
    assert again.return_value == "rebuilt"
    assert 3_590_000 < r.pttl(DEFAULT_KEYS.unique("rebuild")) <= 3_600_000
    r.delete(DEFAULT_KEYS.unique("rebuild"))  # the window passes
    assert tasks.rebuild_once_an_hour.enqueue().id != first.id


def test_unique_for_holds_while_the_job_runs_even_past_its_window(r, backend):
    first = tasks.free_job.using(unique_key="short").enqueue("a")
    r.hset(DEFAULT_KEYS.job(first.id), "unique_until", 1)  # its window passed long ago
    claimed = backend.broker.claim(["default"], "w1")[1]
    assert tasks.free_job.using(unique_key="short").enqueue("b").id == first.id
    backend.broker.finish(Outcome(claimed.job_id, claimed.owner, "SUCCESSFUL", result="1"))
    assert holder(r, "short") is None  # ended, and its window is over: free


def test_a_window_ends_with_its_jobs_record(r, backend):
    first = tasks.rebuild_once_an_hour.enqueue()
    run_worker_here(backend)
    r.delete(DEFAULT_KEYS.job(first.id))  # the result expired (RESULT_TTL) or was deleted
    again = tasks.rebuild_once_an_hour.enqueue()
    assert again.id != first.id and again.status == "READY"


def test_a_key_given_per_call_is_shared_by_whatever_uses_it(r):
    first = tasks.free_job.using(unique_key="report:42").enqueue("a")
    assert tasks.free_job.using(unique_key="report:42").enqueue("b").id == first.id
    assert tasks.unique_report.using(unique_key="report:42").enqueue("c").id == first.id
    assert tasks.free_job.using(unique_key="report:43").enqueue("a").id != first.id


def test_a_batch_holding_one_key_twice_stores_one_job(r):
    results = tasks.unique_report.enqueue_many([(("x",), {}), (("x",), {}), (("y",), {})])
    assert results[0].id == results[1].id != results[2].id
    assert r.zcard(DEFAULT_KEYS.queue("default")) == 2


def test_on_commit_a_duplicate_becomes_the_holders_result(r, transactional_db):
    first = tasks.unique_report.enqueue("monday")
    with transaction.atomic():
        later = tasks.unique_report.enqueue_on_commit("monday")
        assert later.id != first.id  # not pushed yet: its own id until the commit
    assert later.id == first.id and r.zcard(DEFAULT_KEYS.queue("default")) == 1


def test_a_spoilt_or_stale_key_is_taken_over(r, backend):
    r.set(DEFAULT_KEYS.unique("k1"), "no-such-job")
    r.hset(DEFAULT_KEYS.unique("k2"), "spoilt", "1")
    r.set(DEFAULT_KEYS.unique("k3"), "x" * 100_000)
    for key in ("k1", "k2", "k3"):
        result = tasks.free_job.using(unique_key=key).enqueue(key)
        assert holder(r, key) == result.id


def test_eight_processes_enqueueing_one_key_at_once_make_one_job(r, report):
    """Eight processes wait at a barrier (a list in Redis), then enqueue the same
    unique job at once; all eight get the one job."""
    code = (
        "import redis, os; from tests.support import tasks;"
        "from tests.support.topology import make_client;"
        "c = make_client(os.environ['REDISQUEUE_TEST_URL'], decode_responses=True);"
        "c.rpush('test:ready', 1); c.blpop('test:go', 30);"
        "print(tasks.unique_report.enqueue('race').id)"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "shell", "-c", code],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    try:
        from tests.conftest import wait_until

        wait_until(lambda: r.llen("test:ready") == 8, timeout=60, message="8 processes ready")
        r.rpush("test:go", *[1] * 8)
        ids = [process.communicate(timeout=60)[0].strip() for process in processes]
    finally:
        for process in processes:
            process.kill()
    report(f"unique: 8 processes enqueued one key at once: {len(set(ids))} job(s)")
    assert len(set(ids)) == 1 and ids[0]
    assert r.zcard(DEFAULT_KEYS.queue("default")) == 1


@pytest.mark.parametrize(
    "options",
    [
        {"unique": ""},
        {"unique": "k" * 201},
        {"unique": 3},
        {"unique_for": 10},  # a window without a key
        {"unique": True, "unique_for": 0},
        {"unique": True, "unique_for": True},
        {"unique": "k\ud800"},  # a lone surrogate: no JSON reader of Redis's takes it
    ],
    # ascii: a lone surrogate in a test id cannot cross to pytest-xdist's controller.
    ids=ascii,
)
def test_a_wrong_unique_option_is_refused_where_it_is_written(options):
    with pytest.raises(ValueError):
        task(**options)(tasks.free_job.func)


def test_what_cannot_keep_a_unique_key_refuses_it(r):
    parent = tasks.noop.enqueue()
    with pytest.raises(ValueError, match="depends_on"):
        tasks.unique_report.using(depends_on=parent)
    with pytest.raises(ValueError, match="unique"):
        group([tasks.unique_report.job("a")]).enqueue()
    with pytest.raises(ValueError, match="unique"):
        chain(tasks.noop.job(), tasks.unique_report.job("a")).enqueue()
    with pytest.raises(ValueError, match="unique"):
        broadcast(tasks.unique_report.job("a"))
    assert r.zcard(DEFAULT_KEYS.queue("default")) == 1  # the parent alone


def test_a_unique_periodic_task_never_overlaps_itself(r):
    """A schedule's runs are skipped while the job holding the task's key has not
    ended, and "run now" says so instead of queueing a second job."""
    from django_redisqueue.runtime.periodic import PeriodicTaskError, run_now, schedules_of
    from tests.test_periodic import periodic, stepper

    schedule = {"report": {"task": "tests.support.tasks.unique_report", "every": 1, "args": ["p"]}}
    with periodic(schedule) as backend:
        step = stepper(backend)
        holder = tasks.unique_report.using(backend="periodic").enqueue("p")
        state = PERIODIC_KEYS.periodic_schedule("report")
        step.last["report"] = int(r.hget(state, "last")) - 5000  # five runs are due
        r.hset(state, "last", step.last["report"])
        step.next.clear()
        step.step(backend.broker.clock_ms())
        assert r.zrange(PERIODIC_KEYS.queue("default"), 0, -1) == [holder.id]
        assert int(r.hget(state, "skipped")) >= 1  # catch-up "latest": one run, skipped
        with pytest.raises(PeriodicTaskError, match=holder.id):
            run_now(backend, schedules_of(backend)[0])
