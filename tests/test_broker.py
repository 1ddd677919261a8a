"""The Lua scripts against the real server: ordering, fencing, wake-up tokens."""

import pytest

from django_redisqueue.broker import FAILED, SUCCESSFUL, Outcome
from tests import tasks

QUEUES = ["high", "default", "low"]


@pytest.fixture
def broker(backend):
    return backend.broker


def claim_one(broker, queues=QUEUES):
    _, claimed = broker.claim(queues, "w1")
    return claimed[0] if claimed else None


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
    assert claimed.job_id == job.id and claimed.attempts == 1
    assert r.zscore("{drq:default}:running", job.id) is not None
    assert backend.get_result(job.id).status == "RUNNING"

    stranger = Outcome(job.id, "w2/1", SUCCESSFUL, result="3")
    assert broker.finish(stranger) is False
    assert backend.get_result(job.id).status == "RUNNING"

    assert broker.finish(Outcome(job.id, claimed.owner, SUCCESSFUL, result="3")) is True
    stored = backend.get_result(job.id)
    assert (stored.status, stored.return_value, stored.worker_ids) == (SUCCESSFUL, 3, ["w1"])
    assert r.zcard("{drq:default}:running") == 0
    assert 0 < r.ttl(f"{{drq:default}}:job:{job.id}") <= 24 * 3600
    # A second finish by the former owner is rejected too: the job is no longer RUNNING.
    assert broker.finish(Outcome(job.id, claimed.owner, FAILED, error="{}")) is False


def test_finish_and_claim_in_one_call(broker, backend):
    first, second = tasks.noop.enqueue(), tasks.noop.enqueue()
    claimed = claim_one(broker)
    stored, following = broker.claim(
        QUEUES, "w1", [Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")]
    )
    assert stored == [True]
    assert (claimed.job_id, following[0].job_id) == (first.id, second.id)
    assert backend.get_result(first.id).status == SUCCESSFUL


def test_a_batch_claims_from_one_queue_in_order_and_finishes_many(broker, backend):
    high = [tasks.noop.using(queue_name="high").enqueue().id for _ in range(2)]
    default = [tasks.noop.enqueue().id for _ in range(5)]
    _, batch = broker.claim(QUEUES, "w1", count=10)
    assert [job.job_id for job in batch] == high  # a batch never reaches a lower queue
    _, batch = broker.claim(QUEUES, "w1", count=3)
    assert [job.job_id for job in batch] == default[:3]
    outcomes = [Outcome(job.job_id, job.owner, SUCCESSFUL, result="1") for job in batch]
    outcomes.append(Outcome(default[3], "w9/1", SUCCESSFUL))  # not claimed: refused
    stored, rest = broker.claim(QUEUES, "w1", outcomes, count=10)
    assert stored == [True, True, True, False]
    assert [job.job_id for job in rest] == default[3:]
    assert all(backend.get_result(i).return_value == 1 for i in default[:3])


def test_heartbeat_records_the_worker_and_reports_jobs_no_longer_owned(r, broker):
    job = tasks.noop.enqueue()
    claimed = claim_one(broker)
    before = r.zscore("{drq:default}:running", job.id)
    lost = broker.heartbeat("w1", {"pid": 7}, {job.id: claimed.owner, "gone": "w1/1"})
    assert lost == ["gone"]
    assert r.hget("{drq:default}:worker:w1", "pid") == "7"
    assert 0 < r.ttl("{drq:default}:worker:w1") <= 60
    assert r.zscore("{drq:default}:workers", "w1") is not None
    assert r.zscore("{drq:default}:running", job.id) >= before


def test_wake_tokens_stay_bounded_and_are_passed_on(r, broker):
    for _ in range(50):
        tasks.noop.enqueue()
    assert r.llen("{drq:default}:wake:default") == 1
    r.delete("{drq:default}:wake:default")  # an idle worker took it...
    broker.claim(QUEUES, "w1")  # ...and the claim leaves one for the next idle worker
    assert r.llen("{drq:default}:wake:default") == 1


def test_errors_accumulate_as_a_json_list(broker, backend):
    job = tasks.fail.enqueue("x")
    for attempt in (1, 2):
        claimed = claim_one(broker)
        error = f'{{"exception_class_path":"builtins.ValueError","traceback":"try {attempt}"}}'
        broker.finish(Outcome(claimed.job_id, claimed.owner, FAILED, error=error))
        # put it back by hand: retries come with the scheduler
        broker.client.zadd("{drq:default}:queue:default", {job.id: 0})
    stored = backend.get_result(job.id)
    assert [e.traceback for e in stored.errors] == ["try 1", "try 2"]
    assert stored.attempts == 2


def test_only_a_started_job_counts_as_lost_when_its_worker_dies(r, broker, backend):
    ids = [tasks.noop.enqueue().id for _ in range(3)]
    _, batch = broker.claim(QUEUES, "w1", count=3)  # the worker starts the first at once
    done = Outcome(batch[0].job_id, batch[0].owner, SUCCESSFUL, result="null")
    broker.claim(QUEUES, "w1", [done], count=0, starting=batch[1])  # then the second
    for job_id in ids[1:]:  # the worker dies: the leases run out
        r.zadd("{drq:default}:running", {job_id: 0})
    tick = broker.tick("s1", batch=10, lost_limit=2, lost_error="{}")
    assert tick.recovered == 2
    lost = [r.hget(f"{{drq:default}}:job:{i}", "lost") for i in ids[1:]]
    attempts = [backend.get_result(i).attempts for i in ids[1:]]
    assert (lost, attempts) == (["1", None], [1, 0])  # the third was only claimed ahead
    assert sorted(claim_all(broker)) == sorted(ids[1:])  # both back on the queue
