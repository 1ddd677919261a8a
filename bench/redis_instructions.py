"""What each protocol step costs Redis, in instructions: repeatable to the last few
hundred whatever else the machine does, where Redis CPU time (``bench/claim_cost.py``)
drifts by a quarter on a shared VM. For comparing a change with the code before it.

A private redis-server runs under ``valgrind --tool=callgrind`` (Debian's valgrind; about
a minute); ``callgrind_control`` dumps its count around each step. Per step, averaged
over ``--calls``, the scripts called as Redis Functions and by EVALSHA:

- an enqueue (no worker idle);
- a claim that stores the outcome of the job before it (a busy worker's one call);
- a claim that finds nothing and registers its worker as idle;
- a hand-off cycle: a claim that stores an outcome and registers, an enqueue handed
  over to that worker, and the claim that takes it;
- a bare ``RPUSH`` of the same payload, for scale.

    .venv/bin/python -m bench.redis_instructions
    .venv/bin/python -m bench.redis_instructions --calls 1000

Prints a markdown table. docs/protocol.md ("Redis Functions") quotes it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_redisqueue.core.jobs import SUCCESSFUL  # noqa: E402
from django_redisqueue.store.broker import Broker  # noqa: E402
from django_redisqueue.store.keys import KeySchema  # noqa: E402
from django_redisqueue.store.wire import NewJob, Outcome  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

PAYLOAD = '{"v":1,"task":"bench.tasks.job","args":[1]}'
IDLE_MS = 6000


class CountedRedis:
    """A redis-server under callgrind, whose instructions are read between steps."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
        self.port = free_port()
        self.out = self.directory / "callgrind.out"
        # hz 1: the server's own timer work, counted with each step, kept small.
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}"]
        command += ["redis-server", "--port", str(self.port), "--save", "", "--hz", "1"]
        command += ["--appendonly", "no", "--dir", str(self.directory)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def count(self) -> int:
        """Instructions since the last count (callgrind dumps, then starts again)."""
        before = set(self.directory.glob("callgrind.out.*"))
        subprocess.run(["callgrind_control", "-d", str(self.process.pid)], capture_output=True)
        deadline = time.monotonic() + 30
        while not (new := set(self.directory.glob("callgrind.out.*")) - before):
            if time.monotonic() > deadline:
                raise TimeoutError("callgrind wrote no dump")
            time.sleep(0.05)
        (dump,) = new
        time.sleep(0.2)  # written whole
        found = re.search(r"^(?:summary|totals):\s*(\d+)", dump.read_text(), re.MULTILINE)
        dump.unlink()
        if found is None:
            raise ValueError(f"no total in {dump}")
        return int(found.group(1))

    def per_call(self, calls: int, step: Callable[[int], None]) -> float:
        self.count()
        for i in range(calls):
            step(i)
        return self.count() / calls

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        shutil.rmtree(self.directory, ignore_errors=True)


def steps(server: CountedRedis, broker: Broker, calls: int) -> dict[str, float]:
    server.client.flushall()
    held: list[Outcome | None] = [None]

    def claim_and_finish(i: int) -> None:
        _, claimed = broker.claim(["default"], "w", held[0], broadcasts=False)
        assert claimed is not None, "the queue ran out"
        held[0] = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")

    def hand_off(i: int) -> None:
        broker.claim(["default"], "w", held[0], broadcasts=False, idle_ms=IDLE_MS)
        broker.enqueue([NewJob(f"h{i}", "default", 0, PAYLOAD)])
        _, claimed = broker.claim(["default"], "w", None, broadcasts=False, take_handed=True)
        assert claimed is not None, "the job was not handed over"
        held[0] = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")

    for i in range(20):  # warm-up: connections, libraries, keys
        broker.enqueue([NewJob(f"w{i}", "default", 0, PAYLOAD)])
        claim_and_finish(i)
    rows = {
        "enqueue": server.per_call(
            calls, lambda i: broker.enqueue([NewJob(f"j{i}", "default", 0, PAYLOAD)])
        ),
        "claim, with the outcome of the job before": server.per_call(calls, claim_and_finish),
    }
    broker.claim([], "w", held[0], broadcasts=False)
    held[0] = None
    rows["claim that finds nothing and registers"] = server.per_call(
        calls, lambda i: broker.claim(["default"], "w", None, broadcasts=False, idle_ms=IDLE_MS)
    )
    rows["hand-off cycle (two claims, one enqueue)"] = server.per_call(calls, hand_off)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    options = parser.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind is not installed: sudo apt-get install valgrind")
    server = CountedRedis()
    try:
        broker = Broker(server.client, KeySchema("{drq:bench}"), lease=30, result_ttl=60)
        functions = steps(server, broker, options.calls)
        broker.scripts.functions = False
        scripts = steps(server, broker, options.calls)
        rpush = server.per_call(options.calls, lambda i: server.client.rpush("list", PAYLOAD))
        version = server.client.info("server")["redis_version"]
    finally:
        server.stop()
    print(f"Instructions per step, one private redis-server {version} under callgrind,")
    print(f"averaged over {options.calls:,} calls.\n")
    print("| step | as Redis Functions | by EVALSHA |")
    print("|---|---|---|")
    for label, count in functions.items():
        print(f"| {label} | {count:,.0f} | {scripts[label]:,.0f} |")
    print(f"| a bare RPUSH, for scale | {rpush:,.0f} | |")


if __name__ == "__main__":
    main()
