"""arq: ``enqueue_job()`` from asyncio and its worker (``run_worker``) with its defaults;
delayed jobs with ``_defer_until``. The worker polls its queue every ``poll_delay``
(0.5 s) rather than blocking, and each poll starts at most ``queue_read_limit`` jobs (100).

    python -m bench.systems.arq                  # the worker, logging warnings only
    python -m bench.systems.arq --max-jobs 32    # the same, 32 jobs at a time
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import run_worker

from bench.systems.base import FOUR, PROCESSES, Args, System, python, redis_url
from bench.systems.stamps import run_job, wait_job_async


async def job(ctx: dict[str, Any], given: float = 0.0) -> None:
    run_job(given)  # no await: one job's body runs at a time in a worker, whatever max_jobs


async def wait(ctx: dict[str, Any], seconds: float) -> None:
    await wait_job_async(seconds)


class WorkerSettings:
    functions = [job, wait]
    redis_settings = RedisSettings.from_dsn(redis_url())


class Arq(System):
    name = "arq"
    title = "arq"
    distributions = ("arq",)
    settings = (
        "`run_worker` with its defaults (`max_jobs` 10, `poll_delay` 0.5 s, "
        "`queue_read_limit` 100, results kept an hour), one process: the benchmark job never "
        "awaits, so its runs never overlap: this one process is both the one-at-a-time and "
        "the default set-up. A drain is bound by 100 jobs a poll, 200 jobs/s a process "
        "(with `max_jobs=1` a poll starts one job: 2 jobs/s). arq's docs advise no other "
        f"values, so none are changed. {PROCESSES} processes: {PROCESSES} such workers. The "
        "client enqueues from one asyncio loop; delayed jobs: `_defer_until`"
    )
    io_settings = (
        "`max_jobs` N, the rest as above: each poll (every 0.5 s) starts jobs into the free "
        "slots, so a slot freed between polls waits for the next one; the job is async"
    )
    default_is_one = True  # its default set-up already runs one job at a time (above)

    def connect(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(WorkerSettings.redis_settings))

    def enqueue_each(self, calls: Iterable[Args]) -> None:
        async def each() -> None:
            for args in calls:
                await self.pool.enqueue_job("job", *args)

        self.loop.run_until_complete(each())

    def enqueue_due(self, dues: Iterable[float]) -> None:
        async def each() -> None:
            for due in dues:
                await self.pool.enqueue_job(
                    "job", due, _defer_until=datetime.fromtimestamp(due, UTC)
                )

        self.loop.run_until_complete(each())

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        async def each() -> None:
            for _ in range(jobs):
                await self.pool.enqueue_job("wait", seconds)

        self.loop.run_until_complete(each())

    def commands(self, config: str) -> list[list[str]]:
        worker = python("-m", "bench.systems.arq")
        return [worker] * (PROCESSES if config == FOUR else 1)

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [python("-m", "bench.systems.arq", "--max-jobs", str(at_once))]


SYSTEM = Arq()

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The arq worker of the benchmark")
    parser.add_argument("--max-jobs", type=int, default=10, help="arq's max_jobs")
    logging.basicConfig(level=logging.WARNING)
    run_worker(WorkerSettings, max_jobs=parser.parse_args().max_jobs)  # type: ignore[arg-type]
