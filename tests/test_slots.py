"""A worker process that runs several jobs at once (``runworker --threads N``): the
jobs run side by side, each stopped alone (its time limit, its lost lease, a second
SIGTERM for all), each outcome stored once, and nothing is given back that a slot runs."""

import contextlib
import gc
import os
import signal
import threading
from unittest.mock import patch

import pytest
import redis

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.core.jobs import SUCCESSFUL
from django_redisqueue.exceptions import LeaseLost
from django_redisqueue.runtime.heartbeat import Heartbeat
from django_redisqueue.runtime.slots import SlotWorker, _Slot
from django_redisqueue.runtime.stopping import StopToken
from django_redisqueue.runtime.worker import Worker
from django_redisqueue.store.wire import Outcome
from tests.conftest import wait_until
from tests.support import slot_tasks, tasks


def run_slots_here(backend, threads=2, **options):
    """A burst worker of ``threads`` slots, run in this process (as run_worker_here)."""
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker = SlotWorker(backend, threads=threads, burst=True, **options)
        worker.run()
    return worker


def run_patched(worker, *patches):
    """Run ``worker`` here with Redis calls made to fail or wait by ``patches``."""
    with contextlib.ExitStack() as stack:
        for patcher in (*patches, patch("django_redisqueue.runtime.worker.close_old_connections")):
            stack.enter_context(patcher)
        worker.run()


def slots_on(broker):
    """The slots call Redis through ``broker`` (the backend's, whose calls the test
    replaces) instead of on connections of their own."""
    return patch.object(SlotWorker, "_spare_broker", lambda self: contextlib.nullcontext(broker))


def log(r):
    return r.lrange(tasks.LOG, 0, -1)


def test_the_jobs_of_one_process_run_at_once(r, backend):
    a = tasks.rendezvous.enqueue("a", "b", 20)  # they meet only if both run at once
    b = tasks.rendezvous.enqueue("b", "a", 20)
    worker = run_slots_here(backend)
    assert a.wait(timeout=5) is True and b.wait(timeout=5) is True
    ran_on = {tuple(backend.get_result(job.id).worker_ids) for job in (a, b)}
    assert ran_on == {(worker.worker_id,)} and worker.jobs_done == 2


def test_a_time_limit_stops_its_job_and_spares_the_others(r, backend):
    slow = tasks.overruns_in_steps.enqueue(30)  # timeout=0.5
    quick = [tasks.add.enqueue(i, i) for i in range(5)]
    run_slots_here(backend)
    stored = backend.get_result(slow.id)
    assert stored.status == TaskResultStatus.FAILED
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback
    assert [job.wait(timeout=5) for job in quick] == [0, 2, 4, 6, 8]


@pytest.mark.parametrize(
    "task", [tasks.steps_until_released, slot_tasks.awaits_until_released], ids=["sync", "async"]
)
def test_a_lost_lease_stops_its_job_and_no_other(r, task):
    """The heartbeat finds one of two running jobs taken from the worker: that one is
    stopped (its late outcome refused; an async one cancelled on the loop), the other
    runs to its end."""
    backend = task_backends["leased"]  # 1 s leases: a heartbeat every 1/3 s
    leased = task.using(backend="leased")
    lost, kept = leased.enqueue("lost", 30), leased.enqueue("kept", 30)
    worker = SlotWorker(backend, threads=2, burst=True)

    def steal_one_lease():
        wait_until(lambda: {"started:lost", "started:kept"} <= set(log(r)), 30, "both starts")
        r.hset(backend.keys.job(lost.id), "owner", "another-worker/2")
        wait_until(
            lambda: [job.job_id for job, _ in worker.in_hand()] == [kept.id], 30, "the stop"
        )
        r.rpush("test:release", 1)

    thief = threading.Thread(target=steal_one_lease)
    thief.start()
    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker.run()
    thief.join()
    assert "done:lost" not in log(r)  # interrupted, not released
    if task is slot_tasks.awaits_until_released:
        assert "cancelled:lost" in log(r)
    assert backend.get_result(lost.id).status == TaskResultStatus.RUNNING  # not ours now
    assert kept.wait(timeout=5) is True


def test_the_slots_call_redis_on_connections_of_their_own_given_back_at_the_end(r, backend):
    """Not through the backend's pool, whose hand-over of a connection on every call
    costs the slots' threads the GIL; as many connections as calls at once, not one a
    slot; all back in the pool as the worker ends."""
    a = tasks.rendezvous.enqueue("a", "b", 20)  # both slots busy at once
    b = tasks.rendezvous.enqueue("b", "a", 20)
    jobs = [tasks.add.enqueue(i, 1) for i in range(20)]
    pooled = []
    claim = backend.broker.claim

    def counted(*args, **kwargs):
        pooled.append(1)
        return claim(*args, **kwargs)

    lent = []
    spares = backend.broker.spares
    close_all = spares.close_all
    before = list(spares._made)  # lent to the enqueues above, or to earlier tests

    def closed_all():
        lent.extend(spares._made)
        close_all()

    with (
        patch.object(backend.broker, "claim", counted),
        patch.object(spares, "close_all", closed_all),
    ):
        run_slots_here(backend, threads=2)
    assert a.wait(timeout=5) is True and b.wait(timeout=5) is True
    assert [job.wait(timeout=5) for job in jobs] == [i + 1 for i in range(20)]
    assert pooled == []
    assert len([broker for broker in lent if broker not in before]) <= 2
    assert lent and all(broker.client.connection is None for broker in lent)
    # The heartbeat's thread calls through the pool: one in flight as the worker ends
    # gives its connection back as its call returns. A worker an earlier test built and
    # never ran holds its own connection until the collector frees it.
    gc.collect()
    pool = backend.broker.client.connection_pool
    wait_until(lambda: pool._in_use_connections == set(), 10, "the pool's connections back")


def test_a_slots_call_takes_a_connection_no_other_call_is_on(backend):
    worker = SlotWorker(backend, threads=4)
    with worker._spare_broker() as first, worker._spare_broker() as second:
        assert second is not first and second.client is not first.client
        assert backend.broker not in (first, second)
    with worker._spare_broker() as again:
        assert again in (first, second)
    assert first.client.connection is not None  # held until the worker ends
    backend.broker.spares.close_all()
    assert first.client.connection is None and second.client.connection is None


def test_a_lost_reply_keeps_the_jobs_of_slots_not_running_them(r, backend):
    """A slot holds its job from the claim until its outcome is stored, also while its
    thread has not started the job or has ended it and stores the outcome (Redis
    failing): a give-back after the loop's lost reply keeps it, and the outcome counts."""
    starting, storing = tasks.noop.enqueue(), tasks.noop.enqueue()
    worker = SlotWorker(backend, threads=3)
    claimed = [backend.broker.claim(["default"], worker.worker_id)[1] for _ in range(2)]
    for job in claimed:
        assert job is not None
        worker._running[job.job_id, job.owner] = _Slot()  # in a slot, no current job
    worker._recover_claim(None)
    for job in claimed:
        assert backend.get_result(job.job_id).status == TaskResultStatus.RUNNING
        assert backend.broker.finish(Outcome(job.job_id, job.owner, SUCCESSFUL)) is True
    assert {starting.id, storing.id} == {job.job_id for job in claimed if job}


def test_a_lost_reply_gives_back_a_job_claimed_again_beside_its_stale_slot(r, backend):
    """A slot still runs a job whose lease ran out (blocked in C, say) when the loop's
    lost call claims it again: the give-back keeps the slot's attempt, not the job, so
    the new claim goes back uncounted and the job does not wait for a lease to fail."""
    job = tasks.noop.enqueue()
    worker = SlotWorker(backend, threads=2)
    stale = backend.broker.claim(["default"], worker.worker_id)[1]
    assert stale is not None
    worker._running[stale.job_id, stale.owner] = _Slot()
    r.zadd(backend.keys.running, {job.id: 0})  # its lease runs out; a tick recovers it
    assert backend.broker.tick("s", ["default"], batch=10, lost_limit=5, lost_error="").recovered
    again = backend.broker.claim(["default"], worker.worker_id)[1]  # the lost call's
    assert again is not None and again.job_id == job.id and again.owner != stale.owner
    worker._recover_claim(None)
    assert backend.get_result(job.id).status == TaskResultStatus.READY
    assert backend.broker.finish(Outcome(job.id, stale.owner, SUCCESSFUL)) is False


def test_a_second_sigterm_gives_back_every_job_in_hand(r, backend, procs):
    """A sync job and an ``async def`` one (cancelled on its loop)."""
    held = [
        tasks.steps_until_released.enqueue("a", 60),
        slot_tasks.steps_until_released_async.enqueue("b", 60),
    ]
    worker = procs.start("runworker", "--threads", "2")
    wait_until(lambda: {"started:a", "started:b"} <= set(log(r)), 30, "both starts")
    os.kill(worker.pid, signal.SIGTERM)
    procs.expect(worker, "SIGTERM received")
    os.kill(worker.pid, signal.SIGTERM)
    procs.expect(worker, "SIGTERM again, giving the running jobs back to their queue")
    try:
        wait_until(lambda: worker.poll() is not None, 30, "the worker's exit")
    except AssertionError:
        print(worker.output[-4000:])
        raise
    for job in held:
        stored = backend.get_result(job.id)
        assert stored.status == TaskResultStatus.READY, stored.status  # back in its queue
        assert stored.attempts == 0  # uncounted: it runs again as attempt 1
    assert backend.queries.queue_length("default") == 2


def test_async_tasks_run_in_the_threads_too(r, backend):
    """``async def`` tasks run on slots too (on the process's event loop)."""
    jobs = [tasks.meaning_of_life_async.enqueue() for _ in range(4)]
    run_slots_here(backend)
    assert [job.wait(timeout=5) for job in jobs] == [42] * 4


def test_a_job_whose_thread_never_lets_go_is_given_up_and_the_process_recycled(r, backend, procs):
    """A thread blocked in a C call takes no exception: past its time limit and a grace,
    its job ends as if its task had raised the time limit (FAILED, or RETRY by its retry
    policy; logged as any end), not renewed for ever; the other job in hand ends as it
    would, and the process exits without waiting for the stuck threads."""
    stuck = slot_tasks.blocks_in_c.enqueue()  # timeout=0.5
    retried = slot_tasks.blocks_in_c_retried.enqueue()  # a retry in 600 s
    other = tasks.steps_until_released.enqueue("other", 60)
    worker = procs.start("runworker", "--threads", "3")
    wait_until(
        lambda: {"blocked", "blocked, retried", "started:other"} <= set(log(r)), 30, "the starts"
    )
    procs.expect(worker, "its thread has not let go")
    stored = wait_until(
        lambda: (
            (result := backend.get_result(stuck.id)).status == TaskResultStatus.FAILED and result
        ),
        30,
        "the stuck job's outcome",
    )
    assert "ran past its timeout of 0.5 s" in stored.errors[0].traceback
    procs.expect(worker, f"Job {stuck.id} tests.support.slot_tasks.blocks_in_c FAILED")
    retried_path = slot_tasks.blocks_in_c_retried.module_path
    procs.expect(worker, f"Job {retried.id} {retried_path} raised JobTimeout")
    again = wait_until(
        lambda: (
            (result := backend.get_result(retried.id)).status == TaskResultStatus.READY and result
        ),
        30,
        "the retried job's outcome",
    )
    assert again.attempts == 1  # to run again, in 600 s
    assert r.zscore(backend.keys.delayed("default"), retried.id) is not None
    assert worker.poll() is None  # the other job is still in hand
    r.rpush("test:release", 1)
    assert other.wait(timeout=30) is True
    wait_until(lambda: worker.poll() is not None, 30, "the worker's exit")
    assert worker.returncode == 0


def test_a_lost_reply_gives_back_no_job_whose_outcome_a_slot_is_still_storing(r, backend):
    """The loop's claim loses its reply while a slot stores the outcome of the job it
    ran (only stores: the loop is to read the broadcasts' number, say): the recovery
    gives back what the lost call may have given, and keeps that job (else it would run
    again, its outcome refused)."""
    job = tasks.record.enqueue("once")
    worker = SlotWorker(backend, threads=2, burst=True)
    worker._queues_for_a_slot = lambda: []
    storing, recovered = threading.Event(), threading.Event()
    claim, abandon, finish = worker.broker.claim, worker.broker.abandon, backend.broker.finish
    claims = []

    def claim_losing_the_second_reply(*args, **kwargs):
        claims.append(1)
        if len(claims) == 2:  # once the job's slot stores its outcome, a reply is lost
            storing.wait(30)
            raise redis.ConnectionError("reply lost")
        return claim(*args, **kwargs)

    def abandon_then_say(*args, **kwargs):
        try:
            return abandon(*args, **kwargs)
        finally:
            recovered.set()

    def finish_once_recovered(outcome):
        storing.set()
        recovered.wait(30)  # the slot's store is slow: Redis fails for it too
        return finish(outcome)

    run_patched(
        worker,
        patch.object(worker.broker, "claim", claim_losing_the_second_reply),
        patch.object(worker.broker, "abandon", abandon_then_say),
        slots_on(backend.broker),
        patch.object(backend.broker, "finish", finish_once_recovered),
    )
    assert recovered.is_set()
    assert log(r) == ["once"]  # run once
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL and stored.attempts == 1


def test_a_busy_slot_stores_each_outcome_and_claims_its_next_job_in_one_call(r, backend):
    """Without the loop between them: a job's outcome and the next claim go together."""
    jobs = [tasks.add.enqueue(i, 1) for i in range(40)]
    calls = []
    claim = backend.broker.claim

    def counted(*args, **kwargs):
        calls.append(bool(args[0]))  # whether it claimed, or only stored
        return claim(*args, **kwargs)

    with slots_on(backend.broker), patch.object(backend.broker, "claim", counted):
        worker = run_slots_here(backend, threads=2)
    assert [job.wait(timeout=5) for job in jobs] == [i + 1 for i in range(40)]
    assert worker.jobs_done == 40
    assert sum(calls) >= 20, f"{sum(calls)} of {len(calls)} slot calls claimed"


def test_a_lost_reply_waits_for_a_slot_claim_in_flight_and_keeps_its_job(r, backend):
    """A slot's call stored its job's outcome and claimed the next; before it has put
    that job in its slot, the loop's claim loses its reply. The loop's give-back waits
    for the slot's call to end, so that it keeps the job the slot claimed: run once."""
    first, second = tasks.record.enqueue("first"), tasks.record.enqueue("second")
    worker = SlotWorker(backend, threads=2, burst=True)
    replied = threading.Event()
    slot_claim, loop_claim = backend.broker.claim, worker.broker.claim
    abandon = worker.broker.abandon
    loop_calls, given_back = [], []

    def slot_claim_slow_to_take_its_job(*args, **kwargs):
        answer = slot_claim(*args, **kwargs)
        if answer[1] is not None and answer[1].job_id == second.id:
            replied.set()
            wait_until(lambda: worker._claims._closed, 10, "the loop's give-back waiting")
        return answer

    def loop_claim_losing_a_reply(*args, **kwargs):
        loop_calls.append(1)
        if len(loop_calls) == 2:  # its second: while the slot claims the second job
            assert replied.wait(10)
            raise redis.ConnectionError("reply lost")
        return loop_claim(*args, **kwargs)

    def abandon_said(*args, **kwargs):
        given_back.extend(abandon(*args, **kwargs))
        return given_back

    run_patched(
        worker,
        slots_on(backend.broker),
        patch.object(backend.broker, "claim", slot_claim_slow_to_take_its_job),
        patch.object(worker.broker, "claim", loop_claim_losing_a_reply),
        patch.object(worker.broker, "abandon", abandon_said),
    )
    assert replied.is_set()
    assert given_back == []  # the slot's job kept: it ran there
    assert sorted(log(r)) == ["first", "second"]  # each once
    for job in (first, second):
        stored = backend.get_result(job.id)
        assert stored.status == TaskResultStatus.SUCCESSFUL and stored.attempts == 1


def test_the_heartbeat_renews_the_newest_attempt_of_a_job_held_twice(r):
    """A slot still runs attempt 1 of a job (blocked in C past its lease) that this
    worker claimed again as attempt 2: in whatever order the worker lists them, the
    heartbeat renews attempt 2 and stops attempt 1, which no longer owns the job."""
    leased = task_backends["leased"]
    job = tasks.noop.using(backend="leased").enqueue()
    worker = SlotWorker(leased, threads=2)
    stale = leased.broker.claim(["default"], worker.worker_id)[1]
    r.zadd(leased.keys.running, {job.id: 0})  # its lease runs out; a tick recovers it
    assert leased.broker.tick("s", ["default"], batch=10, lost_limit=5, lost_error="").recovered
    again = leased.broker.claim(["default"], worker.worker_id)[1]
    assert stale is not None and again is not None and again.owner != stale.owner
    slots = {claimed.owner: _Slot(claimed) for claimed in (again, stale)}  # newest first
    for claimed in (again, stale):
        slot = slots[claimed.owner]
        slot.current, slot.token = claimed, StopToken()
        worker._running[claimed.job_id, claimed.owner] = slot
    heartbeat = Heartbeat(worker)
    heartbeat.start()
    try:
        wait_until(lambda: slots[stale.owner].token.reason is not None, 10, "attempt 1 stopped")
        renewed_at = r.zscore(leased.keys.running, job.id)
        wait_until(lambda: r.zscore(leased.keys.running, job.id) > renewed_at, 10, "a renewal")
    finally:
        heartbeat.stopped.set()
        heartbeat.join()
    assert isinstance(slots[stale.owner].token.reason, LeaseLost)
    assert slots[again.owner].token.reason is None  # attempt 2 runs on, its lease renewed
    assert leased.broker.finish(Outcome(job.id, again.owner, SUCCESSFUL)) is True


def test_a_job_given_back_and_claimed_again_by_its_own_slot_stays_in_hand(r, backend, caplog):
    """A group's callback whose members' results Redis could not give is given back,
    unrun and uncounted: the slot's call that stores that give-back may claim the same
    job again at once, under the same owner token (its attempt was not counted). That
    new attempt stays among the jobs in hand (its lease renewed, kept by a give-back)
    and ends once, with no slot failing."""
    from django_redisqueue import group

    result = group([tasks.add.job(1, 2)], callback=tasks.collect.job("cb")).enqueue()
    worker = SlotWorker(backend, threads=1, burst=True)
    execute, held_at_start = worker.execute, []

    def execute_seen_in_hand(job):
        held_at_start.append((job.job_id, job.owner) in worker.held())
        return execute(job)

    run_patched(
        worker,
        # The slots claim their next jobs whatever the time (no broadcasts' number due).
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        patch.object(
            type(backend), "group_results", side_effect=[redis.ConnectionError("gone"), [3]]
        ),
        patch.object(worker, "execute", execute_seen_in_hand),
    )
    assert r.lrange(tasks.LOG, 0, -1) == ['["cb", [3]]']
    assert backend.get_result(result.callback_id).attempts == 1
    assert held_at_start == [True, True, True]  # the member, the callback twice
    assert "slot failed" not in caplog.text
    assert worker._running == {}


def test_a_slot_claim_whose_reply_is_lost_as_the_worker_stops_gives_its_job_back(r, backend):
    """A slot's call stores its job's outcome and claims the next; the worker is told
    to stop as the call runs, and its reply is lost. The worker's loop ends without a
    free slot's claim, so nothing recovered that call: the worker gives back what it
    may have given before it ends, and that job does not wait, RUNNING under no slot,
    for its lease to run out (and count as lost)."""
    first, second = tasks.record.enqueue("first"), tasks.record.enqueue("second")
    worker = SlotWorker(backend, threads=1)
    claim = backend.broker.claim

    def slot_claim_losing_its_reply_as_the_worker_stops(*args, **kwargs):
        answer = claim(*args, **kwargs)
        if answer[1] is not None and answer[1].job_id == second.id:
            worker.stop()  # SIGTERM, as the call ran
            raise redis.ConnectionError("reply lost")
        return answer

    run_patched(
        worker,
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        slots_on(backend.broker),
        patch.object(backend.broker, "claim", slot_claim_losing_its_reply_as_the_worker_stops),
    )
    assert log(r) == ["first"]
    assert backend.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    stored = backend.get_result(second.id)
    assert stored.status == TaskResultStatus.READY and stored.attempts == 0


def test_a_one_slot_workers_claim_whose_reply_is_lost_as_it_stops_gives_its_job_back(r, backend):
    """The same with ``--threads 1`` (a Worker, no slots): the worker is told to stop
    as its claim runs, and the claim's reply is lost. Its loop then ends with no
    outcome to store, so no later call recovers the lost one: the worker gives back
    what it may have given before it ends."""
    job = tasks.record.enqueue("first")
    worker = Worker(backend)
    claim = worker.broker.claim

    def claim_losing_its_reply_as_the_worker_stops(*args, **kwargs):
        answer = claim(*args, **kwargs)
        if answer[1] is not None:
            worker.stop()  # SIGTERM, as the call ran
            raise redis.ConnectionError("reply lost")
        return answer

    run_patched(
        worker, patch.object(worker.broker, "claim", claim_losing_its_reply_as_the_worker_stops)
    )
    assert log(r) == []
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.READY and stored.attempts == 0


def test_a_refusal_to_the_loop_does_not_forget_a_slot_claims_lost_reply(r, backend):
    """The loop's claim is refused (Redis answered: nothing changed) as a slot's claim
    loses its reply (it may have given a job). The loop's note that its call changed
    nothing must not erase the slot's that its call may have: the job that call gave
    goes back (or runs), and does not wait RUNNING under no slot for its lease."""
    from django_redisqueue.runtime import slots

    first, second = tasks.record.enqueue("first"), tasks.record.enqueue("second")
    worker = SlotWorker(backend, threads=2, burst=True)
    slot_claim, loop_claim, real_reply_lost = (
        backend.broker.claim,
        worker.broker.claim,
        slots.reply_lost,
    )
    loop_calls = []

    def slot_claim_losing_its_reply(*args, **kwargs):
        answer = slot_claim(*args, **kwargs)
        if answer[1] is not None and answer[1].job_id == second.id:
            raise redis.ConnectionError("reply lost")
        return answer

    def loop_claim_refused_once(*args, **kwargs):
        loop_calls.append(1)
        if len(loop_calls) == 2:  # with the first job in a slot
            raise redis.ResponseError("OOM command not allowed")
        return loop_claim(*args, **kwargs)

    def reply_lost_as_the_slot_loses_its_own(exc):
        if threading.current_thread() is threading.main_thread():  # the loop's
            wait_until(lambda: worker.uncertain, 10, "the slot's lost reply")
        return real_reply_lost(exc)

    run_patched(
        worker,
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        slots_on(backend.broker),
        patch.object(backend.broker, "claim", slot_claim_losing_its_reply),
        patch.object(worker.broker, "claim", loop_claim_refused_once),
        patch.object(slots, "reply_lost", reply_lost_as_the_slot_loses_its_own),
    )
    assert backend.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    assert backend.get_result(second.id).status != TaskResultStatus.RUNNING


def test_a_slot_under_max_memory_does_not_erase_another_slots_finding_it_past(r, backend):
    """Two slots look at the process's memory after their jobs at once: the first to
    look finds it under --max-memory and answers last, after the other found it past.
    The worker recycles all the same: the other slot's finding stands, and no slot
    claims a job after it."""
    from django_redisqueue.runtime import worker as worker_module

    for i in range(4):
        tasks.record.enqueue(f"job{i}")
    worker = SlotWorker(backend, threads=2, burst=True, max_memory=1)
    looks: list[int] = []
    lock = threading.Lock()

    def past_limit_answering_last_the_first_time(limit_mb, worker_id):
        with lock:
            looks.append(1)
            first = len(looks) == 1
        if first:  # under the limit, told once the other slot has found it past
            wait_until(lambda: worker.over_memory, 10, "the other slot's look")
            return False
        return True

    run_patched(
        worker,
        patch("django_redisqueue.runtime.slots.BROADCASTS_READ_EVERY", 3600),
        patch.object(worker_module, "past_limit", past_limit_answering_last_the_first_time),
    )
    assert worker.over_memory
    assert sorted(log(r)) == ["job0", "job1"]  # the two in hand as it was found past
    assert worker.jobs_done == 2
