"""``manage.py queuestats``: the dashboard's overview, in the terminal (or as JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils.timezone import localtime

from django_redisqueue.dashboard.reads import Dashboard
from django_redisqueue.dashboard.rows import ScheduleRow
from django_redisqueue.management.common import get_backend

COLUMNS = ("ready", "running", "delayed", "failed", "finished")


class Command(BaseCommand):
    help = (
        "Print each queue's ready, running, delayed, failed and finished (last hour) jobs, "
        "the limits holding jobs back, and the periodic jobs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default)")
        parser.add_argument("--json", action="store_true", help="print JSON, for scripts")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_backend(options["backend"], "queuestats", connect=False)
        overview = Dashboard(backend).overview()
        workers = [
            {
                "id": w.id,
                "queues": w.queues,
                "heartbeat_age": round(w.heartbeat_age, 1),
                "slots": w.slots,
                "busy": w.busy,
            }
            for w in overview["workers"]
        ]
        schedulers = [s["id"] for s in overview["schedulers"]]
        periodic = [_schedule(row) for row in Dashboard(backend).schedules()]
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "backend": backend.alias,
                        "queues": {q: asdict(row) for q, row in overview["counts"].items()},
                        "workers": workers,
                        "schedulers": schedulers,
                        "periodic": periodic,
                        "limits": [
                            {"key": lim.key, "running": lim.running, "parked": lim.parked}
                            for lim in overview["limits"]
                        ],
                        **({"outbox": overview["outbox"]} if overview["outbox"] else {}),
                    },
                    indent=2,
                )
            )
            return
        width = max((len(q) for q in overview["counts"]), default=5) + 2
        self.stdout.write("queue".ljust(width) + "".join(c.rjust(10) for c in COLUMNS))
        for queue, row in overview["counts"].items():
            state = "  (paused)" if row.paused else ""
            numbers = "".join(str(getattr(row, c)).rjust(10) for c in COLUMNS)
            self.stdout.write(queue.ljust(width) + numbers + state)
        self.stdout.write(
            f"{len(workers)} worker(s) alive ({overview['busy_slots']} of "
            f"{overview['slots']} slots busy), {len(schedulers)} scheduler(s) alive; "
            "finished = in the last hour"
        )
        for limit in overview["limits"]:
            self.stdout.write(
                f"limit {limit.name}: {limit.running} running, {limit.parked} parked"
            )
        if waiting := overview["outbox"]:
            self.stdout.write(
                f"outbox: unreadable ({waiting['error']})"
                if waiting["jobs"] is None
                else f"outbox: {waiting['jobs']} job(s) waiting for the relay, the oldest "
                f"for {waiting['oldest_seconds']:.1f} s"
            )
        if periodic:
            width = max(len(p["name"]) for p in periodic) + 2
            expression = max(len(p["schedule"]) for p in periodic) + 2
            self.stdout.write("")
            for p in periodic:
                self.stdout.write(
                    p["name"].ljust(width)
                    + p["schedule"].ljust(expression)
                    + (f"next {p['next']}" if p["next"] else "next -").ljust(32)
                    + f"last {p['last_run'] or 'never'}"
                    + (f" ({p['outcome']})" if p["outcome"] else "")
                    + f"  {p['state']}"
                )


def _schedule(row: ScheduleRow) -> dict[str, Any]:
    """A periodic schedule as queuestats prints it (times in the project's zone)."""
    state = "active"
    if not row.declared:
        state = "no longer in settings"
    elif not row.registered:
        state = "not registered yet"
    elif row.paused:
        state = "paused"
    return {
        "name": row.name,
        "task": row.task,
        "schedule": row.expression,
        "words": row.words,
        "next": _time(row.next_run) if row.declared and not row.paused else None,
        "last_run": _time(row.last_run),
        "last_job": row.last_job_id or None,
        "outcome": row.outcome or None,
        "state": state,
    }


def _time(moment: datetime | None) -> str | None:
    return localtime(moment).isoformat(timespec="seconds") if moment else None
