"""What a fair queue costs against a queue that is not fair.

On a private redis-server, per job over ``--jobs`` jobs: Redis memory per waiting job
(``used_memory`` before and after the fill), then the commands and Redis CPU of a drain
by claims that each finish the job before (as a busy worker makes them; counted as
``bench/redisstats.py`` counts them), for a plain queue and for a fair queue whose jobs
share 1, 100 or 10,000 fairness keys (the keys take turns: the first key's jobs, then
the next's, as a SaaS backlog mixes them).

    .venv/bin/python -m bench.fairness              # about half a minute
    .venv/bin/python -m bench.fairness --jobs 50000

Prints a markdown table. docs/howto/tasks.md ("Share a queue fairly") reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import redis

from bench.claim_cost import drain, measured
from tests.support.servers import RedisServer


def run(client: redis.Redis, jobs: int, keys: int | None) -> tuple[float, float, float]:
    """Bytes per waiting job, then commands and Redis CPU µs per drained job, on the
    plain backend (``keys`` None) or the fair one with ``keys`` fairness keys."""
    from bench.tasks import job
    from django_redisqueue.compat import task_backends

    alias = "default" if keys is None else "fair"
    client.flushall()
    before = client.info("memory")["used_memory"]
    for key in range(keys or 1):
        task = job.using(backend=alias, fair_key=None if keys is None else f"customer-{key}")
        task.enqueue_many([((i,), {}) for i in range(jobs // (keys or 1))])
    waiting = client.info("memory")["used_memory"] - before
    broker = task_backends[alias].broker.pinned()
    commands, cpu = measured(client, jobs, lambda: drain(broker, jobs))
    broker.close()
    return waiting / jobs, commands, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    jobs = parser.parse_args().jobs
    with RedisServer() as server:
        fair = {"URL": server.url, "FAIR_QUEUES": ["default"]}
        os.environ.update(
            BENCH_REDIS_URL=server.url,
            BENCH_REDIS_ALIASES=json.dumps({"fair": fair}),
            BENCH_STAMPS=str(Path(tempfile.mkdtemp(prefix="bench-fair-")) / "stamps"),
            DJANGO_SETTINGS_MODULE="bench.settings",
        )
        import django

        django.setup()
        client = redis.Redis.from_url(server.url)
        run(client, 500, 10)  # warm-up: connections, scripts
        rows = {"not fair": run(client, jobs, None)}
        for keys in (1, 100, 10_000):
            rows[f"fair, {keys:,} key{'s' if keys > 1 else ''}"] = run(client, jobs, keys)
        version = client.info("server")["redis_version"]
    print(f"{jobs:,} jobs, one private redis-server {version}.\n")
    print("| queue | bytes per waiting job | commands per drained job | Redis CPU (µs) |")
    print("|---|---|---|---|")
    for label, (size, commands, cpu) in rows.items():
        print(f"| {label} | {size:.0f} | {commands:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
