"""``manage.py queuehealth``: a health probe of one backend, for Kubernetes, systemd or
a monitoring check. It prints one line per check (or JSON) and exits with a code that
says which check failed (the checks: ``observe/health.py``); see
docs/howto/metrics-health.md."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core.jobs import QUEUE_NAME_RE
from django_redisqueue.management.common import get_backend
from django_redisqueue.observe.health import (
    HEALTHY,
    NO_LIVE_WORKER,
    NO_SCHEDULER,
    OUTBOX_STUCK,
    REDIS_UNHEALTHY,
    WAITED_TOO_LONG,
    Probe,
)

HELP = f"""Check one backend's health and exit with a code saying what failed:
{HEALTHY} healthy; {REDIS_UNHEALTHY} Redis unreachable or refusing writes (out of memory,
read-only, loading, a timeout); {NO_LIVE_WORKER} a queue without a live worker;
{NO_SCHEDULER} no live scheduler; {WAITED_TOO_LONG} a queue's next job waited longer than
--max-wait; {OUTBOX_STUCK} a committed job waited in the outbox longer than
--max-outbox-age, or the outbox cannot be read (a backend with OUTBOX). When several
fail, every failure is printed and the lowest code is the exit code. 1: the command
could not run (an unknown backend or queue); 2: a wrong option. A paused queue is
reported but never fails."""


def positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(value)
    return seconds


def seconds_or_zero(value: str) -> float:
    seconds = float(value)
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(value)
    return seconds


class Command(BaseCommand):
    help = HELP
    # A probe runs every few seconds: Django's system checks would only slow it down.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default)")
        parser.add_argument(
            "--queue",
            action="extend",
            nargs="+",
            default=[],
            dest="queues",
            metavar="NAME",
            help="check these queues (default: the backend's QUEUES, or every queue used "
            "when QUEUES is empty)",
        )
        parser.add_argument(
            "--max-wait",
            type=seconds_or_zero,
            default=300.0,
            metavar="SECONDS",
            help="fail when a queue's next job has waited longer (default: 300; 0: no check)",
        )
        parser.add_argument(
            "--max-outbox-age",
            type=seconds_or_zero,
            default=60.0,
            metavar="SECONDS",
            help="with OUTBOX: fail when a committed job has waited longer in the outbox "
            "for the relay (default: 60; 0: no check)",
        )
        parser.add_argument(
            "--no-scheduler", action="store_true", help="do not check for a live scheduler"
        )
        parser.add_argument(
            "--no-workers", action="store_true", help="do not check for live workers"
        )
        parser.add_argument(
            "--this-host",
            action="store_true",
            help="count only the workers and schedulers running on this host (by its "
            "hostname: in Kubernetes, the pod's name), for a probe of one pod",
        )
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=2.0,
            metavar="SECONDS",
            help="seconds Redis has to answer the ping (default: 2); the whole probe "
            "gives up after twice that",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = get_backend(options["backend"], "queuehealth", connect=False)
        queues = self.named_queues(backend, options["queues"])
        checks = Probe(backend, options).run(queues)
        failed = sorted(check.code for check in checks if not check.ok)
        code = failed[0] if failed else HEALTHY
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "backend": backend.alias,
                        "healthy": not failed,
                        "exit_code": code,
                        "checks": [
                            {k: v for k, v in asdict(check).items() if k != "code"}
                            for check in checks
                        ],
                    },
                    indent=2,
                )
            )
        else:
            for check in checks:
                self.stdout.write(check.line())
        if code:
            self.stdout.flush()
            sys.exit(code)

    def named_queues(self, backend: RedisQueueBackend, names: list[str]) -> list[str]:
        for name in names:
            if not QUEUE_NAME_RE.fullmatch(name):
                raise CommandError(
                    f"Queue {name!r} is not a queue name: 1 to 64 letters, digits, '_', "
                    "'.' or '-'."
                )
            if backend.queue_names and name not in backend.queue_names:
                raise CommandError(
                    f"Queue {name!r} is not one of backend {backend.alias!r}'s QUEUES: "
                    f"{', '.join(backend.queue_names)}."
                )
        return list(dict.fromkeys(names))
