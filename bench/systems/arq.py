"""arq: ``enqueue_job()`` from asyncio and its worker (``run_worker``); delayed jobs with
``_defer_until``. The worker polls its queue every ``poll_delay`` (0.5 s) rather than
blocking.

    python -m bench.systems.arq MAX_JOBS    # the worker, logging warnings only
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import run_worker

from bench.systems.base import ONE, Args, System, python, redis_url
from bench.systems.stamps import run_job


async def job(ctx: dict[str, Any], given: float = 0.0) -> None:
    run_job(given)


class WorkerSettings:
    functions = [job]
    redis_settings = RedisSettings.from_dsn(redis_url())


class Arq(System):
    name = "arq"
    title = "arq"
    distributions = ("arq",)
    settings = (
        "defaults (`poll_delay` 0.5 s, results kept an hour); `run_worker` with "
        "`max_jobs=1`; default: `max_jobs=10`; the client enqueues from one asyncio "
        "loop; delayed jobs: `_defer_until`"
    )

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

    def commands(self, config: str) -> list[list[str]]:
        return [python("-m", "bench.systems.arq", "1" if config == ONE else "10")]


SYSTEM = Arq()

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_worker(WorkerSettings, max_jobs=int(sys.argv[1]))  # type: ignore[arg-type]
