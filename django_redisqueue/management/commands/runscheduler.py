"""``manage.py runscheduler``: promote delayed jobs when due, recover lost ones."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_redisqueue.management.common import configure_logging, get_backend
from django_redisqueue.runtime.scheduler import Scheduler


class Command(BaseCommand):
    help = (
        "Move delayed jobs (run_after, retries) to their queues when due, and put back "
        "the jobs of workers that died once their lease runs out. Any number may run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="TASKS alias (default: default)")
        parser.add_argument(
            "--burst", action="store_true", help="promote and recover what is due now, then exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        backend = get_backend(options["backend"], "runscheduler")
        scheduler = Scheduler(backend, burst=options["burst"])
        scheduler.install_signal_handlers()
        scheduler.run()
