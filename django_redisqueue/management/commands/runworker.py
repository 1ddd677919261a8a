"""``manage.py runworker [QUEUE[:WEIGHT] ...]``: run the jobs of a RedisQueueBackend."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core.jobs import QUEUE_NAME_RE
from django_redisqueue.core.registry import registry
from django_redisqueue.management.common import configure_logging, get_backend
from django_redisqueue.observe.logformat import JsonLines
from django_redisqueue.observe.metrics import parse_address, serve
from django_redisqueue.runtime.pool import run_workers
from django_redisqueue.runtime.reloading import (
    RELOAD_GRACE,
    ReloadWatcher,
    is_reload_child,
    run_reloading_parent,
)
from django_redisqueue.runtime.slots import SlotWorker
from django_redisqueue.runtime.worker import Worker


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def metrics_address(value: str) -> tuple[str, int]:
    return parse_address(value)


def serve_metrics(address: tuple[str, int], backends: list[RedisQueueBackend]) -> None:
    """Serve the metrics from this process (the pool's supervisor, which runs no job)."""
    try:
        server = serve(address, backends)
    except OSError as exc:
        raise CommandError(f"Cannot serve metrics on {address[0]}:{address[1]}: {exc}") from exc
    # Forked worker processes must not hold the listening socket open, nor locks that a
    # request was holding as they were forked.
    os.register_at_fork(
        before=server.hold_requests,
        after_in_parent=server.serve_requests,
        after_in_child=server.socket.close,
    )


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
            "--threads",
            type=positive_int,
            default=1,
            help="jobs each worker process runs at once, each on a thread of its own "
            "(default: 1): for jobs that mostly wait (email, HTTP APIs, files); with "
            "--concurrency P, P x N in all",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            default=None,
            help="each worker process exits after this many jobs (the pool of "
            "--concurrency N starts a new one; a single process exits 0 for systemd or "
            "Kubernetes to restart it)",
        )
        parser.add_argument(
            "--max-memory",
            type=positive_int,
            default=None,
            metavar="MB",
            help="each worker process exits once its resident memory (RSS) is past MB "
            "mebibytes after a job (its outcome stored first), to be replaced as with "
            "--max-jobs. Linux reads the current RSS; other systems the peak (getrusage)",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="development: restart the worker (the whole pool with --concurrency) "
            "when the project's Python files change; the job in hand finishes first "
            f"(given back to its queue after {RELOAD_GRACE:g} s)",
        )
        parser.add_argument(
            "--metrics-port",
            type=metrics_address,
            default=None,
            metavar="[HOST:]PORT",
            help="serve Prometheus metrics of the backends at /metrics on PORT, without "
            "authentication, on 127.0.0.1 unless HOST is given (0.0.0.0:PORT or [::]:PORT "
            "for every interface); each endpoint shows the whole backend's numbers: "
            "scrape one",
        )
        parser.add_argument(
            "--log-format",
            choices=["text", "json"],
            default="text",
            help="json: every line of output is a JSON object, whatever the project's "
            "LOGGING, with the job's id, task, queue, status, duration_ms, attempt and "
            "wait_ms on each job's line (default: text)",
        )

    def execute(self, *args: Any, **options: Any) -> str | None:
        # Before the system checks, which write their findings to the command's stderr.
        configure_logging(options["verbosity"], options["log_format"])
        if options["log_format"] == "json":
            # cast: django-stubs wants a TextIO, which no io class is to mypy.
            out = JsonLines(sys.__stdout__ or sys.stdout, __name__, logging.INFO)
            err = JsonLines(sys.__stderr__ or sys.stderr, __name__, logging.WARNING)
            self.stdout = OutputWrapper(cast(TextIO, out))
            self.stderr = OutputWrapper(cast(TextIO, err))
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        watcher = None
        if options["reload"]:
            if not is_reload_child():
                sys.exit(run_reloading_parent())
            watcher = ReloadWatcher()
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
        if watcher is None:
            registry.autodiscover()
        else:
            watcher.start_after(registry.autodiscover)
        for backend in backends:
            self.print_banner(backend, queues, weights, options)

        def maker(backend: RedisQueueBackend) -> Callable[[], Worker]:
            def make_worker() -> Worker:
                settings = {
                    "weights": weights,
                    "burst": options["burst"],
                    "max_jobs": options["max_jobs"],
                    "max_memory": options["max_memory"],
                }
                if options["threads"] > 1:
                    return SlotWorker(backend, queues, threads=options["threads"], **settings)
                return Worker(backend, queues, **settings)

            return make_worker

        makers = [maker(backend) for backend in backends] * options["concurrency"]
        if options["metrics_port"]:
            serve_metrics(options["metrics_port"], backends)
        code = run_workers(makers, restart=not options["burst"], watcher=watcher)
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
        where = backend.broker.describe()
        title = f"django-redisqueue worker, backend {backend.alias!r} on {where}"
        if options["log_format"] == "json":  # every line of output is JSON
            logging.getLogger(__name__).info(
                title,
                extra={
                    "queues": order,
                    "concurrency": options["concurrency"],
                    "threads": options["threads"],
                    "burst": options["burst"],
                    "tasks": registry.paths(),
                },
            )
            return
        lines = [
            title,
            f"  queues:      {order}",
            f"  concurrency: {options['concurrency']} process(es)"
            + (f" x {options['threads']} threads" if options["threads"] > 1 else "")
            + (", burst" if options["burst"] else ""),
            "  tasks:",
            *(f"    {path}" for path in registry.paths()),
        ]
        self.stdout.write("\n".join(lines))
