"""``--concurrency N`` (and several ``--backend``): forked worker processes under a
small supervisor, which runs no job, forwards SIGTERM/SIGINT to the children and, until
told to stop (and never in burst mode), replaces every child that exits.

Processes, not threads: jobs run on every core, a crash takes down one process only,
and each process runs its job on its main thread, where signals (and time limits) work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from django.db import connections

from django_redisqueue.runtime.reloading import ReloadWatcher, give_back_running_job
from django_redisqueue.runtime.worker import Worker

logger = logging.getLogger(__name__)

# A child that exits sooner than this after its start counts towards a crash loop: the
# next restart waits, doubling up to RESTART_DELAY_MAX, instead of forking in a loop.
QUICK_EXIT = 5.0
RESTART_DELAY_MAX = 30.0
# A child's exit code for "stopped to be replaced" (max jobs or max memory): not a
# crash. 75 is EX_TEMPFAIL of sysexits.h.
RECYCLED_EXIT_CODE = 75


@dataclass(slots=True)
class Child:
    started: float  # time.monotonic() at its start
    slot: int  # its index in the pool's makers
    stops_sent: int = 0  # SIGTERMs sent to it


class Pool:
    """One worker process per entry of ``makers`` (each makes its process's worker).

    ``restart``: replace every child that exits while the supervisor is not stopping
    (False in burst mode, where children exit once the queues are empty).
    ``stop_signals``: the signals on which the supervisor stops its children (under
    ``--reload`` the reloading parent forwards Ctrl-C as SIGTERM, so SIGINT is left out).
    """

    def __init__(
        self,
        makers: Sequence[Callable[[], Worker]],
        *,
        restart: bool,
        stop_signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self.makers = list(makers)
        self.restart = restart
        self.stop_signals = list(stop_signals)
        self.children: dict[int, Child] = {}  # by pid
        self.stop_requests = 0  # each one is a SIGTERM to every child
        # stop() runs on the reloader's thread too, or in a signal handler that
        # interrupts _spawn: every child gets every SIGTERM once, whenever it forked.
        self._lock = threading.RLock()

    def run(self) -> int:
        """Run the children until they have all exited; return 0 if every one exited
        cleanly (or was stopped, or recycled)."""
        for signum in self.stop_signals:
            signal.signal(signum, self._on_signal)
        for slot in range(len(self.makers)):
            self._spawn(slot)
        logger.info("Started %d worker processes: %s", len(self.makers), sorted(self.children))
        exit_code = 0
        quick_exits = 0
        while self.children:
            pid, status = os.wait()
            child = self.children.pop(pid, None)
            if child is None:
                continue
            slot, lived = child.slot, time.monotonic() - child.started
            code = os.waitstatus_to_exitcode(status)
            if self._ended_as_expected(code):
                continue
            if code == RECYCLED_EXIT_CODE:  # restarting and not stopping
                logger.info("Worker process %d recycled; starting a new one", pid)
                self._spawn(slot)
                continue
            if not self.restart or self.stopping:
                logger.error("Worker process %d exited with %d after %.1f s", pid, code, lived)
                exit_code = 1
                continue
            # Not asked to stop by this supervisor: a crash, or a signal sent to the child
            # alone (its graceful stop exits 0). Either way the pool must stay whole.
            if code == 0:
                logger.warning(
                    "Worker process %d exited (code 0) while the pool was not stopping, "
                    "after %.1f s (a SIGTERM sent to it alone?)",
                    pid,
                    lived,
                )
            else:
                logger.error("Worker process %d exited with %d after %.1f s", pid, code, lived)
            quick_exits = quick_exits + 1 if lived < QUICK_EXIT else 0
            if quick_exits:
                delay = min(0.5 * 2 ** (quick_exits - 1), RESTART_DELAY_MAX)
                logger.warning(
                    "Restarting it in %.1f s (%d quick exit(s) in a row)", delay, quick_exits
                )
                time.sleep(delay)
            self._spawn(slot)
        return exit_code

    def _ended_as_expected(self, code: int) -> bool:
        """Whether a child that exited with ``code`` did as it was asked, and is not to
        be replaced: stopped by this supervisor, or, in burst mode, out of work or
        recycled."""
        if self.stopping:
            return code in (0, -signal.SIGTERM, RECYCLED_EXIT_CODE)
        return not self.restart and code in (0, RECYCLED_EXIT_CODE)

    def stop(self) -> None:
        """Stop every child: each finishes its job in hand. A second call gives the
        running jobs back to their queues, as a second SIGTERM does."""
        with self._lock:
            self.stop_requests += 1
            self._send_stops()

    @property
    def stopping(self) -> bool:
        return self.stop_requests > 0

    def _send_stops(self) -> None:
        for pid, child in list(self.children.items()):
            while child.stops_sent < self.stop_requests:
                child.stops_sent += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def _spawn(self, slot: int) -> None:
        with self._lock:
            if self.stopping:
                return
            connections.close_all()  # a forked child must not share the parent's sockets
            pid = os.fork()
            if pid == 0:
                self._child(slot)
            self.children[pid] = Child(time.monotonic(), slot)
            self._send_stops()  # a stop that came in while forking

    def _child(self, slot: int) -> None:
        # The supervisor's handlers were inherited; the worker installs its own. A
        # terminal's Ctrl-C reaches every process of the group: the supervisor
        # forwards it as SIGTERM, so children ignore SIGINT itself (else one Ctrl-C
        # would count twice and interrupt the jobs).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = 1
        try:
            worker = self.makers[slot]()
            worker.install_signal_handlers([signal.SIGTERM])
            worker.run()
            code = RECYCLED_EXIT_CODE if worker.recycled else 0
        except BaseException:
            logger.exception("Worker process %d crashed", os.getpid())
        finally:
            os._exit(code)


def run_workers(
    makers: Sequence[Callable[[], Worker]],
    *,
    restart: bool,
    watcher: ReloadWatcher | None = None,
) -> int:
    """Run one worker in this process, or a Pool of them when there are several;
    return 0 if all went well (a single worker recycled too: its process manager starts
    a new one). With ``watcher`` (``--reload``) a file change stops the worker or the
    pool, and the process exits for the reloading parent to start it again."""
    stop_signals = [signal.SIGTERM] if watcher else [signal.SIGTERM, signal.SIGINT]
    if len(makers) == 1:
        worker = makers[0]()
        worker.install_signal_handlers(stop_signals)
        if watcher is not None:
            watcher.attach(worker.stop, give_back_running_job)
        worker.run()
        code = 0
        if worker.stuck:  # a thread that never returns: exit without waiting for it
            logging.shutdown()
            os._exit(code)
    else:
        pool = Pool(makers, restart=restart, stop_signals=stop_signals)
        if watcher is not None:
            watcher.attach(pool.stop, pool.stop)  # a second stop gives the jobs back
        code = pool.run()
    if watcher is not None:
        watcher.exit_if_changed()
    return code
