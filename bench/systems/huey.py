"""Huey with ``RedisHuey``: calling the task enqueues it, ``huey_consumer`` runs it;
delayed jobs with ``schedule(eta=...)``, which the consumer's scheduler checks every second."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from huey import RedisHuey

from bench.systems.base import FOUR, PROCESSES, System, python, redis_url
from bench.systems.stamps import run_job, wait_job

huey = RedisHuey("bench", url=redis_url())


@huey.task()
def job(given: float = 0.0) -> None:
    run_job(given)


@huey.task()
def wait(seconds: float) -> None:
    wait_job(seconds)


CONSUMER = python("-m", "huey.bin.huey_consumer", "bench.systems.huey.huey", "--quiet")


class Huey(System):
    name = "huey"
    title = "Huey"
    distributions = ("huey",)
    settings = (
        "`RedisHuey` with its defaults (blocking dequeue, results kept, `None` not "
        "stored); `huey_consumer -w 1 -k thread --quiet`, which is also its default "
        f"concurrency; {PROCESSES} processes: `-w {PROCESSES} -k process` (its docs: raise "
        "`-w` for throughput, processes for CPU-bound work); delayed jobs: "
        "`schedule(eta=...)`, the scheduler checking every second (`-s 1`, the default)"
    )
    io_settings = (
        "`huey_consumer -k thread -w N`: N worker threads in one process (its greenlet "
        "workers need gevent, not installed here); the job is sync"
    )
    default_is_one = True  # -w 1 -k thread is the consumer's default

    def enqueue_one(self, *args: float) -> None:
        job(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            job.schedule(args=(due,), eta=datetime.fromtimestamp(due, UTC))

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        for _ in range(jobs):
            wait(seconds)

    def commands(self, config: str) -> list[list[str]]:
        if config == FOUR:
            return [[*CONSUMER, "--workers", str(PROCESSES), "--worker-type", "process"]]
        return [[*CONSUMER, "--workers", "1", "--worker-type", "thread"]]

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [[*CONSUMER, "--workers", str(at_once), "--worker-type", "thread"]]


SYSTEM = Huey()
