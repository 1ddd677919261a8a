"""``manage.py queuestats``: the dashboard's overview, in the terminal (or as JSON)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_redisqueue.dashboard import Dashboard
from django_redisqueue.management.commands.runworker import get_backend

COLUMNS = ("ready", "running", "delayed", "failed", "finished")


class Command(BaseCommand):
    help = "Print each queue's ready, running, delayed, failed and finished (last hour) jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default)")
        parser.add_argument("--json", action="store_true", help="print JSON, for scripts")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_backend(options["backend"], "queuestats", connect=False)
        overview = Dashboard(backend).overview()
        workers = [
            {"id": w["id"], "queues": w["queues"], "heartbeat_age": round(w["heartbeat_age"], 1)}
            for w in overview["workers"]
        ]
        schedulers = [s["id"] for s in overview["schedulers"]]
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "backend": backend.alias,
                        "queues": overview["counts"],
                        "workers": workers,
                        "schedulers": schedulers,
                    },
                    indent=2,
                )
            )
            return
        width = max((len(q) for q in overview["counts"]), default=5) + 2
        self.stdout.write("queue".ljust(width) + "".join(c.rjust(10) for c in COLUMNS))
        for queue, row in overview["counts"].items():
            state = "  (paused)" if row["paused"] else ""
            numbers = "".join(str(row[c]).rjust(10) for c in COLUMNS)
            self.stdout.write(queue.ljust(width) + numbers + state)
        self.stdout.write(
            f"{len(workers)} worker(s) alive, {len(schedulers)} scheduler(s) alive; "
            "finished = in the last hour"
        )
