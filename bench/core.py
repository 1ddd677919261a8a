"""Measure this app alone: enqueue rate, drain rate, idle enqueue-to-start latency,
delayed-job lateness, and what an idle worker and scheduler send Redis.

    .venv/bin/python bench/core.py [--jobs 20000] [--latency-jobs 300] [--delayed-jobs 1000]

Starts a private redis-server on a free port; prints one line per figure.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import redis

from tests.support.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent


def manage(command: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "django", command, "-v0", *args], cwd=ROOT, env=env
    )


def worker(*args: str) -> subprocess.Popen:
    return manage("runworker", *args)


def commands_per_second(client: redis.Redis, seconds: float) -> float:
    """Commands the server executed per second (scripts count with what they run)."""
    client.config_resetstat()
    time.sleep(seconds)
    calls = sum(
        stat["calls"]
        for name, stat in client.info("commandstats").items()
        if name not in ("cmdstat_config", "cmdstat_info")
    )
    return calls / seconds


def wait_for_list(client: redis.Redis, key: str, length: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.llen(key) < length:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {client.llen(key)} of {length} jobs ran")
        time.sleep(0.05)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--latency-jobs", type=int, default=300)
    parser.add_argument("--delayed-jobs", type=int, default=1000)
    options = parser.parse_args()

    server = RedisServer()
    server.start()
    url = server.url
    os.environ["BENCH_REDIS_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from bench.tasks import noop, stamp, stamp_due
    from django_redisqueue.compat import task_backends

    client = redis.Redis.from_url(url)
    backend = task_backends["default"]
    try:
        noop.enqueue()  # load the scripts and open the connection
        client.flushall()

        started = time.perf_counter()
        for i in range(options.jobs):
            client.rpush("bench:bare", i)
        bare_rate = options.jobs / (time.perf_counter() - started)
        print(f"bare redis-py RPUSH loop (one round trip each): {bare_rate:,.0f} /s")
        client.delete("bench:bare")

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
        print(
            f"idle worker: {commands_per_second(client, 10):.2f} Redis commands/s executed "
            "(INFO commandstats over 10 s; a script counts with the commands it runs)"
        )
        for _ in range(options.latency_jobs):
            stamp.enqueue(time.time())
            time.sleep(0.01)
        wait_for_list(client, "bench:latency", options.latency_jobs)
        latencies = [float(v) for v in client.lrange("bench:latency", 0, -1)]
        print(
            f"idle enqueue-to-start latency ({options.latency_jobs} jobs at ~100/s): "
            f"p50 {statistics.median(latencies):.2f} ms, p99 {percentile(latencies, 99):.2f} ms"
        )

        idle.terminate()
        idle.wait()
        scheduler = manage("runscheduler")
        time.sleep(1.0)
        print(
            f"idle scheduler: {commands_per_second(client, 20):.2f} Redis commands/s "
            "executed (INFO commandstats over 20 s)"
        )
        busy = worker()
        time.sleep(1.0)
        n = options.delayed_jobs
        first_due = time.time() + 1.5
        for i in range(n):
            due = first_due + 2.0 * i / n
            stamp_due.using(run_after=datetime.fromtimestamp(due, UTC)).enqueue(due)
        assert time.time() < first_due, "enqueueing took longer than the head start"
        wait_for_list(client, "bench:lateness", n)
        lateness = [float(v) for v in client.lrange("bench:lateness", 0, -1)]
        print(
            f"delayed lateness, start minus due ({n} jobs due over 2 s, 1 scheduler, "
            f"1 worker): p50 {statistics.median(lateness):.2f} ms, "
            f"p99 {percentile(lateness, 99):.2f} ms, min {min(lateness):.2f} ms"
        )
        for process in (busy, scheduler):
            process.terminate()
            process.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
