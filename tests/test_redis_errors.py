"""Redis errors of every kind, injected into a running system: nothing lost, nothing run
twice, every process alive.

Each test starts its own redis-server, a scheduler and two workers (real ``runworker``
and ``runscheduler`` processes on the ``leased`` backend: 1 s leases), then makes that
Redis refuse or stall commands for longer than a lease: out of memory, read-only (a
replica of a master that never answers), its scripts flushed, every connection dropped,
clients paused past redis-py's 5 s socket timeout, busy in a long script. Once while
the system is idle, once while it is busy: a backlog (with jobs limited to one at a
time among it, parked and unparked across the error), delayed jobs, and jobs longer
than a lease, so that the heartbeat must renew their leases across the error.

Jobs record each run in a ledger kept on the suite's own Redis, which no error touches
(``tasks.ledger_at``), so that every run is counted. No worker is killed here, so no
job may run twice.
"""

import contextlib
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import redis

from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.exceptions import BrokerUnavailable
from tests.conftest import Processes, private_redis, wait_until
from tests.support import tasks
from tests.support.model.harness import forget_scripts
from tests.support.servers import free_port

LEASED = ("--backend", "leased")
WORKERS = 2
HOLD = 2.0  # seconds an error lasts: twice the 1 s lease
REPEATS = 5  # SCRIPT FLUSH and CLIENT KILL, spread over HOLD
PAUSE_MS = 6000  # past redis-py's default socket timeout (5 s)
BUSY_MS = 2000
SETTLE = 30  # seconds for every job to finish once the error is over

# Jobs, by ledger number: the backlog, long jobs (longer than a lease), delayed jobs,
# jobs enqueued while the error holds, jobs enqueued once it is over.
BACKLOG, SHORT_MS = 300, 2
LONG, LONG_JOBS, LONG_MS = 1000, 3, 2000
SPAN_MS = 3000  # the long jobs running as the error starts: they outlast a HOLD
DELAYED, DELAYED_JOBS = 2000, 10
PROBE = 3000
AFTER, AFTER_JOBS = 4000, 20
LIMITED, LIMITED_JOBS = 5000, 20  # one at a time: parked and unparked across the error

FILLER, FILLER_BYTES = "test:filler", 1024 * 1024
# Spins for ARGV[1] ms without writing; Redis answers BUSY to everyone else meanwhile.
SPIN = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
local spins = 0
repeat
  spins = spins + 1
  t = redis.call('TIME')
until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1]) * 1000
return spins
"""


def hold(during: Callable[[], None]) -> None:
    """Keep an error up for HOLD seconds (its length, not a wait for a condition),
    calling ``during`` every 0.2 s meanwhile."""
    end = time.monotonic() + HOLD
    while True:
        during()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.2, left))


def out_of_memory(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
    """Redis full, evicting nothing: every command that may grow memory fails with OOM.

    A limit just above the memory in use lets writes through whenever memory dips
    (client buffers come and go), so a filler is written first and the limit is set
    under the memory in use, less the client buffers: OOM holds until it is lifted.
    """
    admin.setrange(FILLER, FILLER_BYTES - 1, "x")  # small command, large value
    memory = admin.info("memory")
    steady = memory["used_memory"] - memory.get("mem_clients_normal", 0)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", steady - FILLER_BYTES // 2)
    try:
        with pytest.raises(redis.OutOfMemoryError):
            admin.set("test:probe", 1)
        hold(during)
    finally:
        admin.config_set("maxmemory", 0)
        admin.delete(FILLER)


def read_only(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
    """A replica of a master nothing answers for: it keeps its data, refuses writes
    with READONLY, and ends the blocking commands in progress (UNBLOCKED)."""
    admin.replicaof("127.0.0.1", free_port())
    try:
        with pytest.raises(redis.ReadOnlyError):
            admin.set("test:probe", 1)
        hold(during)
    finally:
        admin.replicaof("NO", "ONE")
    admin.set("test:probe", 1)  # a master again


def script_flush(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
    """Redis forgets every script and Function: calls get NOSCRIPT or Function not found."""
    for _ in range(REPEATS):
        forget_scripts(admin)
        time.sleep(HOLD / REPEATS)  # the pace of the fault


def client_kill(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
    """Every connection but this one dropped, again and again."""
    killed = []
    for _ in range(REPEATS):
        killed.append(admin.client_kill_filter(_type="normal", skipme=True))
        time.sleep(HOLD / REPEATS)  # the pace of the fault
    assert killed[0] >= WORKERS + 1, killed  # every process had a connection cut


def client_pause(mode: str) -> Callable[[redis.Redis, str, Callable[[], None]], None]:
    def pause(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
        """Clients' commands (WRITE: writes, scripts and blocking pops; ALL: all) wait
        for PAUSE_MS, longer than redis-py's socket timeout: their replies time out."""
        started = time.monotonic()
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, mode)
        admin.set("test:probe", 1)  # paused too: returns once the pause is over
        assert time.monotonic() - started >= PAUSE_MS / 1000 - 0.5

    return pause


def busy_script(admin: redis.Redis, url: str, during: Callable[[], None]) -> None:
    """A script spins for BUSY_MS: every other client is answered BUSY meanwhile
    (after 0.1 s: busy-reply-threshold, alias lua-time-limit, is lowered from 5 s)."""

    def busy() -> bool:
        try:
            admin.ping()
        except redis.ResponseError as exc:
            return str(exc).startswith("BUSY")
        return False

    admin.config_set("lua-time-limit", 100)
    spinner = redis.Redis.from_url(url, socket_timeout=30)
    try:
        with ThreadPoolExecutor(1) as pool:
            spun = pool.submit(spinner.eval, SPIN, 0, BUSY_MS)
            try:
                wait_until(busy, 10, "Redis to answer BUSY")
                assert spun.result(timeout=30) > 0  # the script ran to its end
            finally:
                if not spun.done():  # it never writes, so it can be killed
                    with contextlib.suppress(redis.ResponseError):
                        admin.script_kill()
    finally:
        spinner.close()
    admin.config_set("lua-time-limit", 5000)


@dataclass(frozen=True)
class Injection:
    name: str
    inject: Callable[[redis.Redis, str, Callable[[], None]], None]
    probe_enqueue: bool = False  # enqueue while the error holds, and check what it raises

    def __str__(self) -> str:
        return self.name


INJECTIONS = [
    Injection("OOM", out_of_memory, probe_enqueue=True),
    Injection("READONLY", read_only, probe_enqueue=True),
    Injection("SCRIPT and FUNCTION FLUSH", script_flush),
    Injection("CLIENT KILL", client_kill),
    Injection("CLIENT PAUSE WRITE", client_pause("WRITE")),
    Injection("CLIENT PAUSE ALL", client_pause("ALL")),
    Injection("BUSY", busy_script),
]


@pytest.fixture
def server():
    with private_redis() as server:
        yield server


@pytest.fixture
def admin(server):
    """The tests' own client of that Redis: it injects the errors, and waits out a
    pause (its socket timeout is longer than any)."""
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=30)
    yield client
    client.close()


def status(job_id: str) -> str:
    """The job's status (a TaskResultStatus, which is a str), or MISSING."""
    try:
        return task_backends["leased"].get_result(job_id).status
    except TaskResultDoesNotExist:
        return "MISSING"


FINAL = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED, "MISSING"}


class System:
    """A scheduler and WORKERS workers on the test's Redis, the jobs given to them (by
    ledger number), and what went wrong."""

    def __init__(self, procs: Processes, ledger: redis.Redis, ledger_url: str) -> None:
        self.procs = procs
        self.ledger = ledger  # the suite's own Redis, where tasks.ledger_at writes
        self.ledger_url = ledger_url
        self.jobs: dict[int, str] = {}
        self.probes: Counter[str] = Counter()
        self.problems: list[str] = []
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        self.processes["scheduler"] = self.procs.start("runscheduler", *LEASED)
        for n in range(1, WORKERS + 1):
            self.processes[f"worker {n}"] = self.procs.start("runworker", *LEASED)

    def enqueue(self, number: int, sleep_ms: int, delay: float = 0, limited: bool = False) -> None:
        task = (tasks.ledger_at_limited if limited else tasks.ledger_at).using(
            backend="leased", **({"delay": delay} if delay else {})
        )
        self.jobs[number] = task.enqueue(self.ledger_url, number, sleep_ms).id

    def enqueue_busy_load(self) -> None:
        """Long jobs first (each worker takes one, and holds it across the error), then
        a backlog behind them, and delayed jobs that come due while the error holds."""
        for k in range(LONG_JOBS):
            self.enqueue(LONG + k, SPAN_MS if k < WORKERS else LONG_MS)
        for i in range(BACKLOG):
            self.enqueue(i, SHORT_MS)
            if i % (BACKLOG // LIMITED_JOBS) == 0:
                self.enqueue(LIMITED + i * LIMITED_JOBS // BACKLOG, SHORT_MS * 10, limited=True)
        for k in range(DELAYED_JOBS):
            self.enqueue(DELAYED + k, SHORT_MS, delay=0.5 + k * HOLD / DELAYED_JOBS)

    def enqueue_after(self, long_job: bool) -> None:
        """Once the error is over: short jobs, delayed ones (the scheduler must promote
        them) and, unless one is still to run, a long one (its lease must be renewed)."""
        if long_job:
            self.enqueue(LONG + LONG_JOBS, LONG_MS)
        for k in range(AFTER_JOBS):
            self.enqueue(AFTER + k, SHORT_MS)
        for k in range(3):
            self.enqueue(DELAYED + DELAYED_JOBS + k, SHORT_MS, delay=0.3)

    def probe(self) -> None:
        """Enqueue while the error holds: it succeeds, or raises BrokerUnavailable."""
        number = PROBE + sum(self.probes.values())
        try:
            self.enqueue(number, SHORT_MS)
        except BrokerUnavailable:
            self.probes["refused"] += 1
        except Exception as exc:  # the defect this probe looks for
            name = f"{type(exc).__module__}.{type(exc).__name__}"
            if not self.probes[name]:
                self.problems.append(
                    f"enqueue during the error raised {name} ({exc}), not BrokerUnavailable"
                )
            self.probes[name] += 1
        else:
            self.probes["queued"] += 1

    def ran(self) -> list[int]:
        return [int(n) for n in self.ledger.lrange("test:ledger", 0, -1)]

    def settle(self) -> dict[int, str]:
        """Wait until every job has finished (or no worker is left to finish them);
        return the jobs that did not end SUCCESSFUL, with their status."""
        workers = [p for name, p in self.processes.items() if name.startswith("worker")]
        deadline = time.monotonic() + SETTLE
        checked = 0.0
        while True:
            if self.ledger.llen("test:ledger") >= len(self.jobs) or (
                time.monotonic() - checked > 1
            ):
                checked = time.monotonic()
                statuses = {n: status(job_id) for n, job_id in self.jobs.items()}
                if all(s in FINAL for s in statuses.values()):
                    break
            if time.monotonic() > deadline or all(w.poll() is not None for w in workers):
                break
            time.sleep(0.05)
        statuses = {n: str(status(job_id)) for n, job_id in self.jobs.items()}
        return {n: s for n, s in statuses.items() if s != TaskResultStatus.SUCCESSFUL}

    def check(self, report: Callable[[str], None], label: str) -> None:
        """Every job ran once and ended SUCCESSFUL; every process is alive and stops
        with exit code 0 on SIGTERM."""
        unfinished = self.settle()
        exited = {name: p.poll() for name, p in self.processes.items() if p.poll() is not None}
        outputs = {}
        for name, code in exited.items():
            output = outputs[name] = self.output(self.processes[name], timeout=10)
            self.problems.append(f"{name} exited (code {code}) before the end:\n{tail(output)}")
        # Stopped before the ledger is read: a run still in hand is counted too.
        alive = {name: p for name, p in self.processes.items() if name not in exited}
        for process in alive.values():
            process.send_signal(signal.SIGTERM)
        for name, process in alive.items():
            try:
                outputs[name] = self.output(process, timeout=20)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{name} did not stop within 20 s of SIGTERM")
                continue
            if process.returncode != 0:
                self.problems.append(
                    f"{name} stopped with code {process.returncode} on SIGTERM:\n"
                    + tail(outputs[name])
                )

        runs = Counter(self.ran())
        lost = sorted((self.jobs.keys() - runs.keys()) | unfinished.keys())
        duplicates = {n: count for n, count in runs.items() if count > 1}
        strangers = sorted(runs.keys() - self.jobs.keys())
        state = f"{len(exited)} of {len(self.processes)} processes exited" if exited else ""
        probed = ", ".join(f"{count} {what}" for what, count in sorted(self.probes.items()))
        report(
            f"redis error {label}: jobs={len(self.jobs)} lost={len(lost)} "
            f"duplicates={sum(duplicates.values()) - len(duplicates)} "
            + (state or "processes alive")
            + (f"; enqueue during the error: {probed}" if probed else "")
        )
        if lost:
            how = Counter(unfinished.get(n, "SUCCESSFUL, never ran") for n in lost)
            self.problems.insert(0, f"{len(lost)} job(s) lost: {dict(how)}, e.g. {lost[:10]}")
        if duplicates:
            ids = {n: self.jobs.get(n) for n in duplicates}
            self.problems.insert(0, f"job(s) run more than once: {duplicates} (ids {ids})")
        if strangers:
            self.problems.insert(0, f"ran though their enqueue failed: {strangers[:10]}")
        if self.problems:
            for name, output in outputs.items():
                warnings = "\n".join(line for line in output.splitlines() if " WARNING " in line)
                if warnings:
                    self.problems.append(f"{name}'s warnings:\n{tail(warnings)}")
        assert not self.problems, f"{label}:\n" + "\n".join(self.problems)

    def output(self, process: subprocess.Popen, timeout: float) -> str:
        """Wait for the process to end; return all it printed."""
        output = process.communicate(timeout=timeout)[0]
        self.procs.running.remove(process)
        return output


def tail(output: str, lines: int = 20) -> str:
    """The end of a process's output, without the frames of installed libraries."""
    kept, skipping = [], False
    for line in output.splitlines():
        if line.startswith("  File "):
            skipping = "/site-packages/" in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append("    " + line)
    return "\n".join(kept[-lines:])


@pytest.fixture
def system(procs, r, redis_server):
    return System(procs, r, redis_server.url)


def waiting_for_work(admin: redis.Redis) -> int:
    """How many connections are blocked now (idle workers, a sleeping scheduler)."""
    return sum("b" in c.get("flags", "") for c in admin.client_list())


@pytest.mark.parametrize("injection", INJECTIONS, ids=str)
def test_an_idle_system_survives_the_error(injection, server, admin, system, report):
    system.start()
    wait_until(lambda: waiting_for_work(admin) >= WORKERS + 1, 60, "every process to idle")

    injection.inject(admin, server.url, system.probe if injection.probe_enqueue else noop)

    system.enqueue_after(long_job=True)
    system.check(report, f"{injection} idle")


@pytest.mark.parametrize("injection", INJECTIONS, ids=str)
def test_a_busy_system_survives_the_error(injection, server, admin, system, report):
    # Every process up first: a worker that started later than a long job lasts would
    # find both long jobs run by the other, one after the other, never side by side.
    system.start()
    wait_until(lambda: waiting_for_work(admin) >= WORKERS + 1, 60, "every process to idle")
    system.enqueue_busy_load()
    wait_until(
        lambda: all(
            status(system.jobs[LONG + k]) == TaskResultStatus.RUNNING for k in range(WORKERS)
        ),
        60,
        "each worker to start a long job",
    )

    injection.inject(admin, server.url, system.probe if injection.probe_enqueue else noop)

    system.enqueue_after(long_job=False)  # the last of LONG_JOBS starts after the error
    system.check(report, f"{injection} busy")


def noop() -> None:
    pass
