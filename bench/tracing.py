"""What tracing costs: single enqueues and a one-process drain, with OpenTelemetry off
(not installed), installed with no SDK set up, and recording every span.

    .venv/bin/python -m bench.tracing [--jobs 5000] [--runs 3]

On a private redis-server, each way in a process of its own, interleaved over
``--runs``: ``--jobs`` jobs enqueued one call each (``noop.enqueue()``), then drained by
one worker in that process (burst). Prints, per way, the median of the runs: jobs per
second, the process's CPU time per job (less swayed by a busy machine than the rates),
and a waiting job's memory (``MEMORY USAGE`` of its hash). "recording" is the
SDK with a ``BatchSpanProcessor`` whose exporter drops the spans: what the app and the
SDK spend, not what an exporter's network does.
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

WAYS = {
    "off (no opentelemetry)": "off",
    "API installed, no SDK": "api",
    "recording every span": "recording",
}


def set_up(way: str) -> None:
    """Make this process trace as ``way`` says, before Django starts."""
    if way == "off":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # as if not installed
    elif way == "recording":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropped(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        trace.set_tracer_provider(provider)


def measure(way: str, jobs: int) -> dict[str, float]:
    set_up(way)
    import django

    django.setup()
    from bench import tasks
    from django_redisqueue.compat import task_backends
    from django_redisqueue.core import tracing
    from django_redisqueue.runtime.worker import Worker

    assert tracing.ON is (way != "off")
    backend = task_backends["default"]
    client = backend.broker.client
    client.flushall()
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(jobs):
        tasks.noop.enqueue()
    enqueued, enqueue_cpu = time.perf_counter() - started, time.process_time() - cpu
    first = client.zrange(backend.keys.queue("default"), 0, 0)[0].decode()
    memory = client.memory_usage(backend.keys.job(first)) or 0
    started, cpu = time.perf_counter(), time.process_time()
    Worker(backend, burst=True).run()
    tracing.flush()  # the spans' export counts too
    drained, drain_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert client.zcard(backend.keys.queue("default")) == 0
    return {
        "enqueue": jobs / enqueued,
        "enqueue_cpu": enqueue_cpu / jobs * 1e6,
        "drain": jobs / drained,
        "drain_cpu": drain_cpu / jobs * 1e6,
        "memory": memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.jobs)))
        return
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in WAYS}
    with RedisServer() as server:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "BENCH_REDIS_URL": server.url,
        }
        for _ in range(args.runs):
            for name, way in WAYS.items():  # interleaved: each run takes every way in turn
                done = subprocess.run(
                    [sys.executable, "-m", "bench.tracing", "--child", way, "--jobs",
                     str(args.jobs)],
                    env=env, cwd=ROOT, capture_output=True, text=True, check=True,
                )  # fmt: skip
                figures[name].append(json.loads(done.stdout.splitlines()[-1]))
    columns = {
        "enqueue": "enqueue jobs/s",
        "enqueue_cpu": "CPU µs/enqueue",
        "drain": "drain jobs/s",
        "drain_cpu": "worker CPU µs/job",
        "memory": "bytes/waiting job",
    }
    print(f"| way | {' | '.join(columns.values())} |")
    print(f"|---|{'---:|' * len(columns)}")
    for name, runs in figures.items():
        cells = [f"{statistics.median(r[key] for r in runs):,.0f}" for key in columns]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
