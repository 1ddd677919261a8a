"""SAQ on Redis: ``Queue.enqueue()`` from asyncio and SAQ's own worker (``saq.runner``)
with its defaults, ``concurrency`` 10; delayed jobs with ``enqueue(scheduled=...)``, which
the worker itself moves to the queue: its scheduler checks every second. Each of the
worker's ``concurrency`` tasks blocks on ``BLMOVE`` rather than polling.

    python -m bench.systems.saq                # the worker, SAQ's defaults
    python -m bench.systems.saq --one          # one job at a time (concurrency 1)
    python -m bench.systems.saq --one --workers 4
                                               # SAQ's --workers: 4 such processes
    python -m bench.systems.saq --concurrency 32
                                               # 32 jobs at a time

It logs warnings only, as SAQ's own command line does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Iterable
from typing import Any

from saq import Queue
from saq.runner import run
from saq.types import SettingsDict

from bench.systems.base import FOUR, ONE, PROCESSES, Args, System, python, redis_url
from bench.systems.stamps import run_job, wait_job_async

# Read by worker_settings_at_once() in each worker process, which SAQ imports by name.
CONCURRENCY_ENV = "BENCH_SAQ_CONCURRENCY"


async def job(ctx: dict[str, Any], given: float = 0.0) -> None:
    run_job(given)  # no await: one job's body runs at a time, whatever the concurrency


async def wait(ctx: dict[str, Any], seconds: float) -> None:
    await wait_job_async(seconds)


def worker_settings() -> SettingsDict[Any]:
    """The worker's settings, SAQ's defaults (``concurrency`` 10); called by SAQ in
    each worker process, so every process makes its own queue."""
    return {"queue": Queue.from_url(redis_url()), "functions": [job, wait]}


def worker_settings_one() -> SettingsDict[Any]:
    """The same with ``concurrency`` 1: one job dequeued and run at a time."""
    return {**worker_settings(), "concurrency": 1}


def worker_settings_at_once() -> SettingsDict[Any]:
    """The same with ``concurrency`` from ``--concurrency``."""
    return {**worker_settings(), "concurrency": int(os.environ[CONCURRENCY_ENV])}


class Saq(System):
    name = "saq"
    title = "SAQ"
    distributions = ("saq",)
    settings = (
        "`Queue.from_url` with its defaults (queue `default`, JSON, results kept 600 s, "
        "job `timeout` 10 s); the worker run by SAQ's runner with its defaults: "
        "`concurrency` 10, i.e. 10 tasks each blocking on `BLMOVE`, with up to 10 jobs in "
        "flight: the benchmark job never awaits, so their bodies never overlap, but their "
        "Redis round trips (dequeue, mark active, finish) do, so the default is not one job "
        "at a time; one process. One at a time: `concurrency` 1. "
        f"{PROCESSES} processes: SAQ's `--workers {PROCESSES}` (its docs: 'easily run "
        "multiple workers to leverage more cores'), each with `concurrency` 1. SAQ's docs "
        "advise no other values (its README example and its own benchmark use `concurrency` "
        "10, the default), so none are changed. The client awaits each `enqueue` in turn "
        "from one asyncio loop (SAQ's own benchmark overlaps 20 at a time); no bulk call is "
        "documented (`map` waits for results; `batch` only aborts the jobs on an error). "
        "Delayed jobs: `enqueue(scheduled=due)` in epoch seconds, moved to the queue by the "
        "worker's own scheduler, which checks every second (`timers['schedule']`, 1 s)"
    )
    io_settings = (
        "`concurrency` N, the rest as above: N tasks in one event loop, each blocking on "
        "`BLMOVE` for its next job; the job is async"
    )
    default_is_one = False  # concurrency 10: ten jobs in flight (above)

    def connect(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = Queue.from_url(redis_url())
        self.loop.run_until_complete(self.queue.connect())

    def enqueue_each(self, calls: Iterable[Args]) -> None:
        async def each() -> None:
            for args in calls:
                if args:
                    await self.queue.enqueue("job", given=args[0])
                else:
                    await self.queue.enqueue("job")

        self.loop.run_until_complete(each())

    def enqueue_due(self, dues: Iterable[float]) -> None:
        async def each() -> None:
            for due in dues:
                await self.queue.enqueue("job", given=due, scheduled=due)

        self.loop.run_until_complete(each())

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        async def each() -> None:
            for _ in range(jobs):
                await self.queue.enqueue("wait", seconds=seconds)

        self.loop.run_until_complete(each())

    def commands(self, config: str) -> list[list[str]]:
        worker = python("-m", "bench.systems.saq")
        if config == FOUR:
            return [[*worker, "--one", "--workers", str(PROCESSES)]]
        return [[*worker, "--one"] if config == ONE else worker]

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [python("-m", "bench.systems.saq", "--concurrency", str(at_once))]


SYSTEM = Saq()


def main() -> None:
    parser = argparse.ArgumentParser(description="The SAQ worker of the benchmark")
    parser.add_argument("--one", action="store_true", help="concurrency 1")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, help="jobs at a time in each process")
    options = parser.parse_args()
    # SAQ imports the settings by name in each worker process (forked by --workers);
    # verbose 0 is SAQ's default: logging at WARNING.
    chosen = "worker_settings_one" if options.one else "worker_settings"
    if options.concurrency:
        os.environ[CONCURRENCY_ENV] = str(options.concurrency)
        chosen = "worker_settings_at_once"
    run(f"bench.systems.saq.{chosen}", workers=options.workers, verbose=0)


if __name__ == "__main__":
    main()
