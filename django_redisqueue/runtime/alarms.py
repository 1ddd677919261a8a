"""Time limits by alarm (SIGALRM), for the worker's tasks and the health probe's
deadline: one mechanism, in the main thread only."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from django_redisqueue.exceptions import JobTimeout


@contextmanager
def raise_after(seconds: float | None, error: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``error()`` inside the block once it has run ``seconds`` (SIGALRM).

    Only in the main thread (elsewhere, or with no seconds, the block runs unbounded).
    Code blocked inside C that does not return to Python is stopped only when it does.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise error()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def time_limit(seconds: float | None, what: str) -> contextlib.AbstractContextManager[None]:
    """Stop a task (JobTimeout) that runs past its timeout, on the worker's main thread."""
    return raise_after(
        seconds, lambda: JobTimeout(f"{what} ran past its timeout of {seconds} s and was stopped")
    )
