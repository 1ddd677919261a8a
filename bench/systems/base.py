"""The interface every benchmarked system implements: client calls and worker commands.

Client calls run inside ``python -m bench.client`` (one system per process); the
commands are started by ``bench.peers``. The URL of the private Redis comes from
``BENCH_REDIS_URL`` and the stamp file from ``BENCH_STAMPS``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence

# Worker configurations.
ONE = "one"  # one process running one job at a time
DEFAULT = "default"  # the system's default concurrency on this machine
SERVE = "serve"  # DEFAULT plus whatever runs delayed jobs: for latency and lateness
FOUR = "four"  # four processes, each running one job at a time
PROCESSES = 4  # in FOUR

Args = tuple[float, ...]


def redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def python(*args: str) -> list[str]:
    """A command run by this interpreter (the same virtualenv as the benchmark)."""
    return [sys.executable, *args]


class System:
    name = ""
    title = ""
    distributions: tuple[str, ...] = ()  # whose versions are printed
    settings = ""  # the configuration chosen, as the report states it
    has_bulk = False
    has_commit = False  # enqueue_commit(): jobs queued inside database transactions
    has_delay = True
    default_is_one = False  # the default concurrency is one job at a time
    io_settings = ""  # how one worker runs many waiting jobs at once, as the report states it

    def connect(self) -> None:
        """Prepare the client side (connections, framework set-up)."""

    def enqueue_one(self, *args: float) -> None:
        raise NotImplementedError

    def enqueue_each(self, calls: Iterable[Args]) -> None:
        """Enqueue one job per tuple of arguments, one call per job."""
        for args in calls:
            self.enqueue_one(*args)

    def enqueue_bulk(self, calls: Sequence[Args]) -> None:
        """Enqueue the jobs with the system's own bulk call."""
        raise NotImplementedError

    def enqueue_commit(self, calls: Sequence[Args]) -> None:
        """Enqueue the jobs from inside database transactions, sent at each commit."""
        raise NotImplementedError

    def enqueue_due(self, dues: Iterable[float]) -> None:
        """Enqueue one delayed job per due time (seconds), given its due time."""
        raise NotImplementedError

    def enqueue_waits(self, seconds: float, jobs: int, *, asynchronous: bool) -> None:
        """Enqueue ``jobs`` jobs that each wait ``seconds``: with ``asyncio.sleep`` where
        the system runs coroutines, ``time.sleep`` where it runs threads; ``asynchronous``
        chooses for a system that runs both."""
        raise NotImplementedError

    def commands(self, config: str) -> list[list[str]]:
        """The processes to start for ``config``; the first one is the worker."""
        raise NotImplementedError

    def io_commands(self, at_once: int) -> list[list[str]]:
        """The processes to start for one worker that runs ``at_once`` jobs at a time, its
        own way; none if it has no way (the I/O-bound workloads then leave it out)."""
        return []
