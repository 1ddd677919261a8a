"""Time limits: by alarm (SIGALRM) on the main thread, for the worker's tasks (through
their stop tokens) and the health probe's deadline; a task on another thread is
stopped through its token by the process's one time-limit thread."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from django_redisqueue.exceptions import JobTimeout
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.stopping import StopToken

logger = logging.getLogger(WORKER_LOGGER)


@contextmanager
def call_after(seconds: float | None, action: Callable[[], None]) -> Iterator[None]:
    """Call ``action`` once the block has run ``seconds`` (SIGALRM), in the main thread,
    inside the block: it may raise, to stop it.

    Only in the main thread (elsewhere, or with no seconds, the block runs unbounded).
    Code blocked inside C that does not return to Python is stopped only when it does.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        action()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def raise_after(
    seconds: float | None, error: Callable[[], BaseException]
) -> contextlib.AbstractContextManager[None]:
    """Raise ``error()`` inside the block once it has run ``seconds``."""

    def fail() -> None:
        raise error()

    return call_after(seconds, fail)


@contextmanager
def time_limit(seconds: float | None, what: str, token: StopToken) -> Iterator[None]:
    """Stop a task that runs past its timeout through its stop token (JobTimeout): by
    SIGALRM on the main thread, elsewhere by the process's time-limit thread."""

    def stop() -> None:
        token.stop(JobTimeout(f"{what} ran past its timeout of {seconds} s and was stopped"))

    if not seconds or threading.current_thread() is threading.main_thread():
        with call_after(seconds, stop):
            yield
        return
    deadline = _DEADLINES.add(seconds, stop)
    try:
        yield
    finally:
        _DEADLINES.cancel(deadline)


class _Deadlines:
    """One thread of the process calls each action at its deadline, unless cancelled
    first: a slot's time limit costs an entry in a heap, not a thread of its own."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # (deadline, number), soonest first
        self._actions: dict[int, Callable[[], None]] = {}  # by number, till called
        self._count = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, seconds: float, action: Callable[[], None]) -> int:
        with self._changed:
            number = next(self._count)
            self._actions[number] = action
            heapq.heappush(self._heap, (time.monotonic() + seconds, number))
            if self._thread is None or not self._thread.is_alive():  # (a fork has none)
                self._thread = threading.Thread(
                    target=self._run, name="redisqueue-time-limits", daemon=True
                )
                self._thread.start()
            self._changed.notify()
            return number

    def cancel(self, number: int) -> None:
        with self._changed:
            self._actions.pop(number, None)
            if len(self._heap) > 2 * len(self._actions) + 64:  # mostly cancelled: drop them
                self._heap = [entry for entry in self._heap if entry[1] in self._actions]
                heapq.heapify(self._heap)

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._heap and self._heap[0][1] not in self._actions:
                    heapq.heappop(self._heap)  # cancelled
                if not self._heap:
                    self._changed.wait()
                    continue
                due, number = self._heap[0]
                if due > time.monotonic():
                    self._changed.wait(due - time.monotonic())
                    continue
                heapq.heappop(self._heap)
                action = self._actions.pop(number)
            try:
                action()
            except Exception:  # said, and the other limits still fire
                logger.exception("A time limit's stop failed")


_DEADLINES = _Deadlines()
