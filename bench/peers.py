"""This app against the task queues Django users pick instead, in one sitting, on one
private redis-server: enqueue and drain rates (one worker, default concurrency, four
processes), the Redis commands and CPU each enqueued and drained job costs, idle
latency, delayed-job lateness, Redis memory per waiting job, worker memory, and the rate
and memory of one worker running jobs that wait, many at once (``io32``, ``io256``).
Runs are interleaved between the systems. Each system is set up as its own docs advise
for throughput (``bench/systems/<name>.py``); ``bench/published.py`` holds what each
project publishes of its speed.

    python3 -m venv bench-venv    # its own: arq holds redis-py below 6
    bench-venv/bin/pip install -e '.[django52,hiredis,bench]'
    bench-venv/bin/python -m bench.peers [--systems rq,celery] [--runs 3] [--scale 0.05]

Writes ``results.json``, ``results.md`` and ``chart.png`` to ``--out``
(``bench/results/``). ``--scale`` shrinks every job count, for a quick check.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from bench import report, workloads
from bench.procs import ROOT, compile_bytecode
from bench.systems import NAMES, load
from bench.systems.base import System
from bench.workloads import WORKLOADS, Bench
from tests.support.servers import RedisServer

SHARED = ("redis", "hiredis", "psutil", "matplotlib")


def versions(systems: list[System], client: redis.Redis) -> dict[str, str]:
    found = {
        "Python": platform.python_version(),
        "redis-server": client.info("server")["redis_version"],
        "OS": f"{platform.system()} {platform.release()}",
        "CPUs": str(os.cpu_count()),
    }
    for name in [d for s in systems for d in s.distributions] + list(SHARED):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def parameters(bench: Bench) -> dict[str, float]:
    """The sizes of this sitting's workloads, for the report."""
    return {
        "enqueue_jobs": bench.jobs(workloads.ENQUEUE_JOBS),
        "drain_jobs": bench.jobs(workloads.DRAIN_JOBS),
        "drain_cap": bench.drain_cap,
        "latency_jobs": bench.jobs(workloads.LATENCY_JOBS),
        "latency_rate": workloads.LATENCY_RATE,
        "delayed_jobs": bench.jobs(workloads.DELAYED_JOBS),
        "delayed_span": workloads.DELAYED_SPAN,
        "delayed_lead": workloads.DELAYED_LEAD,
        "memory_jobs": bench.jobs(workloads.MEMORY_JOBS),
        **{
            f"{name}_jobs": bench.jobs(load.at_once * load.rounds)
            for name, load in workloads.IO_LOADS.items()
        },
    }


def describe(system: System) -> dict[str, Any]:
    return {
        "title": system.title,
        "settings": system.settings,
        "io_settings": system.io_settings,
        "default_is_one": system.default_is_one,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(NAMES), help="comma-separated")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, of: %(default)s"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies job counts")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--drain-cap", type=float, default=30.0, help="seconds before a drain is cut short"
    )
    parser.add_argument(
        "--job-body",
        choices=("stamp", "redis"),
        default="stamp",
        help="what each job does: stamp a file (default), or that and one Redis INCR",
    )
    options = parser.parse_args()
    names = [name.strip() for name in options.systems.split(",") if name.strip()]
    chosen = [name.strip() for name in options.workloads.split(",") if name.strip()]
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if "redisqueue" not in names:
        names.insert(0, "redisqueue")  # every ratio needs it

    compile_bytecode()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    with RedisServer() as server:
        os.environ["BENCH_REDIS_URL"] = server.url  # read by the adapters on import
        os.environ["BENCH_JOB_BODY"] = options.job_body  # read by every worker's job
        systems = [load(name) for name in names]
        client = redis.Redis.from_url(server.url)
        bench = Bench(client, server.url, work, options.scale, options.drain_cap)
        data: dict[str, Any] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "command": shlex.join(["python", "-m", "bench.peers", *sys.argv[1:]]),
            "runs": options.runs,
            "scale": options.scale,
            "job_body": options.job_body,
            "versions": versions(systems, client),
            "systems": {s.name: describe(s) for s in systems},
            "parameters": parameters(bench),
            "failures": [],
        }
        for name, version in data["versions"].items():
            print(f"{name:>18} {version}")
        for run in range(1, options.runs + 1):
            bench.run = run
            # Each workload in turn for every system, so that the figures a ratio compares
            # are taken minutes apart at most; the order rotates between runs.
            shift = (run - 1) % len(systems)
            for label in chosen:
                for system in systems[shift:] + systems[:shift]:
                    began = time.monotonic()
                    try:
                        WORKLOADS[label](bench, system)
                    except Exception as exc:
                        message = f"run {run}, {system.title}, {label}: {exc}"
                        data["failures"].append(message.splitlines()[0])
                        print(f"FAILED {message}\n{traceback.format_exc()}", file=sys.stderr)
                        client.flushall()
                    took = time.monotonic() - began
                    print(f"run {run} {label:<13} {system.title:<17} {took:5.1f} s", flush=True)
            data["figures"], data["notes"] = bench.figures, bench.notes
            minutes, seconds = divmod(round(time.monotonic() - started), 60)
            data["duration"] = f"{minutes} min {seconds} s"
            report.write(data, options.out)  # after every run, so a crash keeps the rest
    print(report.markdown(data))
    if data["failures"]:
        print(f"Worker logs and stamps kept in {work}", file=sys.stderr)
        raise SystemExit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
