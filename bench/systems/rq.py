"""RQ, the engine of django-rq: ``Queue.enqueue()``, ``rq worker``; delayed jobs with
``enqueue_at`` and ``rq worker --with-scheduler``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from redis import Redis
from rq import Queue

from bench.systems.base import SERVE, Args, System, python, redis_url
from bench.systems.stamps import run_job

BULK_CHUNK = 1000


def job(given: float = 0.0) -> None:
    run_job(given)


class RQ(System):
    name = "rq"
    title = "RQ"
    distributions = ("rq",)
    settings = (
        "queue `default`; `rq worker --quiet` with the default `Worker` class (a fork per "
        "job), its default concurrency being one job at a time; bulk: `enqueue_many` in "
        f"chunks of {BULK_CHUNK}; delayed jobs: `enqueue_at` and `--with-scheduler` "
        "(which checks every second)"
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
        worker = python("-m", "rq.cli", "worker", "default", "--url", redis_url(), "--quiet")
        return [[*worker, "--with-scheduler"] if config == SERVE else worker]


SYSTEM = RQ()
