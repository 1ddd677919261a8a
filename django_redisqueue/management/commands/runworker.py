"""``manage.py runworker [QUEUE[:WEIGHT] ...]``: run the jobs of a RedisQueueBackend."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.compat import task_backends
from django_redisqueue.jobs import QUEUE_NAME_RE
from django_redisqueue.pool import run_pool
from django_redisqueue.registry import registry
from django_redisqueue.worker import Worker

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def configure_logging(verbosity: int) -> None:
    """Show the worker's log lines unless the project's LOGGING already routes them."""
    logger = logging.getLogger("django_redisqueue")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.DEBUG))
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def get_backend(
    alias: str, command: str = "runworker", *, connect: bool = True
) -> RedisQueueBackend:
    try:
        backend = task_backends[alias]
    except Exception as exc:
        raise CommandError(f"No task backend {alias!r} in settings.TASKS: {exc}") from exc
    if not isinstance(backend, RedisQueueBackend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__module__}.{type(backend).__name__}; "
            f"{command} serves django_redisqueue.backend.RedisQueueBackend only."
        )
    if connect:
        backend.connect()
    return backend


def parse_queues(backend: RedisQueueBackend, specs: list[str]) -> tuple[list[str], dict[str, int]]:
    """Split ``name`` / ``name:weight`` arguments into queue names and weights."""
    names: list[str] = []
    weights: dict[str, int] = {}
    for spec in specs:
        name, _, weight = spec.partition(":")
        if backend.queue_names and name not in backend.queue_names:
            raise CommandError(
                f"Queue {name!r} is not one of backend {backend.alias!r}'s QUEUES: "
                f"{', '.join(backend.queue_names)}."
            )
        if name in names:
            raise CommandError(f"Queue {name!r} is given twice.")
        names.append(name)
        if weight:
            try:
                weights[name] = positive_int(weight)
            except ValueError:
                raise CommandError(
                    f"Weight {weight!r} of queue {name!r} must be a whole number >= 1."
                ) from None
        if not QUEUE_NAME_RE.fullmatch(name):
            raise CommandError(
                f"Queue {name!r} is not a queue name: 1 to 64 letters, digits, '_', '.' or '-'."
            )
    return names, weights


class Command(BaseCommand):
    help = (
        "Run the jobs of a django_redisqueue backend. With no queue names it serves all "
        "the backend's queues in their configured (priority) order. Give queues as "
        "NAME or NAME:WEIGHT; weights switch from strict priority to weighted fairness."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE[:WEIGHT]")
        parser.add_argument(
            "--backend",
            action="append",
            dest="backends",
            metavar="ALIAS",
            help="TASKS alias (default: default); give it again to serve several backends "
            "(e.g. spread over a cluster's nodes), each by its own processes",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit 0 once every queue served is empty"
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help="number of worker processes (default: 1)",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            default=None,
            help="each worker process exits after this many jobs",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"])
        aliases = options["backends"] or ["default"]
        if len(set(aliases)) != len(aliases):
            raise CommandError(f"A backend is given twice: {', '.join(aliases)}.")
        if len(aliases) > 1 and options["queues"]:
            raise CommandError(
                "Queue names go with one --backend; with several, each backend's workers "
                "serve all its queues."
            )
        backends = [get_backend(alias) for alias in aliases]
        queues, weights = parse_queues(backends[0], options["queues"])
        registry.autodiscover()
        for backend in backends:
            self.print_banner(backend, queues, weights, options)

        def maker(backend: RedisQueueBackend) -> Callable[[], Worker]:
            def make_worker() -> Worker:
                return Worker(
                    backend,
                    queues,
                    weights=weights,
                    burst=options["burst"],
                    max_jobs=options["max_jobs"],
                )

            return make_worker

        makers = [maker(backend) for backend in backends] * options["concurrency"]
        if len(makers) == 1:
            worker = makers[0]()
            worker.install_signal_handlers()
            worker.run()
            return
        code = run_pool(makers, restart=not options["burst"])
        if code:
            raise CommandError("A worker process failed; see the log above.", returncode=code)

    def print_banner(
        self,
        backend: RedisQueueBackend,
        queues: list[str],
        weights: dict[str, int],
        options: dict[str, Any],
    ) -> None:
        if options["verbosity"] < 1:
            return
        queues = queues or list(backend.queue_names)
        if not queues:
            order = "every queue used, in alphabetical order (QUEUES is empty)"
        elif weights:
            order = ", ".join(f"{q}:{weights.get(q, 1)}" for q in queues) + " (weighted)"
        else:
            order = " > ".join(queues) + " (strict priority)"
        lines = [
            f"django-redisqueue worker, backend {backend.alias!r} on {backend.broker.describe()}",
            f"  queues:      {order}",
            f"  concurrency: {options['concurrency']} process(es)"
            + (", burst" if options["burst"] else ""),
            "  tasks:",
            *(f"    {path}" for path in registry.paths()),
        ]
        self.stdout.write("\n".join(lines))
