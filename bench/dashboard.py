"""Render times of the admin dashboard and the metrics view at scale: 1,000,000 waiting
jobs, 100,000 delayed.

    .venv/bin/python bench/dashboard.py [--waiting 1000000] [--delayed 100000]

Fills a private redis-server through the real enqueue script (pipelined), then times
each page through Django's test client (median of 5 requests, whole request).
"""

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.servers import RedisServer  # noqa: E402


def fill(backend, count: int, queue: str, due_from: int = 0) -> None:
    from django_redisqueue.core.jobs import Envelope

    backend.broker.scripts.load(backend.broker.client, ["enqueue"])  # a pipeline does not
    pipe = backend.broker.client.pipeline(transaction=False)
    for i in range(count):
        payload = Envelope("bench.tasks.noop", [i], {}, queue).dumps()
        due = due_from + i if due_from else 0
        job = [uuid.uuid4().hex, payload, queue, 0, due, ""]
        backend.broker.scripts.queue(pipe, "enqueue", [0, "", *job])  # no lease: no hand-off
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--delayed", type=int, default=100_000)
    options = parser.parse_args()

    with RedisServer() as server:
        os.environ["BENCH_REDIS_URL"] = server.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
        os.environ["REDISQUEUE_TEST_URL"] = server.url
        import django

        django.setup()
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment

        from django_redisqueue.compat import task_backends

        setup_test_environment()
        settings.ALLOWED_HOSTS = ["testserver"]
        call_command("migrate", verbosity=0)
        backend = task_backends["default"]

        started = time.perf_counter()
        fill(backend, options.waiting, "default")
        fill(backend, options.delayed, "low", due_from=int(time.time() * 1000) + 3_600_000)
        filled = time.perf_counter() - started
        memory = backend.broker.client.info("memory")["used_memory_human"]
        print(
            f"filled {options.waiting:,} waiting + {options.delayed:,} delayed jobs in "
            f"{filled:.0f} s; Redis uses {memory}"
        )

        User.objects.create_superuser("root", "root@example.com", "pw")
        client = Client()
        client.login(username="root", password="pw")
        base = "/admin/django_redisqueue/dashboard/default/"
        pages = [
            ("overview", base),
            ("overview, refresh", base + "?partial=1"),
            ("queue, first page", base + "queue/default/"),
            ("queue, page 10,000", base + "queue/default/?page=10000"),
            ("delayed, first page", base + "delayed/low/"),
            ("delayed, last page", base + f"delayed/low/?page={options.delayed // 50}"),
            ("running", base + "running/"),
            ("failed", base + "failed/default/"),
            ("metrics (Prometheus)", "/metrics"),
        ]
        print("| page | median ms (5 requests) |\n|---|---|")
        for name, url in pages:
            times = []
            for _ in range(5):
                t = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - t) * 1000)
                assert response.status_code == 200, (url, response.status_code)
            print(f"| {name} | {statistics.median(times):.1f} |")


if __name__ == "__main__":
    main()
