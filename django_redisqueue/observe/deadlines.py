"""A deadline by alarm (SIGALRM) on the main thread: the health probe's, and the
worker's time limits (runtime/alarms.py)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


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
