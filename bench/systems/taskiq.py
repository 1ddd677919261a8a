"""taskiq with taskiq-redis's ``RedisStreamBroker``: ``.kiq()`` from asyncio, the
``taskiq worker`` CLI; delayed jobs with ``schedule_by_time()`` into a
``ListRedisScheduleSource``, sent by the ``taskiq scheduler`` process when due.

    python -m taskiq worker bench.systems.taskiq:broker --log-level WARNING
    python -m taskiq scheduler bench.systems.taskiq:scheduler --update-interval 1

(Through taskiq's own CLI: this module is ``bench.systems.taskiq``, so ``import taskiq``
inside it finds the library, not itself.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime

from taskiq import TaskiqScheduler
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

from bench.systems.base import FOUR, ONE, PROCESSES, SERVE, Args, System, python, redis_url
from bench.systems.stamps import run_job, wait_job_async

# Stream broker with its defaults (one stream "taskiq", one consumer group "taskiq"
# created at "$" by startup(), XREADGROUP of up to 100 entries blocking 2 s, XACK per
# job, XAUTOCLAIM of entries idle 10 min). No result backend (the default dummy one):
# the jobs return nothing anyone reads.
broker = RedisStreamBroker(url=redis_url())
# taskiq's docs ("Dynamic scheduling") suggest ListRedisScheduleSource for schedules
# added at run time; RedisScheduleSource is deprecated.
source = ListRedisScheduleSource(url=redis_url())
scheduler = TaskiqScheduler(broker, sources=[source])

# The scheduler reloads its schedules once a minute by default, so a job due in 3 s
# could start up to a minute late: its documented `--update-interval` (seconds) is set
# to 1, the least it takes; it checks due times once a second (its default).
UPDATE_INTERVAL = 1


@broker.task
async def job(given: float = 0.0) -> None:
    run_job(given)  # no await: one job's body runs at a time in a process, whatever the limit


@broker.task
async def wait(seconds: float) -> None:
    await wait_job_async(seconds)


WORKER = python(
    *("-m", "taskiq", "worker", "bench.systems.taskiq:broker", "--log-level", "WARNING")
)


class Taskiq(System):
    name = "taskiq"
    title = "taskiq"
    distributions = ("taskiq", "taskiq-redis")
    settings = (
        "`RedisStreamBroker` (taskiq-redis's broker with acknowledgements) with its "
        "defaults: consumer group made at startup, `XREADGROUP` of up to 100 entries, "
        "one `XACK` per job, acknowledged once the (absent) result is saved "
        "(`--ack-type when_saved`, the default); no result backend, none being needed; "
        "`taskiq worker --log-level WARNING`; taskiq's docs advise no throughput values "
        "(`--max-prefetch`, default 0, is described as useful at high message rates, "
        "with no value given), so none are changed. One at a time: `--workers 1 "
        "--max-async-tasks 1`; default: `--workers 2` child processes (a fixed default, "
        "not one per core) of `--max-async-tasks 100` each; the benchmark job never "
        "awaits, so within a process the bodies never overlap, but fetches and acks "
        f"do; {PROCESSES} processes: `--workers {PROCESSES} --max-async-tasks 1`. Each "
        "worker command is a supervising process plus its children. The client "
        "enqueues with `.kiq()` from one asyncio loop, after `broker.startup()`, which "
        "also makes the consumer group, so jobs enqueued before any worker are kept; "
        "delayed jobs: `schedule_by_time()` into a `ListRedisScheduleSource` (the "
        "docs' choice for dynamic schedules), sent when due by one `taskiq scheduler` "
        f"process with `--update-interval {UPDATE_INTERVAL}` (default: schedules "
        "reloaded once a minute, too rarely for jobs due seconds ahead) and its "
        "1-second loop"
    )
    io_settings = (
        "`taskiq worker --workers 1 --max-async-tasks N`: one worker process (under its "
        "supervising process, whose memory is counted too) running up to N jobs in its "
        "event loop; the job is async"
    )
    default_is_one = False  # 2 processes of up to 100 async jobs each

    def connect(self) -> None:
        self.loop = asyncio.new_event_loop()
        # Makes the stream and its consumer group (at "$") if they do not exist yet:
        # jobs filled before the first worker starts are then delivered to it.
        self.loop.run_until_complete(broker.startup())
        self.loop.run_until_complete(source.startup())

    def enqueue_each(self, calls: Iterable[Args]) -> None:
        async def each() -> None:
            for args in calls:
                await job.kiq(*args)

        self.loop.run_until_complete(each())

    def enqueue_due(self, dues: Iterable[float]) -> None:
        async def each() -> None:
            for due in dues:
                await job.schedule_by_time(source, datetime.fromtimestamp(due, UTC), due)

        self.loop.run_until_complete(each())

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        async def each() -> None:
            for _ in range(jobs):
                await wait.kiq(seconds)

        self.loop.run_until_complete(each())

    def commands(self, config: str) -> list[list[str]]:
        if config == ONE:
            return [[*WORKER, "--workers", "1", "--max-async-tasks", "1"]]
        if config == FOUR:
            return [[*WORKER, "--workers", str(PROCESSES), "--max-async-tasks", "1"]]
        if config == SERVE:
            return [
                WORKER,
                python(
                    *("-m", "taskiq", "scheduler", "bench.systems.taskiq:scheduler"),
                    *("--update-interval", str(UPDATE_INTERVAL), "--log-level", "WARNING"),
                ),
            ]
        return [WORKER]  # DEFAULT

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [[*WORKER, "--workers", "1", "--max-async-tasks", str(at_once)]]


SYSTEM = Taskiq()
