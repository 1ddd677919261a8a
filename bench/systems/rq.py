"""RQ, the engine of django-rq: ``Queue.enqueue()``, ``rq worker`` with ``SimpleWorker``;
delayed jobs with ``enqueue_at`` and ``rq worker --with-scheduler``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from redis import Redis
from rq import Queue

from bench.systems.base import FOUR, PROCESSES, SERVE, Args, System, python, redis_url
from bench.systems.stamps import run_job

BULK_CHUNK = 1000
# Runs each job in the worker's own process, as every other system here does. The default
# Worker forks a work horse per job; RQ's notes on performance (README, docs/benchmark.md)
# measure SimpleWorker about 6.5 times as fast and advise it for jobs of a few ms.
WORKER_CLASS = "rq.worker.SimpleWorker"


def job(given: float = 0.0) -> None:
    run_job(given)


class RQ(System):
    name = "rq"
    title = "RQ"
    distributions = ("rq",)
    settings = (
        f"queue `default`, results kept 500 s and pickle (the defaults); `rq worker --quiet "
        f"--worker-class {WORKER_CLASS}`: each job runs in the worker process, without the "
        "default `Worker`'s fork per job, as RQ's notes on performance advise for jobs of "
        "single-digit milliseconds and as every other system here runs its jobs; its "
        f"default concurrency is one job at a time; {PROCESSES} processes: `rq worker-pool "
        f"-n {PROCESSES}` of the same class; bulk: `enqueue_many` in chunks of {BULK_CHUNK}; "
        "delayed jobs: `enqueue_at` and `--with-scheduler` (which checks every second and "
        "keeps due times in whole seconds)"
    )
    io_settings = (
        "none: a worker runs one job at a time (`SimpleWorker` in its own process, the "
        "default `Worker` in a work horse it forks per job), so many at once takes as many "
        "workers; left out, its rate would be one job per wait"
    )
    has_bulk = True
    default_is_one = True  # more than one job at a time means more workers

    def connect(self) -> None:
        self.queue = Queue("default", connection=Redis.from_url(redis_url()))

    def enqueue_one(self, *args: float) -> None:
        self.queue.enqueue(job, *args)

    def enqueue_bulk(self, calls: Sequence[Args]) -> None:
        for i in range(0, len(calls), BULK_CHUNK):
            self.queue.enqueue_many(
                [Queue.prepare_data(job, args) for args in calls[i : i + BULK_CHUNK]]
            )

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            self.queue.enqueue_at(datetime.fromtimestamp(due, UTC), job, due)

    def commands(self, config: str) -> list[list[str]]:
        common = ["--url", redis_url(), "--worker-class", WORKER_CLASS, "--quiet"]
        if config == FOUR:
            return [
                python("-m", "rq.cli", "worker-pool", "default", "-n", str(PROCESSES), *common)
            ]
        worker = python("-m", "rq.cli", "worker", "default", *common)
        return [[*worker, "--with-scheduler"] if config == SERVE else worker]


SYSTEM = RQ()
