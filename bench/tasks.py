import os
import time

import redis

from bench.systems.stamps import run_job, wait_job, wait_job_async
from django_redisqueue import task

_client = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    return _client


def record(key: str, value: float | str) -> None:
    client().rpush(key, value)


@task
def noop() -> None:
    return None


@task
def stamp(enqueued_at: float) -> None:
    """Record how long after its enqueue this job started, in ms."""
    record("bench:latency", (time.time() - enqueued_at) * 1000)


@task
def stamp_due(due: float) -> None:
    """Record how long after its due time this delayed job started, in ms."""
    record("bench:lateness", (time.time() - due) * 1000)


@task
def job(given: float = 0.0) -> None:
    """The peer benchmark's job: stamps a file (see bench/systems/stamps.py)."""
    run_job(given)


@task
def wait(seconds: float) -> None:
    """The peer benchmark's I/O-bound job, in a thread."""
    wait_job(seconds)


@task
async def wait_async(seconds: float) -> None:
    """The same as a coroutine."""
    await wait_job_async(seconds)


@task
def group_member(key: str) -> None:
    """A member of a timed group: records when its task returns (s since the epoch)."""
    record(f"{key}:end", time.time())


@task
def group_callback(results: list, key: str) -> None:
    """A timed group's callback: records when it starts."""
    record(f"{key}:start", time.time())


@task
def chaos_job(number: int) -> None:
    """A job of bench/chaos.py: records its number and when it started (ms by Redis's
    clock, as the job's enqueued_at), once per run, so that a job run twice shows twice."""
    seconds, micros = client().time()
    record("bench:chaos:runs", f"{number} {seconds * 1000 + micros // 1000}")


@task
def chaos_slot_job(number: int, ms: int) -> None:
    """A job of bench/chaos.py --threads: as chaos_job, and also which process ran it
    (``start <number> <pid>``), then ``ms`` ms of waiting, then ``end <number> <pid>``."""
    seconds, micros = client().time()
    record("bench:chaos:runs", f"{number} {seconds * 1000 + micros // 1000}")
    record("bench:chaos:slots", f"start {number} {os.getpid()}")
    time.sleep(ms / 1000)
    record("bench:chaos:slots", f"end {number} {os.getpid()}")
