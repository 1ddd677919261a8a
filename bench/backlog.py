"""Does a job cost more when many wait? One worker's figures with a backlog of 10,000
and of 1,000,000 waiting jobs, and with 1,000 queues to look through.

For each backlog, on a private redis-server emptied first: the backlog is filled
(``enqueue_many()``, untimed), then, each over ``--sample`` jobs: the enqueue rate
(one ``enqueue()`` call per job), the time of each claim (the call that finishes one
job and claims the next, as a busy worker makes it, timed around the call: p50 and p99)
and the drain rate of a worker in this process (``Worker(max_jobs=...)``, its jobs
stamping a file as the peer benchmark's do); and the Redis memory per waiting job
(``used_memory`` over the backlog). The last row drains the same way with a worker
serving 1,000 queues, the jobs in the last of them: a worker that serves every queue
used (``QUEUES`` empty) once 1,000 have been used.

    .venv/bin/python -m bench.backlog                               # about 3 minutes
    .venv/bin/python -m bench.backlog --backlogs 10000,100000 --sample 2000

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.servers import RedisServer

CHUNK = 1000  # jobs per enqueue_many() call while filling


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(backlog: int, sample: int, queues: list[str]) -> dict[str, float]:
    """The figures of one backlog (see the module's docstring)."""
    import redis

    from bench.tasks import job
    from django_redisqueue.compat import task_backends
    from django_redisqueue.runtime.worker import Worker

    backend = task_backends["default"]
    client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    client.flushall()
    before = client.info("memory")["used_memory"]
    for first in range(0, backlog, CHUNK):
        job.enqueue_many(((i,), {}) for i in range(first, min(backlog, first + CHUNK)))
    memory = (client.info("memory")["used_memory"] - before) / max(1, backlog)

    started = time.perf_counter()
    for i in range(sample):
        job.enqueue(i)
    enqueue_rate = sample / (time.perf_counter() - started)

    # Claims as a worker makes them: each finishes the job before (fenced) and claims.
    broker = backend.broker.pinned()
    claims: list[float] = []
    finished = None
    for _ in range(sample):
        began = time.perf_counter()
        _, claimed = broker.claim(queues, "bench-backlog", finished, broadcasts=False)
        claims.append((time.perf_counter() - began) * 1e6)
        finished = _success(claimed)
    broker.claim([], "bench-backlog", finished, broadcasts=False)
    broker.close()

    worker = Worker(backend, queues, max_jobs=sample)
    started = time.perf_counter()
    worker.run()
    drain_rate = worker.jobs_done / (time.perf_counter() - started)
    return {
        "memory": memory,
        "enqueue": enqueue_rate,
        "claim_p50": percentile(claims, 50),
        "claim_p99": percentile(claims, 99),
        "drain": drain_rate,
    }


def _success(claimed: Any) -> Any:
    from django_redisqueue.core.jobs import SUCCESSFUL
    from django_redisqueue.store.wire import Outcome

    if claimed is None:
        raise RuntimeError("the backlog ran out: raise it, or lower --sample")
    return Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", default="10000,1000000", help="comma-separated")
    parser.add_argument("--sample", type=int, default=5000, help="jobs timed per figure")
    parser.add_argument("--queues", type=int, default=1000, help="for the last row")
    options = parser.parse_args()
    backlogs = [int(b) for b in options.backlogs.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    with RedisServer() as server:
        os.environ.update(
            BENCH_REDIS_URL=server.url,
            BENCH_STAMPS=str(work / "stamps"),
            DJANGO_SETTINGS_MODULE="bench.settings",
        )
        import django

        django.setup()
        measure(CHUNK, sample=200, queues=["default"])  # warm-up: connections, scripts
        rows: list[tuple[str, dict[str, float]]] = []
        for backlog in backlogs:
            rows.append(
                (
                    f"{backlog:,} waiting",
                    measure(backlog, sample=options.sample, queues=["default"]),
                )
            )
        many = [f"empty-{i:04d}" for i in range(options.queues - 1)] + ["default"]
        smallest = min(backlogs)
        rows.append(
            (
                f"{smallest:,} waiting, {options.queues:,} queues served",
                measure(smallest, sample=options.sample, queues=many),
            )
        )
    print(
        "| backlog | Redis bytes per waiting job | enqueue (jobs/s) | claim p50 (µs) | "
        "claim p99 (µs) | drain, one process (jobs/s) |"
    )
    print("|---|---|---|---|---|---|")
    for (label, row), queues_row in zip(rows, [False] * len(backlogs) + [True], strict=True):
        # The last row's backlog is the first's: its memory figure would repeat it.
        memory = "" if queues_row else f"{row['memory']:.0f}"
        print(
            f"| {label} | {memory} | {row['enqueue']:,.0f} | "
            f"{row['claim_p50']:.0f} | {row['claim_p99']:.0f} | {row['drain']:,.0f} |"
        )


if __name__ == "__main__":
    main()
