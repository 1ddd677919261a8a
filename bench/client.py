"""One system's client side of a workload, in a process of its own so that no other
system's library is loaded: ``python -m bench.client SYSTEM ACTION [options]``.
Prints one JSON object on stdout.

    enqueue --jobs N          time N one-at-a-time enqueues of the no-op job, and take
                              the Redis commands and CPU they cost (bench/redisstats.py)
    bulk --jobs N             the same with the system's bulk call
    commit --jobs N           the same from inside database transactions
    fill --jobs N [--arg]     enqueue N jobs, untimed (bulk if offered); --arg gives
                              each one small argument, its number
    fill --jobs N --wait S [--async]
                              enqueue N jobs that each wait S seconds, untimed:
                              --async picks the coroutine where a system runs both
    latency --jobs N          one warm-up job, a rest, then N jobs at --rate per second,
                              each given its enqueue time
    delayed --jobs N          N jobs due over --span seconds from --lead seconds on,
                              each given its due time
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence

import redis

from bench import redisstats
from bench.systems import load
from bench.systems.base import Args, System, redis_url
from bench.systems.stamps import count

# Enqueued and left waiting before a timed enqueue: connections, scripts, declarations.
WARMUP = 20


def paced(jobs: int, rate: float) -> Iterator[Args]:
    """Arguments for ``jobs`` jobs at ``rate`` per second, each its enqueue time."""
    start = time.perf_counter()
    for i in range(jobs):
        wait = start + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        yield (time.time(),)


def wait_for_stamps(expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while count(os.environ["BENCH_STAMPS"]) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm-up job did not run within {timeout:.0f} s")
        time.sleep(0.01)


def timed_rate(system: System, jobs: int, action: str) -> dict[str, float]:
    """Jobs per second, and the server's commands and CPU µs per job, over the timed
    enqueue of ``jobs`` jobs (after the warm-up)."""
    enqueue: Callable[[Sequence[Args]], None] = {
        "enqueue": system.enqueue_each,
        "bulk": system.enqueue_bulk,
        "commit": system.enqueue_commit,
    }[action]
    calls = [()] * jobs
    enqueue([()] * WARMUP)
    stats = redis.Redis.from_url(redis_url())
    before = redisstats.snapshot(stats)
    started = time.perf_counter()
    enqueue(calls)
    took = time.perf_counter() - started
    commands, cpu = redisstats.between(before, redisstats.snapshot(stats)).per_job(jobs)
    return {"rate": jobs / took, "commands": commands, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("system")
    parser.add_argument(
        "action", choices=["enqueue", "bulk", "commit", "fill", "latency", "delayed"]
    )
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--arg", action="store_true")
    parser.add_argument("--first", type=int, default=0, help="fill: number of the first job")
    parser.add_argument("--wait", type=float, default=0.0, help="fill: seconds each job waits")
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--rest", type=float, default=2.0, help="latency: idle seconds first")
    parser.add_argument("--span", type=float, default=2.0)
    parser.add_argument("--lead", type=float, default=3.0)
    options = parser.parse_args()

    system = load(options.system)
    system.connect()
    out: dict[str, float] = {}
    if options.action in ("enqueue", "bulk", "commit"):
        out = timed_rate(system, options.jobs, options.action)
    elif options.action == "fill" and options.wait:
        system.enqueue_waits(options.wait, options.jobs, asynchronous=options.asynchronous)
    elif options.action == "fill":
        numbers = range(options.first, options.first + options.jobs)
        calls: list[Args] = [(i,) if options.arg else () for i in numbers]
        if system.has_bulk:
            system.enqueue_bulk(calls)
        else:
            system.enqueue_each(calls)
    elif options.action == "latency":
        system.enqueue_each([(0.0,)])
        wait_for_stamps(1, timeout=60)
        time.sleep(options.rest)  # the measure is of an idle worker
        system.enqueue_each(paced(options.jobs, options.rate))
    else:
        first_due = time.time() + options.lead
        system.enqueue_due(
            first_due + options.span * i / options.jobs for i in range(options.jobs)
        )
        late = time.time() - first_due
        if late > 0:
            raise SystemExit(f"enqueueing ended {late:.2f} s after the first job was due")
        out["first_due"] = first_due
    print(json.dumps(out))


if __name__ == "__main__":
    main()
