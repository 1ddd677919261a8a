"""What each benchmark job leaves behind: one fixed-width line in a file named by
``BENCH_STAMPS``: the time it was given, and when it started and ended.

A file, not Redis: one more round trip per job would cost as much as a whole job does on
this loopback and would squeeze every system's figures towards the same number. With
``BENCH_JOB_BODY=redis`` (``bench.peers --job-body redis``) the job also makes that round
trip, one INCR, as a job that touches a cache or a counter does. Lines
are appended with one ``write()`` on an ``O_APPEND`` descriptor, so processes and forks
can share the file; fixed width makes the count a division of its size.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

LINE_BYTES = 63  # three %20.6f fields, two spaces, a newline
_FORMAT = b"%20.6f %20.6f %20.6f\n"

_fd: int | None = None
_fd_pid = 0


def stamp(given: float, started: float) -> None:
    """Append (given, started, now): ``given`` is an enqueue or due time, or 0."""
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():
        _fd = os.open(os.environ["BENCH_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
    os.write(_fd, _FORMAT % (given, started, time.time()))


def run_job(given: float = 0.0) -> None:
    """The body of every system's benchmark job: its stamp, and with
    ``BENCH_JOB_BODY=redis`` one INCR on the benchmark's Redis."""
    started = time.time()
    if os.environ.get("BENCH_JOB_BODY") == "redis":
        _redis().incr("bench:body")
    stamp(given, started)


_client: Any = None
_client_pid = 0


def _redis() -> Any:
    """This process's client of the benchmark's Redis (a fork makes its own)."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        import redis

        _client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        _client_pid = os.getpid()
    return _client


def wait_job(seconds: float) -> None:
    """The body of the I/O-bound job in a thread: it waits, as on a network reply."""
    started = time.time()
    time.sleep(seconds)
    stamp(0.0, started)


async def wait_job_async(seconds: float) -> None:
    """The same in an event loop: the wait leaves the loop to the other jobs."""
    started = time.time()
    await asyncio.sleep(seconds)
    stamp(0.0, started)


@dataclass(frozen=True, slots=True)
class Stamp:
    given: float
    started: float
    ended: float


def count(path: str) -> int:
    """How many jobs have stamped ``path`` so far."""
    try:
        return os.stat(path).st_size // LINE_BYTES
    except FileNotFoundError:
        return 0


def read(path: str) -> list[Stamp]:
    """Every stamp in ``path``, in the order written."""
    with open(path, "rb") as file:
        data = file.read()
    return [
        Stamp(*(float(field) for field in data[i : i + LINE_BYTES].split()))
        for i in range(0, len(data) - len(data) % LINE_BYTES, LINE_BYTES)
    ]
