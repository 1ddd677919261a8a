"""What one ``task.enqueue()`` costs the process that calls it: instructions (under
``valgrind --tool=callgrind``, repeatable to a fraction of a percent whatever else the
machine does, where its CPU time drifts by a quarter on a shared VM) and system calls
(``strace -c``). For comparing a change with the code before it: run it on each.

Each count is taken twice, over a short and a long run of the same process, and the
difference divided by the extra enqueues, so that Django's set-up and the first calls
drop out. The jobs go to a private redis-server.

    python -m bench.enqueue_cost
    PYTHONPATH=/other/checkout python -m bench.enqueue_cost   # that checkout's app

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import redis

from bench.procs import ROOT
from tests.support.servers import RedisServer

# The calling process: Django set up with the benchmark's settings, then N enqueues.
CALLER = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
import django
django.setup()
from bench.tasks import job
for _ in range(int(sys.argv[1])):
    job.enqueue(1.0)
"""


def caller(runs: int) -> list[str]:
    return [sys.executable, "-c", CALLER, str(runs)]


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # From a directory of its own: ``python -c`` imports from its working directory
    # first, which would take this checkout's code over PYTHONPATH's.
    with tempfile.TemporaryDirectory() as elsewhere:
        return subprocess.run(
            command, env=env, cwd=elsewhere, capture_output=True, text=True, check=True
        )


def instructions(runs: int, env: dict[str, str]) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *caller(runs)]
    done = run(command, env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise ValueError(f"callgrind said no total: {done.stderr[-500:]}")
    return int(found.group(1))


def system_calls(runs: int, env: dict[str, str]) -> Counter[str]:
    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        command = ["strace", "-f", "-c", "-o", out.name, *caller(runs)]
        run(command, env)
        counts: Counter[str] = Counter()
        for line in Path(out.name).read_text().splitlines():
            fields = line.split()
            # % time, seconds, usecs/call, calls, [errors,] syscall
            if len(fields) >= 5 and fields[3].isdigit() and not line.startswith("100.00"):
                counts[fields[-1]] = int(fields[3])
        return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="enqueues measured")
    options = parser.parse_args()
    short, long = 200, 200 + options.calls
    with RedisServer() as server:
        env = {
            **os.environ,
            "BENCH_REDIS_URL": server.url,
            "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
        }
        client = redis.Redis.from_url(server.url)
        counts = []
        for runs in (short, long):
            counts.append(instructions(runs, env))
            client.flushall()
        calls = [system_calls(runs, env) for runs in (short, long)]
    per_call = (counts[1] - counts[0]) / options.calls
    extra = {name: (calls[1][name] - calls[0][name]) / options.calls for name in calls[1]}
    print(f"| figure, per `task.enqueue()` ({options.calls:,} measured) | value |")
    print("|---|---:|")
    print(f"| client instructions | {per_call:,.0f} |")
    print(f"| system calls | {sum(extra.values()):.1f} |")
    for name, value in sorted(extra.items(), key=lambda item: -item[1]):
        if value >= 0.05:
            print(f"| `{name}` | {value:.2f} |")


if __name__ == "__main__":
    main()
