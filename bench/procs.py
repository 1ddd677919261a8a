"""Worker processes for the peer benchmark: start, watch, measure and stop them."""

from __future__ import annotations

import compileall
import contextlib
import os
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

MiB = 1024 * 1024


def compile_bytecode() -> None:
    """Compile what the workers import, as pip does when it installs: a worker that starts
    from source instead (uv installs no bytecode, and PYTHONDONTWRITEBYTECODE keeps Python
    from writing it) keeps its compiler's leftovers, 6 MiB of PSS for a Django worker."""
    found = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    for path in [*sorted(found), str(ROOT / "django_redisqueue"), str(ROOT / "bench")]:
        compileall.compile_dir(path, quiet=1, workers=0)


@dataclass(frozen=True, slots=True)
class Memory:
    rss: float  # MiB, summed over the process tree (forked pages count in each process)
    pss: float  # MiB, shared pages divided among the processes sharing them
    processes: int


class Processes:
    """Commands started together, each in a process group of its own, logging to a file."""

    def __init__(self, commands: list[list[str]], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.commands = commands
        self.popens: list[subprocess.Popen[bytes]] = []
        with open(log, "ab") as out:
            for command in commands:
                self.popens.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    @property
    def worker(self) -> psutil.Process:
        return psutil.Process(self.popens[0].pid)

    def check(self) -> None:
        """Fail if any of the processes has exited."""
        for popen, command in zip(self.popens, self.commands, strict=True):
            if popen.poll() is not None:
                raise RuntimeError(
                    f"{' '.join(command[1:4])}... exited with {popen.returncode}\n"
                    + self.log_tail()
                )

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {self.log} ---\n" + "\n".join(text)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM each group, wait, then SIGKILL whatever of the group is left."""
        for popen in self.popens:
            signal_group(popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for popen in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(max(0.1, deadline - time.monotonic()))
            signal_group(popen.pid, signal.SIGKILL)  # children a stopped parent left behind
            popen.wait()


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sample(root: psutil.Process) -> tuple[float, float, int]:
    """CPU seconds and RSS bytes of the tree, and its number of processes."""
    cpu = rss = 0.0
    procs = tree(root)
    for proc in procs:
        try:
            times = proc.cpu_times()
            cpu += times.user + times.system
            rss += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return cpu, rss, len(procs)


def wait_for_rest(
    processes: Processes, *, timeout: float = 90.0, quiet: float = 2.0, at_least: float = 3.0
) -> Memory:
    """Wait until the worker tree has settled (same processes, steady RSS and little CPU
    for ``quiet`` seconds), then measure its memory. Little CPU: under 2% of a core, or
    under 10% and no less than over the ``quiet`` seconds before (a worker whose idle
    threads poll, as Huey's do, settles on a floor of its own: hundreds of threads
    backing off take over a minute to reach it)."""
    started = time.monotonic()
    root = processes.worker
    history: list[tuple[float, float, float, int]] = []
    step = 0.25
    window = round(quiet / step)
    while True:
        processes.check()
        now = time.monotonic()
        history.append((now, *sample(root)))
        if now - started >= at_least and len(history) > window:
            then, now_ = history[-window - 1], history[-1]
            used = now_[1] - then[1]
            earlier = len(history) > 2 * window
            before = then[1] - history[-2 * window - 1][1] if earlier else float("inf")
            if (
                (used < 0.02 * quiet or (used < 0.10 * quiet and used >= before))
                and abs(now_[2] - then[2]) < 0.01 * now_[2]
                and all(h[3] == now_[3] for h in history[-window - 1 :])
            ):
                break
        if now - started > timeout:
            raise RuntimeError(f"the worker did not come to rest within {timeout:.0f} s")
        time.sleep(step)
    return tree_memory(root)


def tree_memory(root: psutil.Process) -> Memory:
    """The memory of the tree now."""
    rss = pss = 0.0
    count = 0
    for proc in tree(root):
        try:
            info = proc.memory_full_info()
        except psutil.NoSuchProcess:  # a child that ended since the tree was listed
            continue
        rss += info.rss
        pss += info.pss
        count += 1
    return Memory(rss / MiB, pss / MiB, count)
