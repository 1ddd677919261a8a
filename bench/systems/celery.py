"""Celery with the Redis broker: ``task.delay()``, ``celery worker``; delayed jobs with
``apply_async(eta=...)``, which the worker fetches at once and holds until due."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from celery import Celery

from bench.systems.base import ONE, System, python, redis_url
from bench.systems.stamps import run_job

# No result backend (Celery's default): the jobs return nothing anyone reads.
app = Celery("bench", broker=redis_url())
app.conf.broker_connection_retry_on_startup = True  # silences a deprecation warning only


@app.task(name="bench.job")
def job(given: float = 0.0) -> None:
    run_job(given)


class CeleryBroker(System):
    name = "celery"
    title = "Celery"
    distributions = ("celery", "kombu")
    settings = (
        "Redis broker, no result backend, defaults otherwise (`task_acks_late` off, "
        "prefetch multiplier 4); `celery worker --pool solo --concurrency 1 --loglevel "
        "WARNING`; default: the prefork pool with one child per core (2); delayed jobs: "
        "`apply_async(eta=...)`, held by the worker until due"
    )

    def enqueue_one(self, *args: float) -> None:
        job.delay(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            job.apply_async((due,), eta=datetime.fromtimestamp(due, UTC))

    def commands(self, config: str) -> list[list[str]]:
        worker = python("-m", "celery", "-A", "bench.systems.celery", "worker", "-l", "WARNING")
        return [[*worker, "--pool", "solo", "--concurrency", "1"] if config == ONE else worker]


SYSTEM = CeleryBroker()
