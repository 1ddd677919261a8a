"""The read side (``queries.py``) has one lenient rule: a key of another type, spoilt by
hand, reads as absent or empty; every other error Redis answers is raised, never read as
"no such job" or "no workers"."""

import pytest
import redis

from django_redisqueue.store.queries import Queries, QueueCounts
from tests.support import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(r, backend):
    return tasks.noop.enqueue()


@pytest.fixture
def refused(r, redis_server, backend):
    """Queries made by a Redis user whose ACL refuses the commands a read sends."""
    r.execute_command(
        "ACL", "SETUSER", "reader", "on", "nopass", "~*", "+@all", "-hgetall", "-hmget", "-zcard"
    )
    client = redis.Redis.from_url(redis_server.url, username="reader", password="")
    try:
        yield Queries(client, backend.keys, result_ttl=60)
    finally:
        client.close()
        r.execute_command("ACL", "DELUSER", "reader")


def every_read(queries, job_id, keys):
    return {
        "get_job": lambda: queries.get_job(job_id),
        "jobs": lambda: queries.jobs([job_id], "status"),
        "worker_info": lambda: queries.worker_info(["w1"]),
        "periodic_states": lambda: queries.periodic_states(["nightly"]),
        "finished_per_minute": lambda: queries.finished_per_minute(2),
        "counts": lambda: queries.counts(["default"]),
        "queue_length": lambda: queries.queue_length("default"),
        "delayed_count": lambda: queries.delayed_count(["default"]),
        "size": lambda: queries.size(keys.running),
    }


READS = ["get_job", "jobs", "worker_info", "periodic_states", "finished_per_minute", "counts"]
READS += ["queue_length", "delayed_count", "size"]


@pytest.mark.parametrize("read", READS)
def test_a_refused_read_is_raised_not_read_as_absent(refused, job, backend, read):
    with pytest.raises(redis.exceptions.NoPermissionError):
        every_read(refused, job.id, backend.keys)[read]()


def test_keys_of_another_type_read_as_absent_or_empty(r, backend, job):
    keys = backend.keys
    for key in (
        keys.job(job.id),
        keys.entries(job.id),
        keys.worker("w1"),
        keys.periodic_schedule("nightly"),
        keys.queue("default"),
        keys.delayed("default"),
        keys.running,
        keys.group_members("g1"),
    ):
        r.delete(key)
        r.sadd(key, "spoilt")
    r.delete(keys.failed("default"))
    r.set(keys.failed("default"), "spoilt")
    queries = backend.queries

    assert queries.get_job(job.id) is None
    assert queries.jobs([job.id], "status") == [{}]
    assert queries.worker_info(["w1"]) == [{}]
    assert queries.periodic_states(["nightly"])[1] == [{}]
    assert queries.queue_length("default") == 0
    assert queries.delayed_count(["default"]) == 0
    assert queries.size(keys.running) == 0
    assert queries.counts(["default"])["default"] == QueueCounts(
        ready=0, delayed=0, failed=0, paused=False
    )
    assert queries.group_members("g1") == []
    assert queries.group_size("g1") == 0
