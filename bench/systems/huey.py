"""Huey with ``RedisHuey``: calling the task enqueues it, ``huey_consumer`` runs it;
delayed jobs with ``schedule(eta=...)``, which the consumer's scheduler checks every second."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from huey import RedisHuey

from bench.systems.base import FOUR, PROCESSES, System, python, redis_url
from bench.systems.stamps import run_job

huey = RedisHuey("bench", url=redis_url())


@huey.task()
def job(given: float = 0.0) -> None:
    run_job(given)


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
    default_is_one = True  # -w 1 -k thread is the consumer's default

    def enqueue_one(self, *args: float) -> None:
        job(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            job.schedule(args=(due,), eta=datetime.fromtimestamp(due, UTC))

    def commands(self, config: str) -> list[list[str]]:
        consumer = python("-m", "huey.bin.huey_consumer", "bench.systems.huey.huey", "--quiet")
        if config == FOUR:
            return [[*consumer, "--workers", str(PROCESSES), "--worker-type", "process"]]
        return [[*consumer, "--workers", "1", "--worker-type", "thread"]]


SYSTEM = Huey()
