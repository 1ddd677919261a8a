"""The workloads of the peer benchmark, measured the same way for every system.

Every job stamps a file (``bench/systems/stamps.py``): rates run from the first job's
start to the last job's end as the jobs recorded them, so worker start-up is excluded.
What the redis-server spent (commands, CPU) is taken over the same stretch
(``bench/redisstats.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench import redisstats
from bench.procs import ROOT, Processes, sample, tree_memory, wait_for_rest
from bench.systems import stamps
from bench.systems.base import DEFAULT, FOUR, ONE, SERVE, System

ENQUEUE_JOBS = 20_000
DRAIN_JOBS = 20_000
LATENCY_JOBS = 300
LATENCY_RATE = 100.0  # jobs per second
DELAYED_JOBS = 1_000
DELAYED_SPAN = 2.0  # seconds over which the delayed jobs fall due
DELAYED_LEAD = 3.0  # seconds from the start of their enqueue to the first due time
MEMORY_JOBS = 100_000
FILL_PROCESSES = 4  # untimed fills run in parallel to save time
START_TIMEOUT = 90.0  # seconds for a worker's first job
# Seconds between samples of a worker's memory while it runs jobs; at least ten times
# what a sample took, as reading a tree of hundreds of processes takes CPU from them.
MEMORY_EVERY = 0.5


@dataclass(frozen=True, slots=True)
class IoLoad:
    """Jobs that each wait, run by one worker ``at_once`` at a time."""

    at_once: int
    seconds: float  # each job's wait
    rounds: int  # jobs, as a multiple of at_once: enough for a steady rate
    asynchronous: bool  # what django-redisqueue runs; each peer runs its own kind

    @property
    def ideal(self) -> float:
        """Jobs per second if nothing but the waits took time."""
        return self.at_once / self.seconds


# The I/O-bound figure: sync jobs of 50 ms, 32 at once; async jobs of 500 ms, 256 at once.
IO_LOADS = {
    "io32": IoLoad(at_once=32, seconds=0.05, rounds=50, asynchronous=False),
    "io256": IoLoad(at_once=256, seconds=0.5, rounds=20, asynchronous=True),
}


@dataclass
class Bench:
    """One sitting: the private Redis, a work directory and the figures so far."""

    client: redis.Redis
    url: str
    work: Path
    scale: float
    drain_cap: float  # seconds a drain may run before it is cut short
    run: int = 0
    figures: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    notes: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def jobs(self, count: int) -> int:
        return max(1, round(count * self.scale))

    def record(self, system: System, metric: str, value: float, note: str = "") -> None:
        self.figures.setdefault(system.name, {}).setdefault(metric, []).append(value)
        if note:
            self.notes.setdefault(system.name, {}).setdefault(metric, []).append(note)

    def env(self, stamp_file: Path | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "BENCH_REDIS_URL": self.url,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "bench.settings",
        }
        if stamp_file:
            env["BENCH_STAMPS"] = str(stamp_file)
        return env

    def file(self, system: System, what: str) -> Path:
        return self.work / f"run{self.run}-{system.name}-{what}"

    def fresh(self) -> None:
        """Empty Redis between workloads: every system starts from the same state."""
        self.client.flushall()

    def call(
        self, system: System, action: str, *args: object, stamp_file: Path | None = None
    ) -> dict[str, float]:
        """Run a client action (``bench/client.py``) and return what it printed."""
        command = [sys.executable, "-m", "bench.client", system.name, action, *map(str, args)]
        env = self.env(stamp_file)
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(command[2:])} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.splitlines()[-1])

    def fill(
        self, system: System, jobs: int, *, arg: bool = False, wait: IoLoad | None = None
    ) -> None:
        """Enqueue ``jobs`` jobs, untimed, from several client processes at once; with
        ``wait``, jobs that wait as that workload says."""
        share = -(-jobs // FILL_PROCESSES)
        popens = []
        for first in range(0, jobs, share):
            command = [
                *(sys.executable, "-m", "bench.client", system.name, "fill"),
                *("--jobs", str(min(share, jobs - first)), "--first", str(first)),
                *(["--arg"] if arg else []),
                *(["--wait", str(wait.seconds)] if wait else []),
                *(["--async"] if wait and wait.asynchronous else []),
            ]
            popens.append(
                subprocess.Popen(command, cwd=ROOT, env=self.env(), stdout=subprocess.DEVNULL)
            )
        if any(popen.wait(timeout=900) for popen in popens):
            raise RuntimeError(f"filling {system.name} with {jobs} jobs failed")

    def start(self, system: System, config: str, stamp_file: Path) -> Processes:
        log = stamp_file.with_suffix(".log")
        return Processes(system.commands(config), self.env(stamp_file), log)


def wait_for_count(
    path: Path, expected: int, timeout: float, processes: Processes, step: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout
    while stamps.count(str(path)) < expected:
        processes.check()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {stamps.count(str(path))} of {expected} jobs ran within {timeout:.0f} s\n"
                + processes.log_tail()
            )
        time.sleep(step)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rated(bench: Bench, path: Path, jobs: int, capped: bool) -> tuple[float, str]:
    """Jobs per second from the first start to the last end stamped in ``path``, and a
    note if the run was cut short; all ``jobs`` must have run if it was not."""
    rows = stamps.read(str(path))
    if not capped and len(rows) != jobs:
        raise RuntimeError(f"{len(rows)} jobs ran for {jobs} enqueued")
    rate = len(rows) / (max(r.ended for r in rows) - min(r.started for r in rows))
    note = f"cut short after {bench.drain_cap:.0f} s: {len(rows):,} of {jobs:,} jobs" * capped
    return rate, note


def enqueue(bench: Bench, system: System) -> None:
    """Jobs per second enqueued one at a time from one process, with the Redis commands
    and CPU per job that cost; then in bulk, and from inside database transactions."""
    jobs = bench.jobs(ENQUEUE_JOBS)
    bench.fresh()
    one = bench.call(system, "enqueue", "--jobs", jobs)
    bench.record(system, "enqueue_one", one["rate"])
    bench.record(system, "enqueue_commands", one["commands"])
    bench.record(system, "enqueue_cpu", one["cpu"])
    for action, metric, offered in (
        ("bulk", "enqueue_bulk", system.has_bulk),
        ("commit", "enqueue_commit", system.has_commit),
    ):
        if offered:
            bench.fresh()
            bench.record(system, metric, bench.call(system, action, "--jobs", jobs)["rate"])
    bench.fresh()


def memory(bench: Bench, system: System) -> None:
    """Redis memory per waiting job: ``used_memory`` before and after a fill, no worker."""
    jobs = bench.jobs(MEMORY_JOBS)
    bench.fresh()
    before = bench.client.info("memory")["used_memory"]
    bench.fill(system, jobs, arg=True)
    after = bench.client.info("memory")["used_memory"]
    bench.record(system, "memory_per_job", (after - before) / jobs)
    bench.fresh()


def drain(bench: Bench, system: System, config: str) -> None:
    """Jobs per second run by the workers of ``config`` from a full queue, first start to
    last end, and the Redis commands and CPU per job over that stretch."""
    if config == DEFAULT and (system.default_is_one or not system.commands(DEFAULT)):
        return
    jobs = bench.jobs(DRAIN_JOBS)
    bench.fresh()
    bench.fill(system, jobs, arg=False)
    path = bench.file(system, f"drain-{config}.stamps")
    processes = bench.start(system, config, path)
    capped = False
    try:
        wait_for_count(path, 1, START_TIMEOUT, processes, step=0.001)
        # From the first job on, as the rate: start-up (connections, scripts loaded,
        # registrations) is left out of the server's figures and the workers' CPU too.
        before, ran_before = redisstats.snapshot(bench.client), stamps.count(str(path))
        worker_cpu_before = sample(processes.worker)[0]
        cap = time.monotonic() + bench.drain_cap
        while stamps.count(str(path)) < jobs:
            processes.check()
            if time.monotonic() > cap:
                capped = True
                break
            time.sleep(0.002)
        after, ran_after = redisstats.snapshot(bench.client), stamps.count(str(path))
        worker_cpu = sample(processes.worker)[0] - worker_cpu_before
    finally:
        processes.stop()
    rate, note = rated(bench, path, jobs, capped)
    drained = max(1, ran_after - ran_before)
    commands, cpu = redisstats.between(before, after).per_job(drained)
    metric = {ONE: "drain_one", DEFAULT: "drain_default", FOUR: "drain_four"}[config]
    bench.record(system, metric, rate, note)
    if config == ONE:
        bench.record(system, "drain_commands", commands)
        bench.record(system, "drain_cpu", cpu)
        bench.record(system, "drain_worker_cpu", worker_cpu / drained * 1e6)
    elif config == FOUR:
        bench.record(system, "drain_four_cpu", cpu)
    bench.fresh()


def rest(bench: Bench, system: System, config: str) -> None:
    """Memory of the worker's process tree once started and idle, before any job."""
    if config == DEFAULT and (system.default_is_one or not system.commands(DEFAULT)):
        return
    bench.fresh()
    processes = bench.start(system, config, bench.file(system, f"rest-{config}.stamps"))
    try:
        memory = wait_for_rest(processes)
    finally:
        processes.stop()
    note = f"{memory.processes} processes" if memory.processes > 1 else ""
    bench.record(system, f"rss_{config}", memory.rss, note)
    bench.record(system, f"pss_{config}", memory.pss)


def serve(bench: Bench, system: System) -> None:
    """Idle latency (enqueue to start), then delayed jobs' lateness (start minus due),
    on one worker set-up as deployed: default concurrency and what runs delayed jobs."""
    bench.fresh()
    path = bench.file(system, "serve.stamps")
    processes = bench.start(system, SERVE, path)
    try:
        jobs = bench.jobs(LATENCY_JOBS)
        bench.call(system, "latency", "--jobs", jobs, "--rate", LATENCY_RATE, stamp_file=path)
        wait_for_count(path, 1 + jobs, 60, processes)
        rows = stamps.read(str(path))[1:]  # after the warm-up job
        latency = [(r.started - r.given) * 1000 for r in rows]
        for p in (50, 95, 99):
            bench.record(system, f"latency_p{p}", percentile(latency, p))
        if system.has_delay:
            delayed = bench.jobs(DELAYED_JOBS)
            bench.call(
                system,
                "delayed",
                *("--jobs", delayed, "--span", DELAYED_SPAN, "--lead", DELAYED_LEAD),
            )
            wait_for_count(path, 1 + jobs + delayed, DELAYED_LEAD + DELAYED_SPAN + 60, processes)
            rows = stamps.read(str(path))[1 + jobs :]
            lateness = [(r.started - r.given) * 1000 for r in rows]
            for p in (50, 99):
                bench.record(system, f"lateness_p{p}", percentile(lateness, p))
    finally:
        processes.stop()
    bench.fresh()


def io_bound(bench: Bench, system: System, name: str) -> None:
    """Jobs per second of one worker running waiting jobs many at a time, first start to
    last end, and the peak memory (PSS) of its process tree meanwhile. The worker is
    started and left to settle first, then the jobs are enqueued from several processes,
    faster than any worker here runs them: a worker of hundreds of processes would
    otherwise be rated on their start-up."""
    load = IO_LOADS[name]
    commands = system.io_commands(load.at_once)
    if not commands:
        return
    jobs = bench.jobs(load.at_once * load.rounds)
    bench.fresh()
    path = bench.file(system, f"{name}.stamps")
    processes = Processes(commands, bench.env(path), path.with_suffix(".log"))
    capped = False
    try:
        wait_for_rest(processes)
        bench.fill(system, jobs, wait=load)
        cap = time.monotonic() + bench.drain_cap
        peak, every, sampled = None, MEMORY_EVERY, 0.0
        while stamps.count(str(path)) < jobs:
            processes.check()
            if time.monotonic() > cap:
                capped = True
                break
            if time.monotonic() - sampled >= every:
                sampled = time.monotonic()
                now = tree_memory(processes.worker)
                every = max(MEMORY_EVERY, 10 * (time.monotonic() - sampled))
                peak = now if peak is None or now.pss > peak.pss else peak
            time.sleep(0.01)
    finally:
        processes.stop()
    rate, note = rated(bench, path, jobs, capped)
    bench.record(system, f"{name}_rate", rate, note)
    if peak:  # none if the last job ended before the first sample
        note = f"{peak.processes} processes" if peak.processes > 1 else ""
        bench.record(system, f"{name}_pss", peak.pss, note)
    bench.fresh()


# In the order they run, by the names --workloads takes.
WORKLOADS: dict[str, Callable[[Bench, System], None]] = {
    "enqueue": enqueue,
    "memory": memory,
    "drain": lambda bench, system: drain(bench, system, ONE),
    "drain-default": lambda bench, system: drain(bench, system, DEFAULT),
    "drain-4": lambda bench, system: drain(bench, system, FOUR),
    "rest": lambda bench, system: rest(bench, system, ONE),
    "rest-default": lambda bench, system: rest(bench, system, DEFAULT),
    "serve": serve,
    **{name: lambda b, s, name=name: io_bound(b, s, name) for name in IO_LOADS},
}
