"""``--concurrency N``: N forked worker processes under a small supervisor.

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
from collections.abc import Callable
from types import FrameType

from django.db import connections

from .worker import Worker

logger = logging.getLogger(__name__)


def run_pool(make_worker: Callable[[], Worker], concurrency: int, *, restart: bool) -> int:
    """Run ``concurrency`` worker processes; return 0 if every child exited cleanly.

    ``restart``: start a new child when one dies from a signal or an error (not in
    burst mode, where children exit once the queues are empty).
    """
    children: set[int] = set()
    stopping = False
    exit_code = 0

    def spawn() -> None:
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
                worker = make_worker()
                worker.install_signal_handlers([signal.SIGTERM])
                worker.run()
                code = 0
            except BaseException:
                logger.exception("Worker process %d crashed", os.getpid())
            finally:
                os._exit(code)
        children.add(pid)

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in range(concurrency):
        spawn()
    logger.info("Started %d worker processes: %s", concurrency, sorted(children))
    while children:
        pid, status = os.wait()
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            continue
        if stopping and code == -signal.SIGTERM:
            continue
        logger.error("Worker process %d exited with %d", pid, code)
        if restart and not stopping:
            spawn()
        else:
            exit_code = 1
    return exit_code
