"""Celery with the Redis broker: ``task.delay()``, ``celery worker``; delayed jobs with
``apply_async(eta=...)``, which the worker fetches at once and holds until due."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from celery import Celery

from bench.systems.base import FOUR, ONE, PROCESSES, System, python, redis_url
from bench.systems.stamps import run_job, wait_job

# No result backend (Celery's default): the jobs return nothing anyone reads.
app = Celery("bench", broker=redis_url())
app.conf.broker_connection_retry_on_startup = True  # silences a deprecation warning only
# Celery's optimizing guide: with many short tasks and throughput in mind, a large prefetch
# multiplier ("Say 64, or 128"); the default is 4.
PREFETCH_MULTIPLIER = 64
app.conf.worker_prefetch_multiplier = PREFETCH_MULTIPLIER
# Worker-to-worker events (gossip, mingle at start, event heartbeats) serve monitoring and
# revokes, not delivery; left out, as broker vendors (CloudAMQP) advise, to spare the broker.
QUIET = ("--without-gossip", "--without-mingle", "--without-heartbeat")


@app.task(name="bench.job")
def job(given: float = 0.0) -> None:
    run_job(given)


@app.task(name="bench.wait")
def wait(seconds: float) -> None:
    wait_job(seconds)


WORKER = python(*("-m", "celery", "-A", "bench.systems.celery", "worker", "-l", "WARNING", *QUIET))


class CeleryBroker(System):
    name = "celery"
    title = "Celery"
    distributions = ("celery", "kombu")
    settings = (
        "Redis broker, no result backend, tasks acknowledged on receipt (`task_acks_late` "
        f"off, the default); `worker_prefetch_multiplier` {PREFETCH_MULTIPLIER}, as Celery's "
        "optimizing guide advises for many short tasks (default 4); workers started with "
        f"`{' '.join(QUIET)}` (monitoring events only) and `--loglevel WARNING`; one at a "
        "time: `--pool solo --concurrency 1`; default: the prefork pool with one child per "
        f"core (2); {PROCESSES} processes: `--pool prefork --concurrency {PROCESSES}`; "
        "delayed jobs: `apply_async(eta=...)`, held by the worker until due"
    )

    io_settings = (
        "`celery worker --pool threads --concurrency N`: a pool of N threads in one "
        "process (its gevent and eventlet pools need libraries not installed here), with "
        f"the same prefetch ({PREFETCH_MULTIPLIER} per thread) and flags as above; the job "
        "is sync"
    )

    def enqueue_one(self, *args: float) -> None:
        job.delay(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            job.apply_async((due,), eta=datetime.fromtimestamp(due, UTC))

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        for _ in range(jobs):
            wait.delay(seconds)

    def commands(self, config: str) -> list[list[str]]:
        if config == ONE:
            return [[*WORKER, "--pool", "solo", "--concurrency", "1"]]
        if config == FOUR:
            return [[*WORKER, "--pool", "prefork", "--concurrency", str(PROCESSES)]]
        return [WORKER]

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [[*WORKER, "--pool", "threads", "--concurrency", str(at_once)]]


SYSTEM = CeleryBroker()
