"""``--concurrency N`` (and several ``--backend``): forked worker processes under a
small supervisor.

Processes, not threads: jobs run in parallel on every core, one crashing job takes
down one process only, and each process runs its job on its main thread, where
signals (and later, time limits) work. The supervisor runs no job; it forwards
SIGTERM/SIGINT to the children, restarts a child that dies unexpectedly, and exits
when all children have exited.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from types import FrameType

from django.db import connections

from .worker import Worker

logger = logging.getLogger(__name__)

# A child that dies sooner than this after its start counts towards a crash loop: the
# next restart waits, doubling up to RESTART_DELAY_MAX, instead of forking in a loop.
QUICK_EXIT = 5.0
RESTART_DELAY_MAX = 30.0


def run_pool(makers: Sequence[Callable[[], Worker]], *, restart: bool) -> int:
    """Run one worker process per entry of ``makers`` (each makes its process's
    worker); return 0 if every child exited cleanly.

    ``restart``: start a new child when one dies from a signal or an error (not in
    burst mode, where children exit once the queues are empty).
    """
    children: dict[int, tuple[float, int]] = {}  # pid -> (its start (monotonic), slot)
    stopping = False
    exit_code = 0
    quick_exits = 0

    def spawn(slot: int) -> None:
        connections.close_all()  # a forked child must not share the parent's sockets
        pid = os.fork()
        if pid == 0:
            # The supervisor's handlers were inherited; the worker installs its own. A
            # terminal's Ctrl-C reaches every process of the group: the supervisor
            # forwards it as SIGTERM, so children ignore SIGINT itself (else one Ctrl-C
            # would count twice and interrupt the jobs).
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            code = 1
            try:
                worker = makers[slot]()
                worker.install_signal_handlers([signal.SIGTERM])
                worker.run()
                code = 0
            except BaseException:
                logger.exception("Worker process %d crashed", os.getpid())
            finally:
                os._exit(code)
        children[pid] = (time.monotonic(), slot)

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in range(len(makers)):
        spawn(slot)
    logger.info("Started %d worker processes: %s", len(makers), sorted(children))
    while children:
        pid, status = os.wait()
        started, slot = children.pop(pid, (0.0, 0))
        lived = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            continue
        if stopping and code == -signal.SIGTERM:
            continue
        logger.error("Worker process %d exited with %d after %.1f s", pid, code, lived)
        if restart and not stopping:
            quick_exits = quick_exits + 1 if lived < QUICK_EXIT else 0
            if quick_exits:
                delay = min(0.5 * 2 ** (quick_exits - 1), RESTART_DELAY_MAX)
                logger.warning(
                    "Restarting it in %.1f s (%d quick exit(s) in a row)", delay, quick_exits
                )
                time.sleep(delay)
            if not stopping:
                spawn(slot)
        else:
            exit_code = 1
    return exit_code
