"""How far one Redis node goes: the Redis server work per job of this app.

For each configuration, in one run: enqueue N jobs one ``enqueue()`` call each (a child
process, warmed up and connected before the measurement starts), then drain them with
``runworker --burst`` (one process per backend, ``--concurrency 1`` unless told). Around
each phase it takes ``INFO commandstats`` + ``INFO cpu`` snapshots (``bench/redisstats.py``)
of every server, once the replicas have caught up, and reports, on the server(s) holding
the backend's keys (in a cluster, the master of the slot of ``{drq:default}:``): commands
and Redis CPU (``used_cpu_sys + used_cpu_user``) per enqueued and per drained job, their
sum, and the jobs/s one Redis core would sustain at that cost (1e6 / µs per job). The
enqueue rate is the child's loop; the drain rate is first job started to last job ended,
from the jobs' stamps (``bench/systems/stamps.py``), leaving out the worker's start-up.
The drain phase does include the worker's start-up, heartbeats and exit (an empty
``--burst`` run: about 20 commands and 1-2 ms of Redis CPU, under 0.5 µs per job).
The snapshots' INFO calls, and those polling the replicas, are not counted.

Configurations: (a) one redis-server; (a0) the same with ``METRICS: False`` (workers
count nothing for the Prometheus metrics: their cost is a minus a0); (b0) a master and
one replica; (b) the same with ``REPLICA_ACKS: 1`` (a ``WAIT 1`` after each write
script); (c) a Redis Cluster of 3 masters and 3 replicas; (d) the same cluster with two
backends whose hash tags land on two masters, each drained by its own worker. A second
table lists every server.

    .venv/bin/python -m bench.scaling               # 5,000 jobs per configuration, 1 run
    .venv/bin/python -m bench.scaling --runs 3      # the median of 3 interleaved runs
    .venv/bin/python -m bench.scaling --jobs 1000 --configs a,b0,b   # also --concurrency 2
    .venv/bin/python -m bench.scaling --configs a,a0 --runs 3  # the metrics' cost
    .venv/bin/python -m bench.scaling --configs a --threads 4 --jobs 10000  # four slots

It prints two markdown tables; a run of 5,000 jobs takes about 25 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from bench import redisstats
from bench.procs import compile_bytecode
from bench.systems import stamps
from tests.support.servers import HOST, RedisServer
from tests.support.topologies import RedisClusterGroup

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "default"  # bench/settings.py's one queue
POLL = 0.02  # seconds between two looks at a condition
CONFIGS = {
    "a": "one redis-server",
    "a0": "one redis-server, METRICS off",
    "b0": "master + 1 replica",
    "b": "master + 1 replica, REPLICA_ACKS 1",
    "c": "Redis Cluster, 3 masters + 3 replicas",
    "d": "Redis Cluster, 2 backends on 2 masters",
}


def wait_for(what: str, condition: Callable[[], Any], timeout: float) -> Any:
    """Poll ``condition`` until it is truthy and return it; raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL)


def key_prefix(options: dict[str, Any], alias: str) -> str:
    """The hash-tagged prefix of a backend's keys (django_redisqueue/store/keys.py)."""
    return "{" + options.get("KEY_PREFIX", f"drq:{alias}") + "}:"


@dataclass
class Config:
    name: str
    backends: dict[str, dict[str, Any]]  # alias -> OPTIONS; "default" first
    ports: dict[int, str]  # every server of the topology -> its label in the tables
    holders: dict[str, int]  # alias -> port of the master holding its keys


@dataclass
class Result:
    config: Config
    jobs: int
    enqueue: dict[int, redisstats.Usage] = field(default_factory=dict)
    drain: dict[int, redisstats.Usage] = field(default_factory=dict)
    enqueue_rate: float = 0.0
    drain_rate: float = 0.0


class Servers:
    """Plain clients of a topology's servers, for snapshots and polling."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.clients = {port: redis.Redis(host=HOST, port=port) for port in ports}

    def snapshot(self) -> dict[int, redisstats.Snapshot]:
        return {port: redisstats.snapshot(client) for port, client in self.clients.items()}

    def caught_up(self) -> bool:
        """Whether every replica has processed all that its master has written."""
        infos = {port: c.info("replication") for port, c in self.clients.items()}
        return all(
            info["slave_repl_offset"] >= infos[info["master_port"]]["master_repl_offset"]
            for info in infos.values()
            if info["role"] == "slave" and info["master_port"] in infos
        )

    def settle(self) -> None:
        wait_for("the replicas to catch up", self.caught_up, 10)

    def flush(self) -> None:
        for client in self.clients.values():
            if client.info("replication")["role"] == "master":
                client.flushall()
        self.settle()

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def usage(before: redisstats.Snapshot, after: redisstats.Snapshot) -> redisstats.Usage:
    """``redisstats.between()``, less every INFO call: the app sends none, we poll with it."""
    used = redisstats.between(before, after)
    infos = after.calls.get("cmdstat_info", 0) - before.calls.get("cmdstat_info", 0)
    return redisstats.Usage(
        used.commands - (infos - redisstats.OWN_CALLS["cmdstat_info"]), used.cpu
    )


def environment(config: Config, stamp_file: Path) -> dict[str, str]:
    default, *_ = config.backends.values()
    others = {alias: opts for alias, opts in config.backends.items() if alias != "default"}
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "BENCH_REDIS_URL": default["URL"],
        "BENCH_REDIS_OPTIONS": json.dumps(default),
        "BENCH_REDIS_ALIASES": json.dumps(others),
        "BENCH_STAMPS": str(stamp_file),
    }


@dataclass(frozen=True)
class WorkerShape:
    """How each backend's ``runworker --burst`` runs: processes, and jobs at once in each."""

    concurrency: int = 1
    threads: int = 1

    def options(self) -> list[str]:
        return ["--concurrency", str(self.concurrency), "--threads", str(self.threads)]

    def __str__(self) -> str:
        threads = f" --threads {self.threads}" if self.threads > 1 else ""
        return f"`runworker --burst --concurrency {self.concurrency}{threads}`"


def measure(
    config: Config, servers: Servers, jobs: int, shape: WorkerShape, tmp: Path, run: int
) -> Result:
    """Enqueue ``jobs`` jobs over the config's backends, then drain them."""
    result = Result(config, jobs)
    stamp_file = tmp / f"stamps-{config.name}-{run}"
    env = environment(config, stamp_file)
    aliases = ",".join(config.backends)
    log = tmp / f"workers-{config.name}-{run}.log"
    servers.flush()

    child = subprocess.Popen(
        [sys.executable, "-m", "bench.scaling", "--enqueue-child", aliases, "--jobs", str(jobs)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the enqueue process failed to start (see above)")
        before = servers.snapshot()
        out, _ = child.communicate("go\n", timeout=max(60, jobs / 100))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode:
        raise RuntimeError(f"the enqueue process exited with {child.returncode}")
    servers.settle()
    after = servers.snapshot()
    result.enqueue = {port: usage(before[port], after[port]) for port in before}
    result.enqueue_rate = jobs / json.loads(out.splitlines()[-1])["seconds"]

    before = servers.snapshot()
    with open(log, "wb") as output:
        workers = [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "django", "runworker", "--burst", "-v0"),
                    *("--settings", "bench.settings", "--backend", alias),
                    *shape.options(),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for alias in config.backends
        ]
    try:
        deadline = time.monotonic() + max(60, jobs / 100)
        for worker in workers:
            if worker.wait(timeout=max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"a worker exited with {worker.returncode}:\n{log.read_text()}")
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
    servers.settle()
    after = servers.snapshot()
    result.drain = {port: usage(before[port], after[port]) for port in before}

    for alias, port in config.holders.items():
        prefix, client = key_prefix(config.backends[alias], alias), servers.clients[port]
        left = client.zcard(f"{prefix}queue:{QUEUE}") + client.zcard(f"{prefix}running")
        if left:
            raise RuntimeError(f"{alias}: {left} jobs still queued or running after the drain")
    done = stamps.read(str(stamp_file))
    if len(done) != jobs:
        raise RuntimeError(f"{len(done)} of {jobs} jobs ran")
    result.drain_rate = jobs / (max(s.ended for s in done) - min(s.started for s in done))
    return result


def enqueue_child(aliases: list[str], jobs: int) -> None:
    """In the child: connect, say ready, wait for go, enqueue, print the time taken."""
    import django

    django.setup()
    from bench.tasks import job
    from django_redisqueue.compat import task_backends

    tasks = [job.using(backend=alias) for alias in aliases]
    for alias in aliases:  # connect (a cluster client loads its slot map) before measuring
        backend: Any = task_backends[alias]
        backend.queries.queue_length(QUEUE)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    for i in range(jobs):
        tasks[i % len(tasks)].enqueue(0.0)
    print(json.dumps({"seconds": time.perf_counter() - started}), flush=True)


# Topologies -------------------------------------------------------------------------------


def one_server(stack: contextlib.ExitStack, names: set[str]) -> list[Config]:
    server = stack.enter_context(RedisServer())
    ports, holders = {server.port: "the server"}, {"default": server.port}
    counted = Config("a", {"default": {"URL": server.url}}, ports, holders)
    uncounted = Config("a0", {"default": {"URL": server.url, "METRICS": False}}, ports, holders)
    return [c for c in (counted, uncounted) if c.name in names]


def master_replica(stack: contextlib.ExitStack, names: set[str]) -> list[Config]:
    master = stack.enter_context(RedisServer("--repl-diskless-sync-delay", "0"))
    replica = stack.enter_context(RedisServer("--replicaof", HOST, str(master.port)))
    client = stack.enter_context(contextlib.closing(redis.Redis(host=HOST, port=replica.port)))
    wait_for(
        "the replica's link to its master",
        lambda: client.info("replication")["master_link_status"] == "up",
        30,
    )
    ports = {master.port: "master", replica.port: "replica"}
    holders = {"default": master.port}
    plain = Config("b0", {"default": {"URL": master.url}}, ports, holders)
    acked = Config("b", {"default": {"URL": master.url, "REPLICA_ACKS": 1}}, ports, holders)
    return [c for c in (plain, acked) if c.name in names]


def cluster(stack: contextlib.ExitStack, names: set[str]) -> list[Config]:
    group = RedisClusterGroup()
    group.start()
    stack.callback(group.stop)
    client = stack.enter_context(contextlib.closing(RedisCluster.from_url(group.url)))

    def master_of(prefix: str) -> int:
        return int(client.get_node_from_key(prefix).port)

    # The second backend's prefix: the first of drq:second, drq:second-1, ... whose hash
    # tag lands on another master than {drq:default}.
    default_port = master_of(key_prefix({}, "default"))
    second: dict[str, Any] = {}
    for i in range(100):
        second = {"KEY_PREFIX": "drq:second" + (f"-{i}" if i else "")}
        if master_of(key_prefix(second, "second")) != default_port:
            break
    second_port = master_of(key_prefix(second, "second"))

    nodes = client.cluster_nodes()  # "host:port@bus" -> {"node_id", "flags", "master_id"...}
    ids = {
        info["node_id"]: int(address.split("@")[0].rsplit(":", 1)[1])
        for address, info in nodes.items()
    }

    def labels(backends: dict[str, dict[str, Any]], holders: dict[str, int]) -> dict[int, str]:
        named = {
            port: "master of " + key_prefix(backends[alias], alias).rstrip(":")
            for alias, port in holders.items()
        }
        found = {}
        for info in nodes.values():
            port = ids[info["node_id"]]
            if "master" in str(info["flags"]).split(","):
                found[port] = named.get(port, "other masters")
            else:
                of = named.get(ids.get(info["master_id"], 0))
                found[port] = f"replica of {of}" if of else "other replicas"
        return found

    url = {"URL": group.url, "CLUSTER": True}
    one = {"default": url}
    two = {"default": url, "second": {**url, **second}}
    holders_one = {"default": default_port}
    holders_two = {"default": default_port, "second": second_port}
    configs = [
        Config("c", one, labels(one, holders_one), holders_one),
        Config("d", two, labels(two, holders_two), holders_two),
    ]
    return [c for c in configs if c.name in names]


# Report -----------------------------------------------------------------------------------


def per_job(result: Result, ports: Sequence[int]) -> tuple[float, float, float, float]:
    """Commands per enqueued and per drained job, CPU µs per enqueued and drained job."""
    enqueue = [result.enqueue[p].per_job(result.jobs) for p in ports]
    drain = [result.drain[p].per_job(result.jobs) for p in ports]
    return (
        sum(c for c, _ in enqueue),
        sum(c for c, _ in drain),
        sum(u for _, u in enqueue),
        sum(u for _, u in drain),
    )


def figures(result: Result, ports: Sequence[int]) -> list[float]:
    """Commands per enqueued and drained job, CPU µs per enqueued and drained job and
    their sum, over the servers ``ports``."""
    cmd_e, cmd_d, cpu_e, cpu_d = per_job(result, ports)
    return [cmd_e, cmd_d, cpu_e, cpu_d, cpu_e + cpu_d]


def medians(results: Sequence[Result], ports: Sequence[int]) -> list[float]:
    """``figures()``, the median of each over the runs."""
    runs = [figures(r, ports) for r in results]
    return [statistics.median(column) for column in zip(*runs, strict=True)]


def report(results: dict[str, list[Result]], jobs: int, shape: WorkerShape) -> str:
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    runs = max(len(rs) for rs in results.values())
    lines = [
        f"redis-server {version.stdout.split()[2].removeprefix('v=')}, Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores. {jobs:,} jobs per configuration, "
        "enqueued one call each, drained by one "
        f"{shape} per backend"
        + (f"; median of {runs} interleaved runs (min to max)" if runs > 1 else "")
        + ". Redis work on the server(s) holding the backend's keys, per job.",
        "",
        "| configuration | commands / enqueued job | commands / drained job "
        "| Redis CPU / enqueued job (µs) | Redis CPU / drained job (µs) | Redis CPU / job (µs) "
        "| jobs/s per Redis core | enqueue (jobs/s) | drain (jobs/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in results.items():
        holders = list(dict.fromkeys(rs[0].config.holders.values()))
        cmd_e, cmd_d, cpu_e, cpu_d, cpu = medians(rs, holders)
        sums = [figures(r, holders)[4] for r in rs]
        spread = f" ({min(sums):.1f} to {max(sums):.1f})" if len(rs) > 1 else ""
        lines.append(
            f"| ({name}) {CONFIGS[name]} | {cmd_e:.2f} | {cmd_d:.2f} | {cpu_e:.1f} | {cpu_d:.1f} "
            f"| {cpu:.1f}{spread} | {1e6 / cpu:,.0f} "
            f"| {statistics.median([r.enqueue_rate for r in rs]):,.0f} "
            f"| {statistics.median([r.drain_rate for r in rs]):,.0f} |"
        )
    lines += [
        "",
        "Every server, per job of the whole run (servers of one label summed"
        + (", median of the runs" if runs > 1 else "")
        + "):",
        "",
        "| configuration | server | commands / enqueued job | commands / drained job "
        "| CPU / enqueued job (µs) | CPU / drained job (µs) | CPU / job (µs) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, rs in results.items():
        groups: dict[str, list[int]] = {}
        for port, label in rs[0].config.ports.items():
            groups.setdefault(label, []).append(port)
        rows = [(label, ports, medians(rs, ports)) for label, ports in groups.items()]
        for label, ports, (cmd_e, cmd_d, cpu_e, cpu_d, cpu) in sorted(
            rows, key=lambda x: -x[2][4]
        ):
            shown = f"{label} ({len(ports)})" if len(ports) > 1 else label
            lines.append(
                f"| ({name}) | {shown} | {cmd_e:.2f} | {cmd_d:.2f} | {cpu_e:.1f} "
                f"| {cpu_d:.1f} | {cpu:.1f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per configuration")
    parser.add_argument("--runs", type=int, default=1, help="runs per configuration (median)")
    parser.add_argument("--concurrency", type=int, default=1, help="runworker --concurrency")
    parser.add_argument("--threads", type=int, default=1, help="runworker --threads")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="e.g. a,b0,b,c,d")
    parser.add_argument("--enqueue-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.enqueue_child:
        enqueue_child(args.enqueue_child.split(","), args.jobs)
        return
    compile_bytecode()
    shape = WorkerShape(args.concurrency, args.threads)
    names = set(args.configs.split(","))
    if names - set(CONFIGS):
        parser.error(f"unknown configuration(s): {', '.join(sorted(names - set(CONFIGS)))}")

    results: dict[str, list[Result]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        for topology, wanted in (
            (one_server, {"a", "a0"}),
            (master_replica, {"b0", "b"}),
            (cluster, {"c", "d"}),
        ):
            if not names & wanted:
                continue
            with contextlib.ExitStack() as stack:
                configs = topology(stack, names)
                servers = Servers(list(configs[0].ports))
                stack.callback(servers.close)
                for run in range(args.runs):  # interleaved: drift hits every configuration
                    for config in configs:
                        print(
                            f"({config.name}) {CONFIGS[config.name]}, run {run + 1}",
                            file=sys.stderr,
                        )
                        result = measure(config, servers, args.jobs, shape, Path(tmp), run)
                        results.setdefault(config.name, []).append(result)
    print(report(results, args.jobs, shape))


if __name__ == "__main__":
    main()
