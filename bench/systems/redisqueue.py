"""django-redisqueue: ``task.enqueue()``, ``runworker`` and, for delayed jobs, ``runscheduler``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from bench.systems.base import DEFAULT, FOUR, ONE, PROCESSES, Args, System, python

BULK_CHUNK = 1000  # jobs per enqueue_many() call, and per transaction in enqueue_commit()


def manage(*args: str) -> list[str]:
    return python("-m", "django", *args, "--settings", "bench.settings", "-v0")


class RedisQueue(System):
    name = "redisqueue"
    title = "django-redisqueue"
    distributions = ("django-redisqueue", "django", "django-tasks")
    settings = (
        "`bench/settings.py` (one queue, default options); `runworker --concurrency 1`; "
        "default: `--concurrency 2` (one process per core); 4 processes: `runworker "
        f"--concurrency {PROCESSES}` (its documented way: one supervisor forking the "
        "workers); "
        f"bulk: `task.enqueue_many()` in chunks of {BULK_CHUNK}; on commit: "
        "`task.enqueue_on_commit()` inside `transaction.atomic()`, "
        f"{BULK_CHUNK} jobs per transaction (in-memory SQLite), sent together at each "
        "commit; delayed jobs: `task.using(run_after=...)` and `runscheduler`"
    )
    io_settings = (
        "`runworker --threads N`: one process running N jobs at once, a sync job on a "
        "thread of its own, an async one on the process's event loop, a slot's thread "
        "waiting for it; the job is sync (`time.sleep`) at 32 at once, async "
        "(`asyncio.sleep`) at 256"
    )
    has_bulk = True
    has_commit = True

    def connect(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
        import django

        django.setup()
        from bench.tasks import job

        self.job = job

    def enqueue_one(self, *args: float) -> None:
        self.job.enqueue(*args)

    def enqueue_bulk(self, calls: Sequence[Args]) -> None:
        for i in range(0, len(calls), BULK_CHUNK):
            self.job.enqueue_many((args, {}) for args in calls[i : i + BULK_CHUNK])

    def enqueue_commit(self, calls: Sequence[Args]) -> None:
        from django.db import transaction

        for i in range(0, len(calls), BULK_CHUNK):
            with transaction.atomic():
                for args in calls[i : i + BULK_CHUNK]:
                    self.job.enqueue_on_commit(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            self.job.using(run_after=datetime.fromtimestamp(due, UTC)).enqueue(due)

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        from bench.tasks import wait, wait_async

        chosen = wait_async if asynchronous else wait
        for i in range(0, jobs, BULK_CHUNK):
            chosen.enqueue_many(((seconds,), {}) for _ in range(min(BULK_CHUNK, jobs - i)))

    def commands(self, config: str) -> list[list[str]]:
        if config == ONE:
            return [manage("runworker", "--concurrency", "1")]
        if config == FOUR:
            return [manage("runworker", "--concurrency", str(PROCESSES))]
        worker = manage("runworker", "--concurrency", "2")
        return [worker] if config == DEFAULT else [worker, manage("runscheduler")]

    def io_commands(self, at_once: int) -> list[list[str]]:
        return [manage("runworker", "--threads", str(at_once))]


SYSTEM = RedisQueue()
