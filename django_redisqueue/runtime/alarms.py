"""Time limits of the worker's tasks, through their stop tokens: by alarm (SIGALRM,
``observe/deadlines.py``) on the main thread; a task on another thread is stopped by
the process's one time-limit thread."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django_redisqueue.exceptions import JobTimeout
from django_redisqueue.observe.deadlines import call_after
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.runtime.stopping import StopToken

logger = logging.getLogger(WORKER_LOGGER)


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
