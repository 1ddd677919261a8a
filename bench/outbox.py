"""What the outbox costs an enqueue inside a transaction, against the same enqueue on
commit without it, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.outbox [--transactions 2000] [--batches 20] [--runs 3]

On a private redis-server, in one process: ``--transactions`` transactions that each
enqueue one job (``enqueue_on_commit()`` without the outbox, ``enqueue()`` with it: a
row written in the transaction, relayed and deleted after the commit), and
``--batches`` transactions that each enqueue 1,000 jobs with ``enqueue_many()``; the
time per job from the start of the transaction to the job in Redis, median of
``--runs``. Each single-job transaction also writes a row, as a view's does: its
commit waits for the disk whether or not a job joins it; the same transaction without
a job gives the database's own cost. PostgreSQL is the
machine's (127.0.0.1:5432, user postgres), in a database of its own that the run drops.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.servers import RedisServer  # noqa: E402

POSTGRESQL = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": "redisqueue_bench_outbox",
    "HOST": "127.0.0.1",
    "USER": "postgres",
}
BATCH = 1000


def measure(transactions: int, batches: int, runs: int) -> dict[str, float]:
    """µs per job of each way, in this process (its settings name the database)."""
    from django.core.management import call_command
    from django.db import connection, transaction

    from bench import tasks
    from django_redisqueue.compat import task_backends
    from django_redisqueue.models import OutboxJob

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:  # the data a view's transaction writes
        cursor.execute("CREATE TABLE bench_data (note varchar(20))")

    def write_a_row() -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_data (note) VALUES (%s)", ["x"])

    plain = tasks.noop.using(backend="default")
    boxed = tasks.noop.using(backend="outbox")
    client = task_backends["default"].broker.client

    def one_per_transaction(enqueue) -> float:
        started = time.perf_counter()
        for _ in range(transactions):
            with transaction.atomic():
                enqueue()
        return (time.perf_counter() - started) / transactions * 1e6

    def batched(task) -> float:
        started = time.perf_counter()
        for _ in range(batches):
            with transaction.atomic():
                task.enqueue_many([((), {})] * BATCH)
        return (time.perf_counter() - started) / (batches * BATCH) * 1e6

    def with_a_row(enqueue):
        def both() -> None:
            write_a_row()
            enqueue()

        return both

    ways = {
        "a transaction that writes a row, no job": lambda: one_per_transaction(write_a_row),
        "a row and 1 job on commit": lambda: one_per_transaction(
            with_a_row(plain.enqueue_on_commit)
        ),
        "a row and 1 job through the outbox": lambda: one_per_transaction(
            with_a_row(boxed.enqueue)
        ),
        f"on commit, {BATCH:,} jobs per transaction": lambda: batched(
            plain.using(backend="oncommit")
        ),
        f"outbox, {BATCH:,} jobs per transaction": lambda: batched(boxed),
    }
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        for name, way in ways.items():  # interleaved: each run takes every way in turn
            client.flushall()
            figures[name].append(way())
    assert not OutboxJob.objects.exists(), "rows left in the outbox"
    return {name: statistics.median(values) for name, values in figures.items()}


def child(database: str, redis_url: str, args: argparse.Namespace) -> dict[str, float]:
    aliases = {
        "outbox": {"URL": redis_url, "OUTBOX": True},
        "oncommit": {"URL": redis_url, "ENQUEUE_ON_COMMIT": True},
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_REDIS_URL": redis_url,
        "BENCH_REDIS_ALIASES": json.dumps(aliases),
        "BENCH_DATABASE": json.dumps(POSTGRESQL) if database == "postgresql" else "",
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench.outbox", "--child", *sys.argv[1:]],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import django

        django.setup()
        print(json.dumps(measure(args.transactions, args.batches, args.runs)))
        return
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c"]
    subprocess.run([*psql, f"DROP DATABASE IF EXISTS {POSTGRESQL['NAME']}"], check=True)
    subprocess.run([*psql, f"CREATE DATABASE {POSTGRESQL['NAME']}"], check=True)
    server = RedisServer()
    server.start()
    try:
        results = {db: child(db, server.url, args) for db in ("sqlite", "postgresql")}
    finally:
        server.stop()
        subprocess.run([*psql, f"DROP DATABASE IF EXISTS {POSTGRESQL['NAME']}"], check=False)
    print(f"µs per job, median of {args.runs} interleaved runs")
    print(f"| way | {' | '.join(results)} |")
    print(f"|---|{'---|' * len(results)}")
    for name in results["sqlite"]:
        print(f"| {name} | " + " | ".join(f"{r[name]:.0f}" for r in results.values()) + " |")


if __name__ == "__main__":
    main()
