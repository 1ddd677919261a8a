"""Groups, chains, depends_on and broadcast: what users get, with in-process burst
workers. The fault suite (tests/test_fanout_faults.py) tries to break them with
SIGKILLed workers and several schedulers."""

import json
import logging
import threading
from unittest.mock import patch

import pytest
from django.test import override_settings

from django_redisqueue import chain, group
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.core.fanout import Progress, broadcast
from django_redisqueue.dashboard.reads import Dashboard
from django_redisqueue.store.wire import MissingJob, NewJob
from tests.conftest import run_worker_here, wait_until
from tests.support import tasks
from tests.support.topology import keys_server, scripts_run

FAILED, SUCCESSFUL, READY = (
    TaskResultStatus.FAILED,
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.READY,
)


def logged(r):
    return [
        json.loads(entry) if entry.startswith("[") else entry
        for entry in r.lrange(tasks.LOG, 0, -1)
    ]


def error_class(result) -> str:
    return result.errors[-1].exception_class_path


# Groups


def test_a_group_runs_its_callback_once_with_the_members_results(r, backend):
    members = [tasks.add.job(i, i) for i in range(5)]
    result = group(members, callback=tasks.collect.job("done")).enqueue()

    assert result.progress == Progress(0, 0, 5)
    callback = result.callback
    assert callback.status == READY and r.zcard(backend.keys.queue("default")) == 5
    run_worker_here(backend)

    assert result.wait(timeout=5) == [0, 2, 4, 6, 8]
    assert result.progress == Progress(5, 0, 5) and result.finished
    assert logged(r) == [["done", [0, 2, 4, 6, 8]]]
    assert result.callback.status == SUCCESSFUL and result.callback.return_value == 5
    assert backend.get_group(result.id).member_ids == result.member_ids


def test_a_failed_member_still_ends_the_group_and_reads_as_none(r, backend):
    members = [tasks.add.job(1, 1), tasks.fail.job("boom"), tasks.add.job(2, 2)]
    result = group(members, callback=tasks.collect.job("end")).enqueue()
    run_worker_here(backend)

    assert result.wait(timeout=5) == [2, None, 4]
    assert result.progress == Progress(3, 1, 3)
    assert logged(r) == [["end", [2, None, 4]]]


def test_an_empty_group_runs_its_callback_at_once(r, backend):
    result = group([], callback=tasks.collect.job("nothing")).enqueue()
    assert result.wait(timeout=1) == []
    run_worker_here(backend)
    assert logged(r) == [["nothing", []]]


def test_a_large_group_is_enqueued_in_one_call_per_thousand_jobs(r, backend):
    before = scripts_run(r)
    result = group(
        [tasks.noop.job() for _ in range(2500)], callback=tasks.collect.job("cb")
    ).enqueue()
    calls = scripts_run(r) - before

    assert calls == 3  # 2,501 jobs: batches of 1,000, the last one sealing the group
    assert r.zcard(backend.keys.queue("default")) == 2500
    assert backend.group_state(result.id).total == 2500
    assert r.hget(backend.keys.job(result.callback_id), "waiting") == "1"


def test_a_finished_group_expires_with_its_results(r, backend):
    result = group([tasks.add.job(1, 2)], callback=tasks.collect.job("cb")).enqueue()
    group_keys = [backend.keys.group(result.id), backend.keys.group_members(result.id)]
    assert all(r.ttl(key) == -1 for key in group_keys)  # sealed and running: kept
    run_worker_here(backend)

    assert result.wait(timeout=5) == [3]
    for key in group_keys:
        assert 0 < r.ttl(key) <= backend.config.result_ttl, key


def test_cancelling_a_group_cancels_its_members_and_its_callback(r, backend):
    result = group(
        [tasks.add.job(i, 1) for i in range(4)], callback=tasks.collect.job("cb")
    ).enqueue()

    assert result.cancel() == 4 + 1
    assert result.finished and result.progress == Progress(4, 4, 4)
    run_worker_here(backend)
    for member in [*result.members, result.callback]:
        assert member.status == FAILED and error_class(member).endswith("JobCancelled")
    assert backend.queries.counts(["default"])["default"].failed == 0  # not retriable


def test_a_group_refuses_a_bad_member_and_queues_nothing(r, backend):
    with pytest.raises(TypeError, match="Argument 0"):
        group([tasks.add.job(1, 2), tasks.add.job(object(), 2)]).enqueue()
    with pytest.raises(TypeError, match=r"task.job\(...\)"):
        group([tasks.add])
    with pytest.raises(TypeError, match=r"then\(\) takes jobs"):
        tasks.add.job(1, 2).then(tasks.add)
    assert r.keys("*") == []


def test_group_results_and_members_are_read_from_any_process(backend):
    result = group([tasks.add.job(3, 4)]).enqueue()
    run_worker_here(backend)
    again = backend.get_group(result.id)
    assert again.wait(timeout=5) == [7]
    assert [m.return_value for m in again.members] == [7]
    assert again.callback is None
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_group("nope")


# Chains and depends_on


def test_a_chain_runs_in_order_one_step_at_a_time(r, backend):
    steps = tasks.record.job("a").then(tasks.record.job("b"), tasks.record.job("c")).enqueue()

    assert r.zcard(backend.keys.queue("default")) == 1  # only the first step is queued
    assert [s.status for s in steps] == [READY] * 3
    run_worker_here(backend)
    assert logged(r) == ["a", "b", "c"]
    assert [backend.get_result(s.id).status for s in steps] == [SUCCESSFUL] * 3


def test_a_failed_step_fails_the_rest_naming_it(r, backend):
    steps = chain(tasks.record.job("a"), tasks.fail.job("no"), tasks.record.job("c"),
                  tasks.record.job("d")).enqueue()  # fmt: skip
    run_worker_here(backend)

    assert logged(r) == ["a"]
    for step in steps[2:]:
        stored = backend.get_result(step.id)
        assert stored.status == FAILED and error_class(stored).endswith("DependencyFailed")
        assert f"job {steps[1].id} failed" in stored.errors[-1].traceback or (
            f"job {steps[1].id}, which" in stored.errors[-1].traceback
        )
        assert stored.started_at is None  # never ran


def test_cancelling_a_waiting_step_fails_the_steps_after_it(r, backend):
    steps = chain(*(tasks.record.job(x) for x in "abc")).enqueue()
    steps[1].cancel()
    run_worker_here(backend)

    assert logged(r) == ["a"]
    assert error_class(backend.get_result(steps[2].id)).endswith("DependencyFailed")


def test_depends_on_holds_a_job_until_the_job_before_succeeded(r, backend):
    first = tasks.record.enqueue("first")
    after = tasks.record.using(depends_on=first).enqueue("after")
    assert r.hget(backend.keys.job(after.id), "waiting") == "1"
    run_worker_here(backend)
    assert logged(r) == ["first", "after"]

    # On a job that already succeeded, it is queued at once; on one that failed, it fails.
    again = tasks.record.using(depends_on=first.id).enqueue("again")
    failed = tasks.fail.enqueue("x")
    run_worker_here(backend)
    doomed = tasks.record.using(depends_on=failed).enqueue("doomed")
    run_worker_here(backend)
    assert backend.get_result(again.id).status == SUCCESSFUL
    assert backend.get_result(doomed.id).status == FAILED
    assert "doomed" not in logged(r)


def test_depends_on_a_job_that_does_not_exist_queues_nothing(r, backend):
    with pytest.raises(TaskResultDoesNotExist, match="does not exist"):
        tasks.record.using(depends_on="0" * 26).enqueue("x")
    with pytest.raises(MissingJob):
        backend.broker.enqueue_linked([NewJob("1" * 26, "default", 0, "{}", 0, "2" * 26)])
    # Over several calls: the missing job is in the last, and refuses the first too.
    jobs = [NewJob(f"{i:026}", "default", 0, "{}") for i in range(4)]
    with patch("django_redisqueue.store.wire.ENQUEUE_BATCH_JOBS", 2), pytest.raises(MissingJob):
        backend.broker.enqueue_linked([*jobs, NewJob("9" * 26, "default", 0, "{}", 0, "8" * 26)])
    assert r.keys("*") == []


def test_a_waiting_job_keeps_its_run_after(r, backend):
    first = tasks.record.enqueue("first")
    later = tasks.record.using(depends_on=first, delay=3600).enqueue("later")
    run_worker_here(backend)
    assert r.zscore(backend.keys.delayed("default"), later.id) is not None
    assert logged(r) == ["first"]


# Broadcast


def test_each_registered_worker_receives_a_broadcast_once(r, backend):
    broker = backend.broker
    broker.heartbeat("w1", {}, {})
    broker.heartbeat("w2", {}, {})
    number = broadcast(tasks.record.job("hello"))

    assert [n for n, _ in broker.receive("w1", ["default"]).messages] == [number]
    assert broker.receive("w1", ["default"], [(number, "SUCCESSFUL")]).messages == []
    assert r.zcard(backend.keys.broadcast_unread) == 1  # w2 has not read it
    assert [n for n, _ in broker.receive("w2", ["default"]).messages] == [number]
    assert r.zcard(backend.keys.broadcast_unread) == 0
    message = r.hgetall(backend.keys.broadcast_message(number))
    assert message["ran:w1"].startswith("SUCCESSFUL ")
    assert message["ran:w2"].startswith("RUNNING ")
    assert 0 < r.ttl(backend.keys.broadcast_message(number)) <= backend.config.result_ttl

    broker.heartbeat("w3", {}, {})  # a worker that starts later replays nothing
    assert broker.receive("w3", ["default"]).messages == []


def test_a_broadcast_for_a_queue_reaches_only_its_workers(backend):
    broker = backend.broker
    broker.heartbeat("fast", {}, {})
    broker.heartbeat("slow", {}, {})
    number = broadcast(tasks.record.job("x"), queue="high")
    assert [n for n, _ in broker.receive("fast", ["high", "default"]).messages] == [number]
    assert broker.receive("slow", ["low"]).messages == []


def test_a_worker_runs_broadcasts_between_jobs(r, backend):
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend, burst=True)
    worker.register()
    broadcast(tasks.record.job("everywhere"))
    tasks.record.enqueue("job")
    run_worker_here(backend)  # another worker: registered after the broadcast
    assert logged(r) == ["job"]
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    assert logged(r) == ["job", "everywhere"]


def test_a_busy_worker_runs_a_broadcast_before_its_queue_runs_dry(r, backend):
    """A busy worker reads the broadcasts' number now and then, not with every claim:
    a message sent by its first job runs while jobs still wait (8 jobs of 50 ms each,
    against a read at least every 0.1 s)."""
    from django_redisqueue.runtime.worker import BROADCASTS_READ_EVERY, Worker

    assert BROADCASTS_READ_EVERY * 2 < 8 * 0.05
    worker = Worker(backend, burst=True)
    worker.register()
    tasks.broadcast_record.enqueue("everywhere")
    for i in range(8):
        tasks.record_after.enqueue(f"job {i}", 0.05)
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    log = logged(r)
    assert sorted(log) == sorted(["everywhere", *(f"job {i}" for i in range(8))])
    assert log.index("everywhere") < len(log) - 1, log


def test_a_broadcast_behind_a_full_read_of_others_queues_runs(r, backend):
    """More messages for other queues than one receive reads (100) come first: the
    worker reads on past them, and runs the one for it."""
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend, queues=["default"], burst=True)
    worker.register()
    for i in range(120):
        broadcast(tasks.record.job(f"high {i}"), queue="high")
    broadcast(tasks.record.job("everywhere"))
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    assert logged(r) == ["everywhere"]


def test_a_broadcast_refuses_what_it_cannot_run(backend):
    with pytest.raises(ValueError, match="takes a context"):
        broadcast(tasks.attempt_number.job("x"))
    with pytest.raises(ValueError, match="not a queue name"):
        broadcast(tasks.noop.job(), queue="no such")
    with pytest.raises(TypeError, match="queue"):
        broadcast(tasks.noop.job(), queue=None)  # type: ignore[arg-type]


# In tests, without Redis


@override_settings(
    TASKS={
        "default": {
            "BACKEND": "django_redisqueue.immediate.ImmediateBackend",
            "QUEUES": ["high", "default", "low"],
        }
    }
)
def test_the_immediate_backend_runs_groups_chains_and_broadcasts(r):
    result = group(
        [tasks.add.job(1, 1), tasks.fail.job("x")], callback=tasks.collect.job("g")
    ).enqueue()
    assert result.wait() == [2, None] and result.progress == Progress(2, 1, 2)
    steps = chain(tasks.record.job("a"), tasks.fail.job("b"), tasks.record.job("c")).enqueue()
    assert [s.status for s in steps] == [SUCCESSFUL, FAILED, FAILED]
    assert error_class(steps[2]).endswith("DependencyFailed")
    broadcast(tasks.record.job("all"))
    assert logged(r) == [["g", [2, None]], "a", "all"]
    assert task_backends["default"].get_group(result.id).results == [2, None]


def test_emptying_a_queue_ends_its_group_members_and_fails_what_waits(r, backend):
    result = group([tasks.add.job(1, 1)], callback=tasks.collect.job("cb")).enqueue()
    steps = chain(tasks.record.using(queue_name="low").job("a"), tasks.record.job("b")).enqueue()
    assert backend.broker.operate("empty", "default", limit=10) == 1
    assert backend.broker.operate("empty", "low", limit=10) == 1

    assert result.wait(timeout=1) == [None]  # the group ended: its member is gone
    run_worker_here(backend)
    assert backend.get_result(result.callback_id).status == SUCCESSFUL
    assert error_class(backend.get_result(steps[1].id)).endswith("DependencyFailed")


def test_waiting_for_a_group_outlasts_redis_refusing_writes(r, backend):
    """BLMOVE is a write: an out-of-memory Redis refuses the waiter's blocking call,
    which waits it out and still sees the group end."""
    result = group([tasks.add.job(1, 1)]).enqueue()
    server = keys_server(r)
    server.config_set("maxmemory", 1)

    def recover_then_work():
        wait_until(lambda: server.info("errorstats").get("errorstat_OOM"), message="an OOM")
        server.config_set("maxmemory", 0)
        run_worker_here(backend)

    helper = threading.Thread(target=recover_then_work)
    helper.start()
    try:
        assert result.wait(timeout=20) == [2]
    finally:
        server.config_set("maxmemory", 0)
        helper.join(timeout=20)


def test_a_broadcast_outcome_is_kept_until_redis_stores_it(r, backend):
    import redis

    from django_redisqueue.runtime.worker import Worker
    from django_redisqueue.store.gateway import Reconnector

    worker = Worker(backend, burst=True)
    worker.register()
    number = broadcast(tasks.record.job("once"))
    worker.broker.last_broadcast = number
    receive = worker.broker.receive
    calls = []

    def fails_when_reporting(worker_id, queues, ran=(), most=100):
        calls.append(list(ran))
        if ran and len(calls) == 2:
            raise redis.ConnectionError("lost while reporting")
        return receive(worker_id, queues, ran, most)

    backoff = Reconnector(logging.getLogger("test"), "test", ceiling=0.01)
    with (
        patch.object(worker.broker, "receive", fails_when_reporting),
        patch("django_redisqueue.runtime.worker.close_old_connections"),
    ):
        worker.broadcasts.receive(worker.queues, backoff)  # runs it, then the report fails
        assert worker.broadcasts.seen == 0
        worker.broadcasts.receive(worker.queues, backoff)  # reports it again, runs nothing more
    assert worker.broadcasts.seen == number
    assert logged(r) == ["once"]
    ran = r.hget(backend.keys.broadcast_message(number), f"ran:{worker.worker_id}")
    assert ran.startswith("SUCCESSFUL ")

    # The broker (shared by this process's workers) remembers a broadcast that Redis no
    # longer has: a burst worker's first claim skips the queues to receive, and finding
    # nothing must not end its run before it looked at them.
    r.flushall()
    tasks.record.enqueue("after")
    run_worker_here(backend)
    assert logged(r) == ["after"]


# What an outsider tried: hostile values in Redis, odd orders of operations, bad input


@pytest.mark.parametrize(
    ("key", "value"),
    [("broadcast_seq", "abc"), ("broadcast_seq", "5.5"), ("broadcast_cursors", "x"),
     ("broadcast_unread", "x")],
)  # fmt: skip
def test_spoilt_broadcast_keys_never_stop_a_worker_from_running_jobs(r, backend, key, value):
    r.set(getattr(backend.keys, key), value)
    job = tasks.add.enqueue(1, 2)
    run_worker_here(backend)
    assert backend.get_result(job.id).status == SUCCESSFUL


@pytest.mark.parametrize(
    ("key", "value"),
    [("broadcast_seq", "abc"), ("broadcast_seq", "5.5"), ("broadcast_seq", None),
     ("broadcast_cursors", "x"), ("broadcast_cursors", None), ("broadcast_unread", "x"),
     ("broadcast_sent", "x"), ("workers", "x")],
)  # fmt: skip
def test_a_broadcast_is_sent_and_delivered_whatever_its_keys_hold(r, backend, key, value):
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend, queues=["default"], burst=True)
    worker.register()
    broadcast(tasks.record.job("before"))  # numbers past the spoilt counter's
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    if value is None:
        r.delete(getattr(backend.keys, key))
    else:
        r.set(getattr(backend.keys, key), value)
    worker.register()  # its heartbeat goes on
    number = broadcast(tasks.record.job("after"))
    assert number > 1
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    assert logged(r) == ["before", "after"]
    assert [int(n) for n in r.zrange(backend.keys.broadcast_sent, 0, -1)][-1] == number


def test_a_worker_whose_cursors_were_deleted_reads_the_next_broadcast(r, backend):
    backend.broker.heartbeat("w1", {}, {})
    r.delete(backend.keys.broadcast_cursors)  # before its next heartbeat: no cursor
    number = broadcast(tasks.record.job("x"))
    assert [n for n, _ in backend.broker.receive("w1", ["default"]).messages] == [number]


def test_a_broadcast_counter_set_back_by_hand_still_delivers(r, backend):
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend, queues=["default"], burst=True)
    worker.register()
    r.set(backend.keys.broadcast_seq, 1000)
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()  # it saw the counter at 1000
    r.delete(backend.keys.broadcast_seq)
    worker.register()
    broadcast(tasks.record.job("after"))  # numbered 1
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    assert logged(r) == ["after"]


def test_a_group_is_enqueued_whole_whatever_the_groups_index_holds(r, backend):
    r.set(backend.keys.groups, "spoilt")
    assert Dashboard(backend).groups(1).rows == []  # read as empty
    backend.broker.tick("s1", ["default"], batch=10, lost_limit=2, lost_error="{}")
    assert r.type(backend.keys.groups) == "none"  # replaced by the scheduler's step
    r.set(backend.keys.groups, "spoilt")
    result = group([tasks.add.job(1, 2)], callback=tasks.collect.job("cb")).enqueue()
    assert r.zrange(backend.keys.groups, 0, -1) == [result.id]
    run_worker_here(backend)
    assert result.wait(timeout=5) == [3]


def test_a_live_group_stays_in_the_groups_index_however_old(r, backend):
    """The index is trimmed of groups gone (their records expired), never of live ones."""
    old = group([tasks.add.job(1, 2)]).enqueue()
    gone = group([tasks.add.job(1, 2)]).enqueue()
    r.zadd(backend.keys.groups, {old.id: 1, gone.id: 2})  # created long ago
    r.delete(backend.keys.group(gone.id))  # its record expired
    new = group([tasks.add.job(3, 4)]).enqueue()
    assert r.zrange(backend.keys.groups, 0, -1) == [old.id, new.id]
    assert r.ttl(backend.keys.groups) == -1  # nor does the index expire under a live group
    r.delete(backend.keys.group(old.id))
    backend.broker.tick("s1", ["default"], batch=10, lost_limit=2, lost_error="{}")
    assert r.zrange(backend.keys.groups, 0, -1) == [new.id]  # the tick trims it too


def test_the_members_of_a_group_are_read_when_one_was_deleted(r, backend):
    result = group([tasks.add.job(1, 2), tasks.add.job(3, 4)]).enqueue()
    assert backend.broker.operate("empty", "default", job_ids=[result.member_ids[0]]) == 1
    members = backend.get_group(result.id).members
    assert members[0] is None and members[1].id == result.member_ids[1]


def test_many_jobs_depending_on_one_cost_the_same_to_enqueue(r, backend):
    """Each depends_on adds to the parent's list of dependents: it does not rewrite it."""
    parent = tasks.add.enqueue(1, 1)
    for i in range(300):
        tasks.record.using(depends_on=parent).enqueue(f"d{i}")
    assert r.hget(backend.keys.job(parent.id), "then") == "300"
    run_worker_here(backend)
    assert sorted(logged(r)) == sorted(f"d{i}" for i in range(300))


def test_a_member_of_unread_that_is_no_number_is_passed_over(r, backend):
    backend.broker.heartbeat("w1", {}, {})
    number = broadcast(tasks.record.job("x"))
    r.zadd(backend.keys.broadcast_unread, {"abc": number + 1})
    assert [n for n, _ in backend.broker.receive("w1", ["default"]).messages] == [number]


def test_a_spoilt_group_count_does_not_stop_a_member_ending(r, backend):
    result = group([tasks.add.job(1, 2)], callback=tasks.collect.job("cb")).enqueue()
    child = tasks.record.using(depends_on=result.member_ids[0]).enqueue("child")
    r.hset(backend.keys.group(result.id), "ended", "garbage")
    run_worker_here(backend)
    assert backend.get_result(child.id).status == SUCCESSFUL
    assert backend.get_result(result.callback_id).status == SUCCESSFUL


def test_a_group_cancelled_between_its_enqueue_calls_never_runs_its_callback(r, backend):
    """The calls of a large group's enqueue are separate steps: a cancel can come between
    them, before the callback is stored (the last call holds it)."""
    from django_redisqueue.store.wire import AFTER_GROUP

    broker, gid, noop = backend.broker, "g" * 26, '{"v":1,"task":"tests.support.tasks.noop"}'
    first, late = (NewJob(f"{i}" * 26, "default", 0, noop) for i in range(2))
    callback = NewJob("c" * 26, "default", 0, '{"v":1,"task":"tests.support.tasks.collect"}', 0,
                      AFTER_GROUP)  # fmt: skip
    broker._run("enqueue_linked", 0, gid, 0, 60, 0, 0, *first.as_linked_args())
    broker.cancel_group(gid, "{}")
    broker._run("enqueue_linked", 0, gid, 1, 60, 0, 0, *late.as_linked_args(),
                *callback.as_linked_args())  # fmt: skip
    run_worker_here(backend)
    stored = backend.get_result(callback.job_id)
    assert stored.status == FAILED and error_class(stored).endswith("JobCancelled")
    assert stored.started_at is None


def test_a_step_that_never_ran_is_not_retried_with_the_failed_jobs(r, backend):
    steps = chain(tasks.fail.job("a"), tasks.record.job("b")).enqueue()
    run_worker_here(backend)
    assert backend.broker.operate("retry_failed", "default", limit=100) == 1  # a only
    run_worker_here(backend)
    assert backend.get_result(steps[1].id).status == FAILED
    assert "b" not in logged(r)


def test_a_callback_whose_results_redis_cannot_give_is_given_back_unrun(r, backend):
    import redis

    result = group([tasks.add.job(1, 2)], callback=tasks.collect.job("cb")).enqueue()
    with patch.object(
        type(backend), "group_results", side_effect=[redis.ConnectionError("gone"), [3]]
    ):
        run_worker_here(backend)
    assert logged(r) == [["cb", [3]]]
    assert backend.get_result(result.callback_id).attempts == 1


def test_options_a_fan_out_would_drop_are_refused(backend):
    parent = tasks.noop.enqueue()
    later = tasks.noop.using(depends_on=parent).job()
    with pytest.raises(ValueError, match="chain's later steps"):
        chain(tasks.noop.job(), later).enqueue()
    with pytest.raises(ValueError, match="a group's jobs"):
        group([later]).enqueue()
    with pytest.raises(ValueError, match="QUEUES"):
        broadcast(tasks.noop.job(), queue="nosuchqueue")
    with pytest.raises(ValueError, match="run_after"):
        broadcast(tasks.noop.using(delay=5).job())
    with pytest.raises(ValueError, match="at least one job"):
        group([])
    for not_an_id in ("*", "a b", "x" * 129):
        with pytest.raises(ValueError, match="must be a job id"):
            tasks.noop.using(depends_on=not_an_id)
