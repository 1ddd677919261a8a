"""Fan-out figures: how fast a large group is enqueued, how soon its callback starts
after its last member ends, and what many jobs waiting for one job cost.

    .venv/bin/python -m bench.fanout [--members 10000] [--runs 5] [--groups 200]
        [--dependents 20000]

On a private redis-server: a group of ``--members`` jobs (plus a callback) enqueued
``--runs`` times, against ``enqueue_many()`` of as many jobs; then ``--groups`` groups
of 4 members run by ``runworker --concurrency 2``, timing from the moment the last
member's task returned to the moment the callback's task started (both on this host's
clock, recorded by the tasks). Last, ``--dependents`` jobs enqueued one by one with
``depends_on`` one job: the time per enqueue, for the first and the last thousand, and
the time Redis spends in the script that ends that job and lets them all go (its
SLOWLOG entry).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.servers import RedisServer  # noqa: E402


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


def enqueue_rates(members: int, runs: int, client) -> tuple[list[float], list[float]]:
    from bench import tasks
    from django_redisqueue import group

    grouped, bulk = [], []
    for _ in range(runs):
        client.flushall()
        started = time.perf_counter()
        group([tasks.noop.job() for _ in range(members)], callback=tasks.noop.job()).enqueue()
        grouped.append(members / (time.perf_counter() - started))
        client.flushall()
        started = time.perf_counter()
        tasks.noop.enqueue_many([((), {})] * members)
        bulk.append(members / (time.perf_counter() - started))
    client.flushall()
    return grouped, bulk


def callback_delays(groups: int, client) -> list[float]:
    from bench import tasks
    from django_redisqueue import group

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", "--concurrency", "2", "-v", "0"],
        cwd=ROOT,
        env=env,
    )
    delays = []
    try:
        for i in range(groups):
            key = f"bench:group:{i}"
            group(
                [tasks.group_member.job(key) for _ in range(4)],
                callback=tasks.group_callback.job(key),
            ).enqueue()
            started = client.blpop([f"{key}:start"], timeout=30)
            assert started is not None, "the callback did not start within 30 s"
            last_end = max(float(t) for t in client.lrange(f"{key}:end", 0, -1))
            delays.append((float(started[1]) - last_end) * 1000)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return delays


def dependents_costs(count: int, client) -> tuple[float, float, float]:
    """ms per depends_on enqueue for the first and the last 1,000 of ``count``, and ms
    of Redis time in the finish that lets them go."""
    from bench import tasks
    from django_redisqueue.compat import task_backends
    from django_redisqueue.store.wire import Outcome

    client.flushall()
    parent = tasks.noop.enqueue()
    waiting = tasks.noop.using(depends_on=parent)
    per_enqueue = []
    for _ in range(count):
        started = time.perf_counter()
        waiting.enqueue()
        per_enqueue.append((time.perf_counter() - started) * 1000)
    broker = task_backends["default"].broker
    claimed = broker.claim(["default"], "bench")[1]
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    broker.finish(Outcome(claimed.job_id, claimed.owner, "SUCCESSFUL", result="null"))
    slowest = max(entry["duration"] for entry in client.slowlog_get(128)) / 1000
    client.config_set("slowlog-log-slower-than", 10_000)
    client.flushall()
    first = statistics.median(per_enqueue[:1000])
    return first, statistics.median(per_enqueue[-1000:]), slowest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--dependents", type=int, default=20_000)
    options = parser.parse_args()

    with RedisServer() as server:
        os.environ["BENCH_REDIS_URL"] = server.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
        import django

        django.setup()
        import redis

        client = redis.Redis.from_url(server.url)
        grouped, bulk = enqueue_rates(options.members, options.runs, client)
        print(
            f"group of {options.members:,} + callback: median {statistics.median(grouped):,.0f} "
            f"jobs/s (min {min(grouped):,.0f}, max {max(grouped):,.0f}) over {options.runs} runs"
        )
        print(
            f"enqueue_many of {options.members:,}: median {statistics.median(bulk):,.0f} jobs/s "
            f"(min {min(bulk):,.0f}, max {max(bulk):,.0f})"
        )
        delays = callback_delays(options.groups, client)
        print(
            f"last member's end -> callback's start, {options.groups} groups of 4: "
            f"p50 {percentile(delays, 0.5):.2f} ms, p99 {percentile(delays, 0.99):.2f} ms, "
            f"max {max(delays):.2f} ms"
        )
        first, last, release = dependents_costs(options.dependents, client)
        print(
            f"{options.dependents:,} jobs depending on one: enqueue median {first:.3f} ms "
            f"(first 1,000), {last:.3f} ms (last 1,000); the finish letting them go: "
            f"{release:.1f} ms in Redis"
        )


if __name__ == "__main__":
    main()
