"""Dramatiq with ``RedisBroker``: ``actor.send()``, the ``dramatiq`` worker; delayed jobs
with ``send_with_options(delay=...)``, which go through a delay queue the worker holds."""

from __future__ import annotations

import time
from collections.abc import Iterable

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.systems.base import FOUR, ONE, PROCESSES, System, python, redis_url
from bench.systems.stamps import run_job, wait_job

dramatiq.set_broker(RedisBroker(url=redis_url()))


@dramatiq.actor
def job(given: float = 0.0) -> None:
    run_job(given)


@dramatiq.actor
def wait(seconds: float) -> None:
    wait_job(seconds)


WORKER = python("-m", "dramatiq", "bench.systems.dramatiq")


class Dramatiq(System):
    name = "dramatiq"
    title = "Dramatiq"
    distributions = ("dramatiq",)
    settings = (
        "`RedisBroker` with the default middleware and prefetch (twice the threads), "
        "hiredis installed (its docs' one throughput advice); `dramatiq --processes 1 "
        "--threads 1`, so 2 messages prefetched: once both are taken the consumer backs off "
        "(5 ms and up) until the worker's acks go through, which bounds this row "
        "(`dramatiq_queue_prefetch`, documented without advice on a value, lifts it); "
        f"default: one process per core (2) with 8 threads each; {PROCESSES} processes: "
        f"`--processes {PROCESSES} --threads 1`; delayed jobs: `send_with_options(delay=...)`"
    )

    io_settings = (
        "`dramatiq --processes 1 --threads N`: N worker threads in one process, "
        "prefetching twice as many messages (the default); the job is sync"
    )

    def enqueue_one(self, *args: float) -> None:
        job.send(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            job.send_with_options(args=(due,), delay=max(0, round((due - time.time()) * 1000)))

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        for _ in range(jobs):
            wait.send(seconds)

    def commands(self, config: str) -> list[list[str]]:
        if config == FOUR:
            return [[*WORKER, "--processes", str(PROCESSES), "--threads", "1"]]
        return [[*WORKER, "--processes", "1", "--threads", "1"] if config == ONE else WORKER]

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [[*WORKER, "--processes", "1", "--threads", str(at_once)]]


SYSTEM = Dramatiq()
