"""The hand-off (docs/protocol.md, "The hand-off"): a job enqueued while a worker stands
idle on its queue is claimed for that worker by the enqueue and reaches it with the
wake-up; the worker takes it before it starts it. Against the real server: who is
handed what, when a job is not handed, and that a give-back, a job never taken, a
worker killed or frozen while idle and a lost reply lose nothing, run nothing twice,
and keep no job waiting for a lease."""

import contextlib
import json
import os
import signal
import threading

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.core.jobs import SUCCESSFUL
from django_redisqueue.runtime.idle import IDLE_MS
from django_redisqueue.store.wire import Claimed, NewJob, Outcome
from tests.conftest import blocked_clients, private_redis, wait_until
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS as K
from tests.support.topology import keys_server, make_client

QUEUES = ["high", "default", "low"]


@pytest.fixture
def broker(backend):
    return backend.broker


def stand_idle(broker, worker, queues=QUEUES):
    """A claim that finds no job, by a worker that will wait: it registers as idle."""
    assert broker.claim(queues, worker, idle_ms=IDLE_MS) == (None, None)


def enqueue(backend, queue="default"):
    return tasks.noop.using(queue_name=queue).enqueue()


@contextlib.contextmanager
def an_idle_worker(r, backend, queues=("default",), prepare=None):
    """A real worker loop in a thread, standing idle on ``queues`` (``prepare`` is
    called with it first); stopped when the block ends."""
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend, list(queues), close_connections=False)
    if prepare is not None:
        prepare(worker)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: r.exists(K.idle_worker(worker.worker_id)), 10, "it to stand idle")
        yield worker
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_job_for_an_idle_worker_reaches_it_running_with_the_wake_up(r, broker, backend):
    stand_idle(broker, "w1")
    assert r.get(K.idle_worker("w1")).endswith("|high,default,low")
    job = enqueue(backend)

    # Claimed for w1 by the enqueue: RUNNING, handed under the hand-off's short lease
    # until w1 takes it, in no queue, no token.
    assert backend.get_result(job.id).status == TaskResultStatus.RUNNING
    now = broker.clock_ms()
    assert now < r.zscore(K.handed, job.id) <= now + broker.handed_ms
    assert r.zscore(K.running, job.id) is None
    assert r.zcard(K.queue("default")) == 0 and r.llen(K.wake("default")) == 0
    assert r.exists(K.idle_worker("w1")) == 0  # the hand-off ends the registration
    assert 0 < r.pttl(K.handoff("w1")) <= broker.handed_ms
    assert r.llen(K.scheduler_wake) == 0  # its idle step is as short as the deadline

    woken = broker.wait_for_work(QUEUES, 0.1, "w1")
    assert isinstance(woken, Claimed)
    assert (woken.job_id, woken.owner) == (job.id, "w1/1")
    assert woken.fields["status"] == "RUNNING" and woken.fields["attempts"] == "1"
    assert woken.fields["workers"] == "w1" and woken.fields["queue"] == "default"
    assert json.loads(woken.payload)["task"] == "tests.support.tasks.noop"
    assert r.exists(K.handoff("w1")) == 0

    # Taken: RUNNING under w1's lease from now on.
    assert broker.heartbeat("w1", {}, {job.id: "w1/1"}) == ([], [])
    assert r.zscore(K.handed, job.id) is None
    assert r.zscore(K.running, job.id) > broker.clock_ms() + broker.lease_ms - 1000

    stored, _ = broker.claim(QUEUES, "w1", Outcome(job.id, "w1/1", SUCCESSFUL, result="null"))
    assert stored is True
    assert backend.get_result(job.id).status == TaskResultStatus.SUCCESSFUL


def test_the_next_claim_takes_the_handed_job_if_the_wait_did_not(r, broker, backend):
    stand_idle(broker, "w1")
    job = enqueue(backend)
    later = enqueue(backend)  # w1 stands idle no more: this one waits in its queue
    assert r.zrange(K.queue("default"), 0, -1) == [later.id]
    _, claimed = broker.claim(QUEUES, "w1", take_handed=True)
    assert claimed is not None and claimed.job_id == job.id
    assert r.exists(K.handoff("w1")) == 0
    # Taken by the claim: under w1's lease.
    assert r.zscore(K.handed, job.id) is None and r.zscore(K.running, job.id) is not None


@pytest.mark.parametrize(
    "why",
    [
        "the queue holds a job",
        "the queue is paused",
        "the job has a limit",
        "the job is due later",
        "a queue before it in the worker's order holds a job",
        "the worker claimed since",
        "the worker will not wait",
    ],
)
def test_a_job_is_not_handed_over_when_the_workers_claim_would_not_take_it(
    r, broker, backend, why
):
    if why == "the worker will not wait":
        assert broker.claim(QUEUES, "w1") == (None, None)
    else:
        stand_idle(broker, "w1")
    options = {}
    if why == "the queue holds a job":
        r.zadd(K.queue("default"), {"x": 1})  # by hand: no enqueue took w1 for it
    elif why == "a queue before it in the worker's order holds a job":
        r.zadd(K.queue("high"), {"x": 1})
    elif why == "the queue is paused":
        broker.operate("pause", "default", [], 0)
    elif why == "the job has a limit":
        options = {"limit": "key", "max_running": 5}
    elif why == "the job is due later":
        options = {"delay": 60}
    elif why == "the worker claimed since":
        broker.claim(["low"], "w1", take_handed=True)
    job = enqueue_with(backend, **options)
    assert backend.get_result(job.id).status == TaskResultStatus.READY
    assert r.exists(K.handoff("w1")) == 0
    if why in ("the queue holds a job", "the job has a limit"):
        # w1 still stands idle on the queue: a token wakes it to claim the job.
        assert r.llen(K.wake("default")) == 1
    elif why == "the worker will not wait":  # no worker waits: no token
        assert r.llen(K.wake("default")) == 0


def enqueue_with(backend, limit=None, max_running=None, delay=None):
    prepared = backend.prepare(tasks.noop, (), {})
    options = json.dumps({"limit": limit, "max_running": max_running}) if limit else ""
    due = backend.broker.clock_ms() + delay * 1000 if delay else 0
    job = NewJob(prepared.id, "default", 0, prepared._payload, due, options=options)
    backend.broker.enqueue([job])
    return backend.get_result(prepared.id)


def test_the_latest_idle_worker_is_handed_the_first_job_and_each_worker_one(r, broker, backend):
    stand_idle(broker, "w1", ["default"])
    stand_idle(broker, "w2", ["low", "default"])
    stand_idle(broker, "w3", ["default"])
    jobs = [enqueue(backend) for _ in range(4)]
    handed = [json.loads(r.lindex(K.handoff(w), 0))[0] for w in ("w3", "w2", "w1")]
    assert handed == [j.id for j in jobs[:3]]
    assert r.zrange(K.queue("default"), 0, -1) == [jobs[3].id]
    # No worker stands idle any more: the job left waits for a busy worker's claim,
    # and no token wakes anyone for it.
    assert r.llen(K.wake("default")) == 0
    assert broker.claim(QUEUES, "w1")[1].job_id == jobs[3].id


def test_an_enqueue_wakes_no_one_while_no_worker_stands_idle_on_its_queue(r, broker, backend):
    stand_idle(broker, "w1", ["low"])
    jobs = [enqueue(backend) for _ in range(3)]
    assert r.llen(K.wake("default")) == 0 and r.exists(K.handoff("w1")) == 0
    # Busy workers take them with their next claims, which need no token.
    assert [broker.claim(QUEUES, "w2")[1].job_id for _ in jobs] == [j.id for j in jobs]


def test_a_worker_of_more_queues_than_it_registers_on_is_woken_for_any(r, broker, backend):
    """A worker registers on its first 16 queues; an enqueue to one past them still
    leaves the token its wait blocks on."""
    order = [f"q{i}" for i in range(16)] + ["default"]
    stand_idle(broker, "w1", order)
    assert r.exists(K.idle("default")) == 0 and r.exists(K.idle_wide) == 1
    job = enqueue(backend)
    assert r.llen(K.wake("default")) == 1 and r.exists(K.handoff("w1")) == 0
    assert broker.wait_for_work(order, 0.1, "w1") == "default"
    assert broker.claim(order, "w1", woken_by="default")[1].job_id == job.id


def test_a_batch_hands_one_job_per_idle_worker_in_order(r, broker, backend):
    stand_idle(broker, "w1", ["default"])
    prepared = [backend.prepare(tasks.noop, (), {}) for _ in range(3)]
    broker.enqueue([NewJob(p.id, "default", 0, p._payload) for p in prepared])
    assert json.loads(r.lindex(K.handoff("w1"), 0))[0] == prepared[0].id
    assert r.zrange(K.queue("default"), 0, -1) == [p.id for p in prepared[1:]]


@pytest.mark.parametrize(
    ("order", "calls"),
    [
        (["high", "low"], [("low", 0), ("high", 0)]),  # the queue first in its order
        (["default"], [("default", 0), ("default", 10)]),  # the higher priority
        (["high", "low"], [("low", 100), ("high", -100), ("low", 0)]),
    ],
)
def test_one_call_never_hands_a_job_past_one_of_higher_priority_it_brings(
    r, broker, backend, order, calls
):
    """The jobs of one call (a batch, or a transaction's at its commit) are all in
    place before any is handed: the idle worker gets the job its own claim would take."""
    stand_idle(broker, "w1", order)
    prepared = [backend.prepare(tasks.noop, (), {}) for _ in calls]
    broker.enqueue(
        [NewJob(p.id, q, n, p._payload) for p, (q, n) in zip(prepared, calls, strict=True)]
    )
    first = min(range(len(calls)), key=lambda i: (order.index(calls[i][0]), -calls[i][1], i))
    assert json.loads(r.lindex(K.handoff("w1"), 0))[0] == prepared[first].id
    waiting = {job for queue in order for job in r.zrange(K.queue(queue), 0, -1)}
    assert waiting == {p.id for i, p in enumerate(prepared) if i != first}


@pytest.mark.django_db(transaction=True)
def test_a_transaction_sending_a_low_then_a_high_job_runs_the_high_one_first(r, backend):
    """The jobs of one transaction go in one call at its commit; one worker stands idle
    on [high, low]: the high job is handed to it, and runs first."""
    from django.db import transaction

    with an_idle_worker(r, backend, ["high", "low"]):
        with transaction.atomic():
            tasks.record.using(queue_name="low").enqueue_on_commit("low")
            tasks.record.using(queue_name="high").enqueue_on_commit("high")
        wait_until(lambda: r.llen(tasks.LOG) == 2, 10, "both jobs to run")
    assert r.lrange(tasks.LOG, 0, -1) == ["high", "low"]


def test_a_give_back_returns_a_handed_job_to_its_queue_and_ends_the_registration(
    r, broker, backend
):
    stand_idle(broker, "w1")
    job = enqueue(backend)
    assert broker.abandon("w1") == [job.id]
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.READY and stored.attempts == 0
    assert r.zrange(K.queue("default"), 0, -1) == [job.id]
    assert r.exists(K.handoff("w1"), K.idle_worker("w1")) == 0
    assert broker.claim(QUEUES, "w2")[1].job_id == job.id


def test_a_worker_stopping_while_idle_gives_back_only_its_handed_job_looking_at_no_other(
    r, broker, backend
):
    others = [enqueue(backend) for _ in range(20)]
    for i, _ in enumerate(others):  # running, under other workers
        assert broker.claim(QUEUES, f"busy{i}")[1] is not None
    kept = enqueue(backend)
    assert broker.claim(QUEUES, "w1")[1].job_id == kept.id  # w1 holds one (by hand)
    stand_idle(broker, "w1")
    handed = enqueue(backend)
    before = keys_server(r).info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
    assert broker.abandon("w1", handed_only=True) == [handed.id]
    looked = keys_server(r).info("commandstats")["cmdstat_hmget"]["calls"] - before
    assert looked < len(others)  # the handed job's fields: not each of the 22 running
    assert backend.get_result(handed.id).status == TaskResultStatus.READY
    assert backend.get_result(kept.id).status == TaskResultStatus.RUNNING
    assert r.exists(K.handoff("w1"), K.idle_worker("w1")) == 0
    assert broker.abandon("w1", handed_only=True) == []  # nothing handed: nothing back


@pytest.mark.parametrize("recover", [True, False])
def test_a_handed_job_not_taken_in_time_goes_back_uncounted_and_is_not_started_late(
    r, broker, backend, recover
):
    stand_idle(broker, "w1")
    job = enqueue(backend)
    r.zadd(K.handed, {job.id: 0})  # the hand-off's deadline passed: w1 never took it
    # Whatever the recovery's flags (a scheduler that just saw Redis fail, or held):
    # the job never ran, and w1 cannot start it now.
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}", recover=recover)
    assert (tick.handed_back, tick.recovered) == (1, 0)
    stored = backend.get_result(job.id)
    assert stored.status == TaskResultStatus.READY
    assert stored.attempts == 0 and r.hget(K.job(job.id), "lost") is None
    assert r.exists(K.handoff("w1")) == 0  # w1 must not start it late
    assert broker.heartbeat("w1", {}, {job.id: "w1/1"}) == ([job.id], [])  # nor take it
    assert r.zrange(K.queue("default"), 0, -1) == [job.id]
    assert r.llen(K.wake("default")) == 1  # an idle worker wakes for it
    assert broker.claim(QUEUES, "w2")[1].job_id == job.id


def test_a_handed_job_taken_in_time_is_the_workers_whatever_the_tick_does(r, broker, backend):
    stand_idle(broker, "w1")
    job = enqueue(backend)
    assert broker.heartbeat("w1", {}, {job.id: "w1/1"}) == ([], [])
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert (tick.handed_back, tick.recovered) == (0, 0)
    assert backend.get_result(job.id).status == TaskResultStatus.RUNNING


def test_a_wait_treats_an_entry_written_by_hand_as_a_wake_up(r, broker):
    r.rpush(K.handoff("w1"), "not json", '["only-an-id"]')
    assert broker.wait_for_work(QUEUES, 0.1, "w1") == ""  # woken: it claims
    assert broker.wait_for_work(QUEUES, 0.1, "w1") == ""
    assert broker.claim(QUEUES, "w1", take_handed=True) == (None, None)


# A worker process killed or frozen while it stands idle, holding a handed job.


@pytest.fixture
def rr():
    with private_redis() as server:
        yield redis.Redis.from_url(server.url, decode_responses=True)


def handed_to_a_frozen_worker(rr, procs):
    """A worker (the default backend: a lease of a minute) stands idle, blocked in its
    wait, and is frozen (SIGSTOP, as ``docker pause`` or a long swap stall would); a
    job is handed to it, which Redis writes into the reply of its blocked wait."""
    backend = task_backends["default"]
    worker = procs.start("runworker", "-v", "2")
    wait_until(lambda: rr.keys(backend.keys.idle_worker("*")), 30, "the worker to stand idle")
    wait_until(lambda: blocked_clients(rr), 30, "the worker to block in its wait")
    os.killpg(worker.pid, signal.SIGSTOP)
    job = tasks.ledger.enqueue(1, 0)
    assert rr.zscore(backend.keys.handed, job.id) is not None
    return backend, worker, job


def test_an_idle_worker_killed_holding_a_handed_job_loses_nothing_and_keeps_no_job_waiting(
    rr, procs, report
):
    backend, worker, job = handed_to_a_frozen_worker(rr, procs)
    procs.kill(worker)
    procs.start("runscheduler")
    procs.start("runworker")
    # Back within the hand-off's deadline, not the minute's lease (the deadline here
    # is a deadline for the whole test, not a measure).
    wait_until(lambda: backend.get_result(job.id).status == SUCCESSFUL, 30, "the job")
    stored = backend.get_result(job.id)
    assert rr.lrange("test:ledger", 0, -1) == ["1"]  # run once, by the second worker
    assert (stored.attempts, int(rr.hget(backend.keys.job(job.id), "lost") or 0)) == (1, 0)
    assert not rr.keys(backend.keys.handoff("*"))
    report(f"idle worker killed holding a handed job: attempts={stored.attempts}, ran once")


def test_a_frozen_idle_worker_never_starts_a_job_handed_to_it_once_it_went_back(rr, procs, report):
    backend, frozen, job = handed_to_a_frozen_worker(rr, procs)
    procs.start("runscheduler")
    procs.start("runworker")
    wait_until(lambda: backend.get_result(job.id).status == SUCCESSFUL, 30, "the job")
    os.killpg(frozen.pid, signal.SIGCONT)  # it reads the reply that carried the job
    procs.expect(frozen, "took it too late", 30)
    assert rr.lrange("test:ledger", 0, -1) == ["1"]  # the thawed worker did not run it
    assert backend.get_result(job.id).attempts == 1
    report("frozen idle worker thawed after its handed job went back: ran once")


def test_a_lost_wait_reply_gives_the_handed_job_back_at_once_uncounted(r, backend):
    """The reply of the wait that carried a handed job is lost (the connection broke):
    the worker gives back what it may have been handed and claims it again, with no
    scheduler running, so nothing waits for a lease."""
    lost = []

    def lose_the_reply_carrying_a_job(worker):
        real_wait = worker.broker.wait_for_work

        def wait(*args, **kwargs):
            woken = real_wait(*args, **kwargs)
            if isinstance(woken, Claimed) and not lost:
                lost.append(woken.job_id)
                raise redis.ConnectionError("the reply was lost")
            return woken

        worker.broker.wait_for_work = wait

    with an_idle_worker(r, backend, prepare=lose_the_reply_carrying_a_job):
        job = tasks.add.enqueue(2, 3)
        wait_until(lambda: backend.get_result(job.id).status == SUCCESSFUL, 10, "the job")
    assert lost == [job.id]
    assert backend.get_result(job.id).attempts == 1
    assert r.hget(K.job(job.id), "lost") is None


def test_a_claim_drops_an_entry_that_names_no_job_the_worker_owns(r, broker, backend):
    stand_idle(broker, "w1")
    job = enqueue(backend)
    ready = enqueue(backend)  # queued: w1 no longer stands idle
    r.hset(K.job(job.id), "owner", "w2/1")  # (by hand: no script does this)
    _, claimed = broker.claim(QUEUES, "w1", take_handed=True)
    assert claimed is not None and claimed.job_id == ready.id  # a claim as usual
    r.rpush(K.handoff("w1"), '["' + job.id + '", "w1/1"]', "[1, 2]", "{}")
    for _ in range(3):
        assert broker.claim(["low"], "w1", take_handed=True) == (None, None)


def test_an_idle_worker_runs_a_handed_job_without_claiming_it(r, backend):
    """A real worker loop: idle, it is handed the job and runs it; no claim of its
    returned it. Then it stops while registered, and its registration ends."""
    claimed_ids = []

    def count_claims(worker):
        claim = worker.broker.claim

        def counted_claim(*args, **kwargs):
            stored, job = claim(*args, **kwargs)
            if job is not None:
                claimed_ids.append(job.job_id)
            return stored, job

        worker.broker.claim = counted_claim

    with an_idle_worker(r, backend, prepare=count_claims) as worker:
        job = tasks.add.enqueue(2, 3)
        wait_until(lambda: backend.get_result(job.id).status == SUCCESSFUL, 10, "the job")
        assert backend.get_result(job.id).return_value == 5
        assert claimed_ids == []  # it came with the wake-up
        wait_until(lambda: r.exists(K.idle_worker(worker.worker_id)), 10, "idle again")
    assert r.exists(K.idle_worker(worker.worker_id), K.handoff(worker.worker_id)) == 0


# Whatever the hand-off's keys hold (written by hand, or by a bug): the enqueue stores
# the job in exactly one place, no script raises, and a worker's claim and wait go on.

junk = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([b"", b"|", b"0|default", b"-1|default", b"1e400|default", b"[]", b"{}"]),
    st.builds(
        lambda stamp, order: f"{stamp}|{order}".encode(), st.integers(), st.text(max_size=20)
    ),
)
of_a_kind = st.one_of(
    st.none(),  # absent
    st.tuples(st.just("as its type"), st.lists(junk, max_size=3)),
    st.tuples(st.sampled_from(["hash", "set"]), junk),  # of another type
)


def write(raw, key, kind, as_its_type):
    if kind is None:
        return
    raw.delete(key)
    if kind[0] == "hash":
        raw.hset(key, "x", kind[1])
    elif kind[0] == "set":
        raw.sadd(key, kind[1])
    else:
        as_its_type(key, kind[1])


@pytest.mark.parametrize("worker_registered", [False, True])
def test_whatever_the_handoff_keys_hold_the_job_is_in_one_place_and_workers_go_on(
    redis_server, backend, worker_registered
):
    raw = make_client(redis_server.url)  # on a cluster, one of the cluster
    broker, keys = backend.broker, backend.keys

    def list_of(key, values):
        if values:
            raw.rpush(key, *values)

    def registry_of(key, values):
        for i, value in enumerate(values):
            raw.zadd(key, {value: i + 1})

    def string_of(key, values):
        if values:
            raw.set(key, values[0])

    @settings(
        max_examples=120,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(standing=of_a_kind, registry=of_a_kind, handoff=of_a_kind)
    def check(standing, registry, handoff):
        raw.flushall()
        if worker_registered:
            stand_idle(broker, "w1", ["default"])
        write(raw, keys.idle_worker("w1"), standing, string_of)
        write(raw, keys.idle("default"), registry, registry_of)
        write(raw, keys.handoff("w1"), handoff, list_of)
        job = tasks.noop.enqueue()
        where = [
            key
            for key in (keys.queue("default"), keys.running, keys.handed)
            if raw.zscore(key, job.id) is not None
        ]
        assert len(where) == 1, where
        status = backend.get_result(job.id).status
        handed = where == [keys.handed]
        assert status == (TaskResultStatus.RUNNING if handed else TaskResultStatus.READY)
        woken = broker.wait_for_work(["default"], 0.01, "w1")
        assert woken is None or isinstance(woken, str | Claimed)
        _, claimed = broker.claim(["default"], "w1", take_handed=True, idle_ms=IDLE_MS)
        if claimed is not None:  # a job it owns, never one of another's
            fields = raw.hmget(keys.job(claimed.job_id), "owner", "status")
            assert fields == [claimed.owner.encode(), b"RUNNING"]
        assert broker.abandon("w1") is not None

    check()


def test_a_handed_unique_job_holds_its_key_through_recovery_failure_and_retry(r, broker, backend):
    """Where the hand-off meets unique keys, recovery and an operator's retry: the key
    is the handed job's from the enqueue on, stays with it while it is recovered and
    queued again, is let go when it fails, and is taken again by the retry."""
    unique = tasks.noop.using(unique_key="report")
    stand_idle(broker, "w1")
    job = unique.enqueue()
    assert backend.get_result(job.id).status == TaskResultStatus.RUNNING  # handed over
    assert unique.enqueue().id == job.id  # the key is held while the job is handed

    r.zadd(K.handed, {job.id: 0})  # w1 died idle: the hand-off's deadline passes
    assert broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}").handed_back == 1
    assert r.exists(K.handoff("w1")) == 0
    assert unique.enqueue().id == job.id  # back in its queue, still the holder

    stand_idle(broker, "w2", ["low"])  # idle on another queue: nothing is handed to it
    _, claimed = broker.claim(QUEUES, "w3")
    assert claimed is not None and claimed.job_id == job.id
    broker.finish(Outcome(job.id, claimed.owner, "FAILED", error="{}"))
    assert r.exists(K.unique("report")) == 0  # let go at its end

    stand_idle(broker, "w1")
    assert broker.operate("retry_failed", "default", [job.id], 0) == 1
    assert r.get(K.unique("report")) == job.id  # the retry takes the key again
    assert unique.enqueue().id == job.id
    # An operator's retry goes through the queue and a token, not the hand-off.
    assert r.zrange(K.queue("default"), 0, -1) == [job.id]
    assert broker.wait_for_work(QUEUES, 0.1, "w1") == "default"
    _, claimed = broker.claim(QUEUES, "w1", take_handed=True)
    assert claimed is not None and claimed.job_id == job.id
    broker.finish(Outcome(job.id, claimed.owner, SUCCESSFUL, result="null"))
    assert r.exists(K.unique("report")) == 0
    assert unique.enqueue().id != job.id  # a new job: the key was free


def test_a_worker_running_broadcasts_is_handed_no_job(r, backend):
    """A worker idle on its queues receives a broadcast: while it runs it, it stands
    idle nowhere, so a job enqueued meanwhile waits in its queue for any worker (here,
    for this one once the broadcast is done) instead of being handed to a busy one."""
    from django_redisqueue.core.fanout import broadcast

    with an_idle_worker(r, backend) as worker:
        broadcast(tasks.block_until_released.job("broadcast", 10))
        try:
            wait_until(lambda: "started:broadcast" in r.lrange(tasks.LOG, 0, -1), 10, "it")
            assert r.exists(K.idle_worker(worker.worker_id)) == 0
            job = tasks.add.enqueue(2, 3)
            assert backend.get_result(job.id).status == TaskResultStatus.READY
            assert r.zrange(K.queue("default"), 0, -1) == [job.id]
        finally:
            r.rpush("test:release", 1)
        wait_until(lambda: backend.get_result(job.id).status == SUCCESSFUL, 10, "the job")


def test_the_scheduler_sleeps_no_longer_than_a_hand_off_waits_to_be_taken():
    """No hand-off wakes the scheduler: it sees a handed job's deadline in time because
    its longest sleep is no longer than that deadline."""
    from django_redisqueue.runtime.scheduler import IDLE_WAIT
    from django_redisqueue.store.broker import HANDED_MS

    assert IDLE_WAIT * 1000 <= HANDED_MS


@pytest.mark.parametrize(("registered_ago", "waits"), [(0.0, 5), (3.2, 2), (5.0, 0), (60.0, 0)])
def test_a_worker_waits_only_while_its_registration_stands(backend, registered_ago, waits):
    """An enqueue wakes only the workers it finds registered: a worker held up since its
    registration (frozen, starved of CPU) claims, and registers, again rather than wait
    past it, and so finds the jobs enqueued meanwhile without a token."""
    from unittest import mock

    from django_redisqueue.runtime.idle import WAIT_TIMEOUT
    from django_redisqueue.runtime.worker import Worker

    worker = Worker(backend)
    worker.queues = ["default"]
    now = [1000.0]
    worker.idle.clock = lambda: now[0]
    worker.idle.claimed(True, now[0] - registered_ago)

    def quiet_wait(*args):  # a whole timeout passes, with no token
        now[0] += WAIT_TIMEOUT

    with mock.patch.object(worker.broker, "wait_for_work", side_effect=quiet_wait) as wait:
        assert worker._wait_for_work() is None
    assert wait.call_count == waits
