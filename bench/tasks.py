import os
import time

import redis

from django_redisqueue import task

_client = None


@task
def noop() -> None:
    return None


@task
def stamp(enqueued_at: float) -> None:
    """Record how long after its enqueue this job started, in ms."""
    global _client
    started = time.time()
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _client.rpush("bench:latency", (started - enqueued_at) * 1000)


@task
def stamp_due(due: float) -> None:
    """Record how long after its due time this delayed job started, in ms."""
    global _client
    started = time.time()
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _client.rpush("bench:lateness", (started - due) * 1000)
