"""The Lua scripts against the real server: ordering, fencing, wake-up tokens."""

import pytest
import redis

from django_redisqueue import ResultTimeout
from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.runtime.idle import IDLE_MS
from django_redisqueue.store import scripts
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.wire import ENQUEUE_BATCH_JOBS, NewJob, Outcome
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS
from tests.support.servers import free_port
from tests.support.topology import ON_CLUSTER, keys_server, scripts_run

QUEUES = ["high", "default", "low"]


@pytest.fixture
def broker(backend):
    return backend.broker


def claim_one(broker, queues=QUEUES):
    return broker.claim(queues, "w1")[1]


def claim_all(broker, queues=QUEUES):
    ids = []
    while claimed := claim_one(broker, queues):
        ids.append(claimed.job_id)
    return ids


def test_priority_then_fifo_inside_a_queue(broker):
    low = [tasks.noop.using(priority=-5).enqueue().id for _ in range(3)]
    normal = [tasks.noop.enqueue().id for _ in range(3)]
    high = [tasks.noop.using(priority=100).enqueue().id for _ in range(3)]
    lowest = tasks.noop.using(priority=-100).enqueue().id

    assert claim_all(broker) == high + normal + low + [lowest]


def test_strict_priority_across_queues(broker):
    low = [tasks.noop.using(queue_name="low", priority=100).enqueue().id for _ in range(2)]
    default = [tasks.noop.enqueue().id for _ in range(2)]
    high = [tasks.noop.using(queue_name="high", priority=-100).enqueue().id for _ in range(2)]

    assert claim_all(broker) == high + default + low


def test_claim_records_a_lease_and_finish_is_fenced(r, broker, backend):
    job = tasks.add.enqueue(1, 2)
    claimed = claim_one(broker)
    assert claimed.job_id == job.id and claimed.fields["attempts"] == "1"
    assert r.zscore(DEFAULT_KEYS.running, job.id) is not None
    assert backend.get_result(job.id).status == "RUNNING"

    stranger = Outcome(job.id, "w2/1", SUCCESSFUL, result="3")
    assert broker.finish(stranger) is False
    assert backend.get_result(job.id).status == "RUNNING"

    assert broker.finish(Outcome(job.id, claimed.owner, SUCCESSFUL, result="3")) is True
    stored = backend.get_result(job.id)
    assert (stored.status, stored.return_value, stored.worker_ids) == (SUCCESSFUL, 3, ["w1"])
    assert r.zcard(DEFAULT_KEYS.running) == 0
    assert 0 < r.ttl(DEFAULT_KEYS.job(job.id)) <= 24 * 3600
    # Its hash still names its last owner, which fences nothing once the job has ended:
    # a second finish by the former owner is rejected, and its heartbeat renews nothing.
    assert r.hget(DEFAULT_KEYS.job(job.id), "owner") == claimed.owner
    assert broker.finish(Outcome(job.id, claimed.owner, FAILED, error="{}")) is False
    assert broker.heartbeat("w1", {}, {job.id: claimed.owner}) == ([job.id], [])
    assert r.zcard(DEFAULT_KEYS.running) == 0
    assert backend.get_result(job.id).status == SUCCESSFUL


def test_finish_and_claim_in_one_call(broker, backend):
    first, second = tasks.noop.enqueue(), tasks.noop.enqueue()
    claimed = claim_one(broker)
    stored, following = broker.claim(
        QUEUES, "w1", Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")
    )
    assert stored is True
    assert (claimed.job_id, following.job_id) == (first.id, second.id)
    assert backend.get_result(first.id).status == SUCCESSFUL
    stranger = Outcome(second.id, "w9/1", SUCCESSFUL)
    assert broker.claim(QUEUES, "w1", stranger) == (False, None)  # refused, nothing left


def test_claiming_starts_the_job_by_redis_clock(r, broker, backend):
    job = tasks.noop.enqueue()
    claimed = claim_one(broker)
    seconds, micros = r.time()
    redis_now = seconds * 1000 + micros // 1000
    stored = backend.get_result(job.id)
    assert stored.status == "RUNNING"
    assert stored.enqueued_at <= stored.started_at == stored.last_attempted_at
    assert abs(int(claimed.fields["started_at"]) - redis_now) < 5000
    assert abs(r.zscore(DEFAULT_KEYS.running, job.id) - (redis_now + 60_000)) < 5000


def test_heartbeat_records_the_worker_and_reports_jobs_no_longer_owned(r, broker):
    job = tasks.noop.enqueue()
    claimed = claim_one(broker)
    before = r.zscore(DEFAULT_KEYS.running, job.id)
    lost, _ = broker.heartbeat("w1", {"pid": 7}, {job.id: claimed.owner, "gone": "w1/1"})
    assert lost == ["gone"]
    assert r.hget(DEFAULT_KEYS.worker("w1"), "pid") == "7"
    assert 0 < r.ttl(DEFAULT_KEYS.worker("w1")) <= 60
    assert r.zscore(DEFAULT_KEYS.workers, "w1") is not None
    assert r.zscore(DEFAULT_KEYS.running, job.id) >= before


def stand_idle_on_every_queue(broker, worker="w0"):
    """A worker idle on more queues than it registers on: every enqueue wakes it."""
    order = [f"q{i}" for i in range(16)] + QUEUES
    assert broker.claim(order, worker, idle_ms=IDLE_MS) == (None, None)


def test_wake_tokens_stay_bounded_and_are_passed_on(r, broker):
    stand_idle_on_every_queue(broker)
    for _ in range(50):
        tasks.noop.enqueue()
    assert r.llen(DEFAULT_KEYS.wake("default")) == 1
    r.delete(DEFAULT_KEYS.wake("default"))  # an idle worker took it...
    broker.claim(QUEUES, "w1", woken_by="default")  # ...and leaves one for the next
    assert r.llen(DEFAULT_KEYS.wake("default")) == 1
    r.delete(DEFAULT_KEYS.wake("default"))
    broker.claim(QUEUES, "w1")  # a busy worker took no token: it passes none on
    assert r.llen(DEFAULT_KEYS.wake("default")) == 0


def test_a_token_taken_from_one_queue_is_passed_on_after_a_claim_from_another(r, broker):
    """A worker serving high and default, woken by default's token, runs a high job:
    the workers that serve default alone must still be woken for its jobs."""
    tasks.noop.enqueue()
    tasks.noop.using(queue_name="high").enqueue()
    r.delete(DEFAULT_KEYS.wake("default"), DEFAULT_KEYS.wake("high"))  # taken
    _, claimed = broker.claim(["high", "default"], "w1", woken_by="default")
    assert claimed.fields["queue"] == "high"
    assert r.llen(DEFAULT_KEYS.wake("default")) == 1


def test_errors_accumulate_as_a_json_list(broker, backend):
    job = tasks.fail.enqueue("x")
    for attempt in (1, 2):
        claimed = claim_one(broker)
        error = f'{{"exception_class_path":"builtins.ValueError","traceback":"try {attempt}"}}'
        broker.finish(Outcome(claimed.job_id, claimed.owner, FAILED, error=error))
        # put it back by hand, as a retry would: retries come with the scheduler
        broker.client.hset(DEFAULT_KEYS.job(job.id), "status", "READY")
        broker.client.zadd(DEFAULT_KEYS.queue("default"), {job.id: 0})
    stored = backend.get_result(job.id)
    assert [e.traceback for e in stored.errors] == ["try 1", "try 2"]
    assert stored.attempts == 2


def test_a_recovered_or_given_back_job_keeps_its_place_in_the_queue(r, broker, backend):
    ids = [tasks.noop.enqueue().id for _ in range(4)]
    first = claim_one(broker)
    second = claim_one(broker)
    later = tasks.noop.enqueue().id
    broker.finish(Outcome(second.job_id, second.owner, "RELEASE"))  # given back
    r.zadd(DEFAULT_KEYS.running, {first.job_id: 0})  # its worker died: lease passed
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert (tick.recovered, r.hget(DEFAULT_KEYS.job(first.job_id), "lost")) == (1, "1")
    assert claim_all(broker) == [*ids, later]  # FIFO as enqueued, not as given back
    assert backend.get_result(ids[1]).attempts == 1  # the given-back attempt is forgotten


def test_abandon_gives_back_uncounted_what_a_lost_claim_reply_took(r, broker, backend):
    ids = [tasks.noop.enqueue().id for _ in range(2)]
    claimed = claim_one(broker)
    other = broker.claim(QUEUES, "w2")[1]
    assert broker.abandon("w1") == [claimed.job_id]
    stored = backend.get_result(ids[0])
    assert (stored.status, stored.attempts, stored.worker_ids) == ("READY", 0, [])
    assert (stored.started_at, stored.last_attempted_at) == (None, None)  # never ran
    assert backend.get_result(other.job_id).status == "RUNNING"  # another worker's: kept
    assert claim_one(broker).job_id == ids[0]


def test_retrying_all_failed_jobs_leaves_cancelled_ones(r, broker, backend):
    cancelled, failed = tasks.noop.enqueue(), tasks.noop.enqueue()
    backend.cancel(cancelled.id)
    claimed = claim_one(broker)
    broker.finish(Outcome(claimed.job_id, claimed.owner, FAILED, error="{}"))
    assert r.zrange(DEFAULT_KEYS.failed("default"), 0, -1) == [failed.id]
    assert broker.operate("retry_failed", "default", limit=100) == 1
    assert claim_all(broker) == [failed.id]
    assert backend.get_result(cancelled.id).status == FAILED


def test_the_failed_index_expires_with_its_results_and_is_trimmed(r, broker):
    tasks.noop.enqueue()
    claimed = claim_one(broker)
    broker.finish(Outcome(claimed.job_id, claimed.owner, FAILED, error="{}"))
    index = DEFAULT_KEYS.failed("default")
    assert 0 < r.ttl(index) <= 24 * 3600
    r.zadd(index, {"expired-long-ago": 1})
    broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert r.zrange(index, 0, -1) == [claimed.job_id]


def test_wait_after_an_operator_retry_blocks_instead_of_spinning(r, broker, backend):
    job = tasks.noop.enqueue()
    assert broker.watch(job.id) == "READY"  # a waiter: the failure leaves a done token
    claimed = claim_one(broker)
    broker.finish(Outcome(claimed.job_id, claimed.owner, FAILED, error="{}"))
    assert r.llen(DEFAULT_KEYS.done(job.id)) == 1
    assert broker.operate("retry_failed", "default", [job.id]) == 1

    def sent():
        stats = keys_server(r).info("commandstats")
        calls = ("fcall", "evalsha", "blmove")
        return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in calls)

    before = sent()
    with pytest.raises(ResultTimeout):
        backend.wait(job.id, timeout=0.3)
    assert sent() - before < 10  # one watch and one blocking wait per second, not a loop


def test_a_queue_member_whose_key_is_not_a_hash_is_failed_not_raised(r, broker):
    r.set(DEFAULT_KEYS.job("oops"), "a string, not a job")
    r.zadd(DEFAULT_KEYS.queue("default"), {"oops": 0})
    good = tasks.noop.enqueue()
    assert claim_one(broker).job_id == good.id
    failed = r.zrange(DEFAULT_KEYS.failed("default"), 0, -1)
    assert len(failed) == 1 and failed[0].startswith("malformed-")
    assert "not a hash" in r.hget(DEFAULT_KEYS.job(failed[0]), "errors")


def test_garbage_in_a_job_hash_never_makes_a_script_fail(r, broker, backend):
    job = tasks.noop.enqueue()
    key = DEFAULT_KEYS.job(job.id)
    r.hset(key, mapping={"attempts": "many", "lost": "x", "priority": "high", "score": "?"})
    claimed = claim_one(broker)
    assert claimed.fields["attempts"] == "1"
    r.zadd(DEFAULT_KEYS.running, {job.id: 0})
    assert broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}").recovered == 1
    assert claim_one(broker).job_id == job.id  # requeued with a fresh place


# A key of the protocol's spoilt by hand (another type): no move fails half-way, no job
# it did not hold is lost, and the other queues go on.


def tick(broker):
    return broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")


def test_a_running_set_of_another_type_loses_no_job(r, broker, backend):
    running = tasks.noop.enqueue()
    first = claim_one(broker)
    r.delete(backend.keys.running)
    r.rpush(backend.keys.running, "spoilt")
    waiting = tasks.noop.enqueue()
    assert claim_one(broker).job_id == waiting.id  # replaced: the claim goes on
    assert r.zscore(backend.keys.running, waiting.id) is not None
    # The heartbeat of the worker running the first puts its lease back.
    assert broker.heartbeat("w1", {}, {running.id: first.owner}) == ([], [])
    assert r.zscore(backend.keys.running, running.id) is not None
    assert broker.finish(Outcome(running.id, first.owner, SUCCESSFUL, result="1"))
    assert backend.get_result(running.id).status == SUCCESSFUL


def test_an_arrival_counter_holding_garbage_loses_no_job(r, broker, backend):
    before = tasks.noop.enqueue()
    due = tasks.noop.using(delay=3600).enqueue()
    r.set(backend.keys.seq, "abc")
    r.zadd(backend.keys.delayed("default"), {due.id: 0})
    assert tick(broker).promoted == 1  # it was lost here: out of its delayed set
    after = tasks.noop.enqueue()
    assert claim_all(broker) == [before.id, due.id, after.id]  # FIFO kept


def test_a_queue_of_another_type_holds_back_no_other_queue(r, broker, backend):
    r.set(backend.keys.queue("default"), "spoilt")
    low = tasks.noop.using(queue_name="low").enqueue()
    assert claim_one(broker).job_id == low.id  # past the spoilt queue
    again = tasks.noop.enqueue()  # replaces it: it held no job
    assert claim_one(broker).job_id == again.id
    r.set(backend.keys.delayed("default"), "spoilt")
    later = tasks.noop.using(delay=3600).enqueue()
    r.zadd(backend.keys.delayed("default"), {later.id: 0})
    assert tick(broker).promoted == 1
    assert claim_one(broker).job_id == later.id


def test_a_paused_queue_keeps_its_jobs_in_place_and_empty_queues_cost_one_command(
    r, broker, backend
):
    held = [tasks.noop.using(queue_name="high", priority=p).enqueue() for p in (0, 5, 0)]
    places = r.zrange(backend.keys.queue("high"), 0, -1, withscores=True)
    broker.operate("pause", "high")
    job = tasks.noop.enqueue()
    empty = [f"empty-{i}" for i in range(50)]
    server = keys_server(r)
    server.config_resetstat()
    assert claim_one(broker, [*empty, "high", "default"]).job_id == job.id
    stats = server.info("commandstats")
    # One ZMPOP over the empty queues and the paused one, whose job goes back; then
    # the one queue left, by ZPOPMIN. Without ZMPOP (Redis 6.2), a ZPOPMIN each. The
    # paused queue's question is asked only of the two queues that held jobs.
    if int(server.info("server")["redis_version"].split(".")[0]) >= 7:
        assert stats["cmdstat_zmpop"]["calls"] == 1
        assert stats["cmdstat_zpopmin"]["calls"] == 1
    else:
        assert stats["cmdstat_zpopmin"]["calls"] == len(empty) + 2
    assert stats["cmdstat_sismember"]["calls"] == 2
    assert r.zrange(backend.keys.queue("high"), 0, -1, withscores=True) == places
    broker.operate("resume", "high")
    assert claim_all(broker) == [held[1].id, held[0].id, held[2].id]


@pytest.mark.parametrize("queues", [2, 1001, 7998])
def test_a_claim_over_thousands_of_queues_takes_the_job_of_the_last(broker, queues):
    """A worker passes every queue's name (QUEUES empty: every queue used), as many as a
    script takes; the empty ones are skipped a thousand at a time."""
    job = tasks.noop.enqueue()
    order = [f"e{i}" for i in range(queues - 1)] + ["default"]
    assert claim_one(broker, order).job_id == job.id


def test_a_pinned_broker_holds_one_connection_and_is_the_pool_when_redis_is_down(broker):
    pinned = broker.pinned()
    if ON_CLUSTER:  # a cluster client routes each call itself: it is kept
        assert pinned is broker
        return
    assert pinned is not broker
    held = pinned.client.connection
    job = tasks.noop.enqueue()
    assert pinned.claim(["default"], "w1")[1].job_id == job.id
    assert pinned.client.connection is held  # the same connection, call after call
    pinned.close()
    assert pinned.client.connection is None
    down = Broker(redis.Redis(port=free_port()), broker.keys, lease=60, result_ttl=60)
    assert down.pinned() is down


def test_a_paused_set_of_another_type_pauses_nothing(r, broker, backend):
    r.set(backend.keys.paused, "spoilt")
    job = tasks.noop.enqueue()
    assert claim_one(broker).job_id == job.id
    assert broker.operate("pause", "default") == 1  # replaced
    tasks.noop.enqueue()
    assert claim_one(broker) is None


def test_a_running_set_of_another_type_loses_no_limited_job(r, broker, backend):
    limited = [tasks.limited_two.enqueue(f"L{i}", 0) for i in range(4)]
    claim_one(broker)
    r.delete(backend.keys.running)
    r.set(backend.keys.running, "spoilt")
    assert claim_one(broker).job_id == limited[1].id  # its slot read as held, then claimed
    claim_all(broker)
    # None lost: each RUNNING, or parked. (The first's lease was in the running set
    # replaced: until its worker's heartbeat puts it back, its slot is not counted.)
    parked = set(r.zrange(backend.keys.limit("tests.support.tasks.limited_two", "parked"), 0, -1))
    for job in limited:
        assert backend.get_result(job.id).status == "RUNNING" or job.id in parked


def test_the_queues_used_of_another_type_are_replaced(r):
    from django_redisqueue.compat import task_backends

    backend = task_backends["anyqueue"]
    r.set(backend.keys.known_queues, "spoilt")
    tasks.noop.using(backend="anyqueue", queue_name="alpha").enqueue()
    assert backend.queries.known_queues() == ["alpha"]


@pytest.mark.parametrize("wait", ["work", "schedule"])
def test_a_wake_up_list_of_another_type_is_deleted_by_the_wait(r, broker, backend, wait):
    key = backend.keys.wake("default") if wait == "work" else backend.keys.scheduler_wake
    r.set(key, "spoilt")
    if wait == "work":
        assert broker.wait_for_work(["default"], 0.1) is None
    else:
        assert broker.wait_for_schedule(0.1) is False
    assert r.type(key) == "none"


def test_a_delayed_job_is_cancelled_whatever_its_queue_holds(r, backend):
    job = tasks.noop.using(delay=3600).enqueue()
    r.set(backend.keys.queue("default"), "spoilt")
    job.cancel()
    assert backend.get_result(job.id).status == FAILED
    assert r.zcard(backend.keys.delayed("default")) == 0


def test_a_worker_record_of_another_type_is_replaced_by_its_heartbeat(r, broker, backend):
    r.set(backend.keys.worker("w1"), "spoilt")
    broker.heartbeat("w1", {"queues": "default"}, {})
    assert r.hgetall(backend.keys.worker("w1")) == {"queues": "default"}


def test_an_arrival_counter_past_what_a_score_holds_starts_again_in_order(r, broker, backend):
    first = tasks.noop.enqueue()
    r.set(backend.keys.seq, 2**53)
    later = [tasks.noop.enqueue() for _ in range(30)]
    assert claim_all(broker) == [first.id, *(job.id for job in later)]


def test_a_cursor_past_what_lua_writes_exactly_reads_each_message_once(r, broker, backend):
    broker.heartbeat("w1", {}, {})
    r.zadd(backend.keys.broadcast_cursors, {"w1": 10**15 + 1})
    r.set(backend.keys.broadcast_seq, 10**15 + 1)
    number = broker.broadcast("{}")
    assert [n for n, _ in broker.receive("w1", ["default"]).messages] == [number]
    assert broker.receive("w1", ["default"], [(number, SUCCESSFUL)]).messages == []


def test_a_scheduler_can_leave_expired_leases_alone(r, broker):
    tasks.noop.enqueue()
    claimed = claim_one(broker)
    r.zadd(DEFAULT_KEYS.running, {claimed.job_id: 0})
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}", recover=False)
    assert tick.recovered == 0 and r.zscore(DEFAULT_KEYS.running, claimed.job_id) == 0
    assert broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}").recovered == 1


def test_a_finished_job_left_in_a_queue_or_delayed_set_never_runs_again(r, broker, backend):
    cancelled = tasks.noop.using(delay=600).enqueue()
    backend.cancel(cancelled.id)
    r.zadd(DEFAULT_KEYS.delayed("default"), {cancelled.id: 0})  # left there by hand, due
    r.zadd(DEFAULT_KEYS.queue("default"), {cancelled.id: 0})
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert tick.promoted == 0
    assert claim_one(broker) is None
    assert backend.get_result(cancelled.id).status == FAILED


def test_a_retry_without_an_error_keeps_the_error_list_readable(r, broker, backend):
    job = tasks.noop.enqueue()
    first = claim_one(broker)
    broker.finish(Outcome(job.id, first.owner, "RETRY", error='{"traceback":"one"}'))
    r.zadd(DEFAULT_KEYS.delayed("default"), {job.id: 0})
    broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    second = claim_one(broker)
    broker.finish(Outcome(job.id, second.owner, "RETRY", error=""))
    assert [e.traceback for e in backend.get_result(job.id).errors] == ["one"]


def test_the_scripts_build_the_keys_the_key_schema_names(r, backend):
    """lua/lib/keys.lua completes the one key it is given as keys.py spells every key."""
    names = list(backend.keys.fixed_keys)
    script = r.register_script(scripts.read_library()["keys"] + f"return {{{', '.join(names)}}}")
    built = script(keys=backend.keys.script_keys)
    assert dict(zip(names, built, strict=True)) == backend.keys.fixed_keys


def test_a_batch_is_stored_in_order_and_a_taken_id_is_skipped_alone(r, broker, backend):
    stand_idle_on_every_queue(broker)
    taken = tasks.noop.enqueue()
    now = broker.clock_ms()
    payload = backend.prepare(tasks.noop, (), {})._payload
    jobs = [
        NewJob("a1", "default", 0, payload),
        NewJob(taken.id, "default", 0, payload),
        NewJob("a2", "high", 0, payload),
        NewJob("a3", "default", 5, payload),
        NewJob("a4", "default", 0, payload, due_ms=now + 60_000),
        NewJob("a5", "default", 0, payload),
    ]
    enqueued = broker.enqueue(jobs)
    assert enqueued[1] is None
    assert all(at is not None and at >= now for i, at in enumerate(enqueued) if i != 1)
    assert r.zrange(backend.keys.queue("default"), 0, -1) == [
        "a3",
        taken.id,
        "a1",
        "a5",
    ]
    assert r.zrange(backend.keys.queue("high"), 0, -1) == ["a2"]
    assert r.zrange(backend.keys.delayed("default"), 0, -1) == ["a4"]
    # One wake-up per queue, whatever the batch's size.
    assert r.llen(backend.keys.wake("default")) == 1


def test_a_large_batch_is_cut_into_calls_sent_in_one_round_trip(r, broker, backend):
    payload = backend.prepare(tasks.noop, (), {})._payload
    jobs = [NewJob(f"j{i}", "default", 0, payload) for i in range(2 * ENQUEUE_BATCH_JOBS + 1)]
    keys_server(r).config_resetstat()
    assert None not in broker.enqueue(jobs)
    assert scripts_run(r) == 3
    assert r.zrange(backend.keys.queue("default"), 0, -1) == [job.job_id for job in jobs]
