"""django-redisqueue: ``task.enqueue()``, ``runworker`` and, for delayed jobs, ``runscheduler``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime

from bench.systems.base import DEFAULT, ONE, System, python


def manage(*args: str) -> list[str]:
    return python("-m", "django", *args, "--settings", "bench.settings", "-v0")


class RedisQueue(System):
    name = "redisqueue"
    title = "django-redisqueue"
    distributions = ("django-redisqueue", "django", "django-tasks")
    settings = (
        "`bench/settings.py` (one queue, default options); `runworker --concurrency 1`; "
        "default: `--concurrency 2` (one process per core); delayed jobs: "
        "`task.using(run_after=...)` and `runscheduler`"
    )

    def connect(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
        import django

        django.setup()
        from bench.tasks import job

        self.job = job

    def enqueue_one(self, *args: float) -> None:
        self.job.enqueue(*args)

    def enqueue_due(self, dues: Iterable[float]) -> None:
        for due in dues:
            self.job.using(run_after=datetime.fromtimestamp(due, UTC)).enqueue(due)

    def commands(self, config: str) -> list[list[str]]:
        if config == ONE:
            return [manage("runworker", "--concurrency", "1")]
        worker = manage("runworker", "--concurrency", "2")
        return [worker] if config == DEFAULT else [worker, manage("runscheduler")]


SYSTEM = RedisQueue()
