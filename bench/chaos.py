"""Idle workers killed: does a job handed to a dead worker wait for it?

A worker SIGKILLed while idle stays registered for up to 6 s; a job handed to it
(docs/protocol.md, "The hand-off") goes back to its queue after 1 s. On a private
redis-server, one ``runscheduler`` and ``--workers`` ``runworker --concurrency 1``
(``bench/settings.py``, LEASE 60 s) run ``--jobs`` jobs enqueued at ``--rate`` per
second, whose task records its number and Redis's ``TIME`` at each run. Every
``--kill-every`` s a worker standing idle (``{P}:idle-worker:<wid>``; at random, or
``--pick latest``, the latest registered) is SIGKILLed and replaced (logged).
``--group N`` instead kills a whole ``runworker --concurrency N`` just after each of its
workers ran a job (every registration fresh), starts another and enqueues at once.
``--threads N`` instead runs ``--workers`` ``runworker --threads N`` (LEASE 2 s,
MAX_RECOVERIES 10) on jobs that each wait ``--job-ms``, and every ``--kill-every`` s
SIGKILLs one at random, busy or not, mid-jobs, and starts another: a job may run again
only if a worker died running it ("twice while their worker lived" must be 0).
Printed: lost (never ran), run twice, the pickup (the task's start minus the job's
``enqueued_at``, both Redis's clock) p50/p90/p99/max, the kills, what the scheduler's
log gave back from hand-offs or recovered after a lease, and the jobs over 2 s.

    .venv/bin/python -m bench.chaos                                 # about 30 s
    .venv/bin/python -m bench.chaos --jobs 200 --rate 10 --workers 3 --kill-every 1.0
    .venv/bin/python -m bench.chaos --group 4 --jobs 10
    .venv/bin/python -m bench.chaos --threads 8 --jobs 1000 --rate 50 --kill-every 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import redis

from bench.backlog import percentile
from bench.systems.base import python
from django_redisqueue.store.keys import KeySchema
from tests.support.servers import RedisServer, wait_for

RUNS = "bench:chaos:runs"  # chaos_job's ledger: "<number> <ms>" per run
SLOTS = "bench:chaos:slots"  # chaos_slot_job's: "start|end <number> <pid>" per run
# --threads: leases short enough for the killed workers' jobs to come back soon, and
# enough recoveries for a job whose workers are killed again and again.
THREADS_OPTIONS = {"LEASE": 2, "MAX_RECOVERIES": 10}
SLOW_MS = 2000  # the target's p99: jobs slower than this are listed
WORKER = ("runworker", "--concurrency", "1")
Process = subprocess.Popen[bytes]


class Bench:
    """The processes of one run, the workers killed, and what Redis says of them."""

    def __init__(self, client: redis.Redis, keys: KeySchema, env: dict[str, str]) -> None:
        self.client, self.keys, self.env = client, keys, env
        self.log = Path(tempfile.mkdtemp(prefix="bench-chaos-")) / "processes.log"
        self.live: list[Process] = []
        self.killed: set[str] = set()  # worker ids
        self.threads = 0  # --threads N: the workers run N jobs at once
        self.killed_pids: set[int] = set()  # --threads: the processes killed
        self.not_idle = 0  # killed workers whose registration had gone by the kill
        self.skipped = 0  # kills that found no worker standing idle

    def start(self, *args: str) -> Process:
        command = python("-m", "django", *args, "--settings", "bench.settings")
        with open(self.log, "ab") as out:
            # A session of its own, so that a kill reaches a pool's children too.
            process = subprocess.Popen(
                command, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.live.append(process)
        return process

    def standing(self) -> dict[str, int]:
        """Each live worker's standing idle registration: worker id -> its ms."""
        prefix = self.keys.idle_worker("")
        found = {}
        for key in self.client.scan_iter(match=prefix + "*", count=1000):
            worker_id = key[len(prefix) :]
            if (value := self.client.get(key)) and worker_id not in self.killed:
                found[worker_id] = int(cast(str, value).split("|")[0])
        return found

    def wait_standing(self, count: int) -> dict[str, int]:
        def enough() -> dict[str, int] | None:
            if exited := [p.args for p in self.live if p.poll() is not None]:
                raise RuntimeError(f"exited: {exited}; see {self.log}")
            return standing if len(standing := self.standing()) >= count else None

        return wait_for(f"{count} workers to stand idle", enough, 60)

    def kill(self, process: Process, worker_ids: list[str]) -> None:
        # A registration changed across the kill: handed a job or claiming, perhaps busy.
        before = [self.client.get(self.keys.idle_worker(w)) for w in worker_ids]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self.live.remove(process)  # reaped: its pid, free for reuse, is never signalled
        with open(self.log, "a") as out:  # in the log's format, to read beside its lines
            out.write(f"{datetime.now():%Y-%m-%d %H:%M:%S,%f}"[:-3] + f" SIGKILL {worker_ids}\n")
        for worker_id, value in zip(worker_ids, before, strict=True):
            self.killed.add(worker_id)
            after = self.client.get(self.keys.idle_worker(worker_id))
            self.not_idle += value is None or after != value

    def stop(self) -> None:
        for process in self.live:
            process.terminate()  # the group leader: a pool stops its children itself
        for process in self.live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(20)
            with contextlib.suppress(ProcessLookupError):  # what a stuck stop left
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def enqueue_paced(bench: Bench, options: argparse.Namespace, workers: list[Process]) -> list[Any]:
    """Enqueue the jobs at the rate; with ``workers``, kill one every --kill-every s."""
    from bench.tasks import chaos_job, chaos_slot_job

    results: list[Any] = []
    began = time.monotonic()
    next_kill = began + options.kill_every if workers else float("inf")
    for number in range(options.jobs):
        due = began + number / options.rate
        while (now := time.monotonic()) < due or now >= next_kill:
            if now >= next_kill:
                if options.threads:
                    kill_busy_worker(bench, options.threads, workers)
                else:
                    kill_idle_worker(bench, options.pick, workers)
                next_kill += options.kill_every
            else:
                time.sleep(min(due, next_kill) - now)
        if options.threads:
            results.append(chaos_slot_job.enqueue(number, options.job_ms))
        else:
            results.append(chaos_job.enqueue(number))
    return results


def kill_busy_worker(bench: Bench, threads: int, workers: list[Process]) -> None:
    """SIGKILL a ``runworker --threads`` at random, whatever it runs, and start another."""
    process = random.choice(workers)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    bench.live.remove(process)
    bench.killed_pids.add(process.pid)
    with open(bench.log, "a") as out:
        out.write(f"{datetime.now():%Y-%m-%d %H:%M:%S,%f}"[:-3] + f" SIGKILL {process.pid}\n")
    workers.remove(process)
    workers.append(bench.start("runworker", "--threads", str(threads)))


def idle_figures(bench: Bench) -> list[tuple[str, str]]:
    return [
        ("workers killed (kills skipped: none idle)", f"{len(bench.killed)} ({bench.skipped})"),
        ("of them not standing idle at the kill", f"{bench.not_idle}"),
    ]


def slot_figures(bench: Bench) -> list[tuple[str, str]]:
    """--threads: the kills, the runs they cut short, and the jobs run twice although
    the worker of their earlier run lived (each run's worker by its pid)."""
    started: dict[int, list[int]] = {}  # number -> the pid of each run, in order
    ended: set[tuple[int, int]] = set()
    for entry in bench.client.lrange(SLOTS, 0, -1):
        what, number, pid = entry.split()
        if what == "start":
            started.setdefault(int(number), []).append(int(pid))
        else:
            ended.add((int(number), int(pid)))
    cut_short = sum((number, pid) not in ended for number, pids in started.items() for pid in pids)
    twice_alive = sum(
        any(pid not in bench.killed_pids for pid in pids[:-1]) for pids in started.values()
    )
    return [
        ("worker processes killed", f"{len(bench.killed_pids)}"),
        ("runs cut short by a kill (started, never ended)", f"{cut_short}"),
        ("ran twice while their worker lived", f"{twice_alive}"),
    ]


def kill_idle_worker(bench: Bench, pick: str, workers: list[Process]) -> None:
    by_pid = {process.pid: process for process in workers}
    standing = bench.standing().items()  # worker ids: "<host>:<pid>:<hex>"
    idle = {pid: (ms, w) for w, ms in standing if (pid := int(w.split(":")[-2])) in by_pid}
    if not idle:
        bench.skipped += 1
        return
    pid = max(idle, key=idle.__getitem__) if pick == "latest" else random.choice(list(idle))
    bench.kill(by_pid[pid], [idle[pid][1]])
    workers.remove(by_pid[pid])
    workers.append(bench.start(*WORKER))


def kill_group(bench: Bench, options: argparse.Namespace) -> list[Any]:
    from bench.tasks import chaos_job

    group = bench.start("runworker", "--concurrency", str(options.group))
    bench.wait_standing(options.group)
    # One job each (a batch hands one per idle worker), so that each registers afresh:
    # every registration then stands for the 6 s after the kill. Numbered below 0.
    chaos_job.enqueue_many(((-1 - i,), {}) for i in range(options.group))
    wait_for("the first jobs to run", lambda: bench.client.llen(RUNS) >= options.group, 30)
    fresh = bench.wait_standing(options.group)
    bench.kill(group, list(fresh))
    bench.start("runworker", "--concurrency", str(options.group))
    return enqueue_paced(bench, options, [])


def ledger(client: redis.Redis) -> dict[int, list[int]]:  # number -> each run's start (ms)
    runs: dict[int, list[int]] = {}
    for entry in client.lrange(RUNS, 0, -1):
        number, ms = map(int, entry.split())
        runs.setdefault(number, []).append(ms)
    return runs


def settle(bench: Bench, jobs: int, timeout: float) -> None:
    """Wait until every job ran and none is running, handed or queued, or the timeout."""
    keys, client = bench.keys, bench.client
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(range(jobs)) <= ledger(client).keys() and not sum(
            client.zcard(key) for key in (keys.running, keys.handed, keys.queue("default"))
        ):
            return
        time.sleep(0.2)


def report(bench: Bench, results: list[Any]) -> None:
    runs = ledger(bench.client)
    pickups, slow = [], []
    for number, result in enumerate(results):
        if number in runs:
            pickup = min(runs[number]) - round(result.enqueued_at.timestamp() * 1000)
            pickups.append(pickup)
            if pickup > SLOW_MS:
                slow.append(f"job {number} ({result.id}): {pickup:,} ms")
    log = bench.log.read_text(errors="replace")
    handed_back = sum(map(int, re.findall(r"gave back (\d+) job\(s\) handed", log)))
    recovered = sum(map(int, re.findall(r"recovered (\d+) lost job", log)))
    rows = [
        ("jobs", f"{len(results)}"),
        ("lost (never ran)", f"{len(results) - len(pickups)}"),
        ("ran twice or more", f"{sum(len(runs.get(n, [])) > 1 for n in range(len(results)))}"),
        *[(f"pickup p{p} (ms)", f"{percentile(pickups or [0], p):,}") for p in (50, 90, 99)],
        ("pickup max (ms)", f"{max(pickups, default=0):,}"),
        *(slot_figures(bench) if bench.threads else idle_figures(bench)),
        ("jobs given back by the hand-off's deadline", f"{handed_back}"),
        ("jobs recovered after a lease", f"{recovered}"),
    ]
    print(f"\n{' '.join(sys.argv[1:]) or 'defaults'}\n\n| figure | value |\n|---|---:|")
    print("\n".join(f"| {name} | {value} |" for name, value in rows))
    if len(pickups) <= 20:
        print(f"\npickups (ms), in enqueue order: {', '.join(map(str, pickups))}")
    for line in slow:
        print(f"- waited over {SLOW_MS} ms: {line}")
    print(f"\nlog: {bench.log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0, help="jobs enqueued per second")
    parser.add_argument("--workers", type=int, default=3, help="runworker --concurrency 1")
    parser.add_argument("--kill-every", type=float, default=1.0, help="seconds")
    parser.add_argument("--pick", choices=["random", "latest"], default="random")
    parser.add_argument("--group", type=int, default=0, help="kill a --concurrency N instead")
    parser.add_argument("--threads", type=int, default=0, help="kill runworker --threads N")
    parser.add_argument("--job-ms", type=int, default=300, help="--threads: each job's wait")
    parser.add_argument("--deadline", type=float, default=150.0, help="s to wait for the end")
    options = parser.parse_args()
    with RedisServer() as server:
        env = dict(os.environ, BENCH_REDIS_URL=server.url, DJANGO_SETTINGS_MODULE="bench.settings")
        if options.threads:
            env["BENCH_REDIS_OPTIONS"] = json.dumps({"URL": server.url, **THREADS_OPTIONS})
        os.environ.update(env)
        import django

        django.setup()
        from django_redisqueue.management.common import get_backend

        client = redis.Redis.from_url(server.url, decode_responses=True)
        bench = Bench(client, get_backend("default").keys, env)
        bench.threads = options.threads
        try:
            bench.start("runscheduler")
            wait_for("the scheduler", lambda: client.zcard(bench.keys.schedulers), 60)
            if options.group:
                results = kill_group(bench, options)
            else:
                worker = (
                    ("runworker", "--threads", str(options.threads)) if options.threads else WORKER
                )
                workers = [bench.start(*worker) for _ in range(options.workers)]
                bench.wait_standing(options.workers)
                results = enqueue_paced(bench, options, workers)
            settle(bench, options.jobs, options.deadline)
            report(bench, results)
        finally:
            bench.stop()


if __name__ == "__main__":
    main()
