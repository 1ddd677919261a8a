"""Measure this app alone: enqueue rate, drain rate and idle enqueue-to-start latency.

    .venv/bin/python bench/core.py [--jobs 20000] [--latency-jobs 300]

Starts a private redis-server on a free port; prints one line per figure.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

from django_redisqueue.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def worker(*args: str) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", "-v0", *args], cwd=ROOT, env=env
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--latency-jobs", type=int, default=300)
    options = parser.parse_args()

    server = RedisServer()
    server.start()
    url = server.url
    os.environ["BENCH_REDIS_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from bench.tasks import noop, stamp
    from django_redisqueue.compat import task_backends

    client = redis.Redis.from_url(url)
    backend = task_backends["default"]
    try:
        noop.enqueue()  # load the scripts and open the connection
        client.flushall()

        started = time.perf_counter()
        ids = [noop.enqueue().id for _ in range(options.jobs)]
        enqueue_rate = options.jobs / (time.perf_counter() - started)
        print(f"enqueue, one at a time: {enqueue_rate:,.0f} jobs/s ({options.jobs} jobs)")

        assert worker("--burst", "--concurrency", "1").wait() == 0
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(backend.keys.job(job_id), "started_at", "finished_at", "status")
        rows = pipe.execute()
        assert all(row[2] == b"SUCCESSFUL" for row in rows), "not every job succeeded"
        first_start = min(int(row[0]) for row in rows)
        last_finish = max(int(row[1]) for row in rows)
        drain_rate = options.jobs / ((last_finish - first_start) / 1000)
        print(
            f"drain, runworker --burst --concurrency 1: {drain_rate:,.0f} jobs/s "
            f"(first start to last finish, {options.jobs} no-op jobs)"
        )

        idle = worker()
        time.sleep(1.0)  # let it start and go idle: the measure is an idle worker
        client.config_resetstat()
        time.sleep(10.0)
        calls = sum(
            stat["calls"]
            for name, stat in client.info("commandstats").items()
            if name not in ("cmdstat_config", "cmdstat_info")
        )
        print(
            f"idle worker: {calls / 10:.2f} Redis commands/s executed (INFO commandstats "
            "over 10 s; a claim script counts with the commands it runs)"
        )
        for _ in range(options.latency_jobs):
            stamp.enqueue(time.time())
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        while client.llen("bench:latency") < options.latency_jobs:
            if time.monotonic() > deadline:
                raise SystemExit("latency jobs did not all run")
            time.sleep(0.05)
        idle.terminate()
        idle.wait()
        latencies = [float(v) for v in client.lrange("bench:latency", 0, -1)]
        print(
            f"idle enqueue-to-start latency ({options.latency_jobs} jobs at ~100/s): "
            f"p50 {statistics.median(latencies):.2f} ms, p99 {percentile(latencies, 99):.2f} ms"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
