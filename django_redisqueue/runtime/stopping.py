"""Stopping a running task from outside its own code: a lost lease, a time limit, a
second SIGTERM. Each task a worker runs has a ``StopToken``; whoever stops it names the
exception the task gets, raised in the task's own thread, once."""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Sent to the task's thread by a stop from another thread (the heartbeat's).
STOP_SIGNAL = signal.SIGUSR1
# How soon a stop raised in a thread other than the main one is raised again while the
# task has not taken it (s).
RAISE_AGAIN_AFTER = 0.05


class StopToken:
    """The one way a running task is stopped: ``stop(reason)`` raises ``reason`` in the
    task's thread while it runs (inside ``running()``), by STOP_SIGNAL on the main
    thread (which ends a blocking sleep too), elsewhere at the next bytecode (a call
    into C ends first), or cancels an ``async def`` task on its loop. A token stopped
    before its task runs raises as the task begins. The first reason wins."""

    def __init__(self) -> None:
        self.reason: BaseException | None = None
        self.thread: int | None = None  # the running task's thread
        self.cancel: Callable[[], object] | None = None  # see ``cancelling``
        self.stopped_at: float | None = None  # time.monotonic() of the stop

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around the task's own code: a stop raises there, and only there."""
        self.thread = threading.get_ident()
        try:
            if self.reason is not None:
                raise self.reason
            yield
        finally:
            self.thread = None

    @contextmanager
    def cancelling(self, cancel: Callable[[], object]) -> Iterator[None]:
        """While the task's thread waits for its task to run elsewhere (an ``async
        def`` task, on the process's event loop), a stop from another thread calls
        ``cancel`` instead of raising in the waiting thread, which could not take it
        there; a stop from the thread itself (a signal handler) raises as ever."""
        self.cancel = cancel
        try:
            if self.reason is not None:
                cancel()
            yield
        finally:
            self.cancel = None

    @property
    def is_running(self) -> bool:
        return self.thread is not None

    def not_let_go(self, seconds: float) -> bool:
        """Whether the task was stopped ``seconds`` ago or more and runs still: its
        thread is in a call that does not return to Python (a C call), where nothing
        raised in it can take effect."""
        stopped_at = self.stopped_at
        return (
            self.is_running and stopped_at is not None and time.monotonic() - stopped_at >= seconds
        )

    def stop(self, reason: BaseException) -> bool:
        """Stop the task with ``reason``; False if it was stopped already."""
        if self.reason is not None:
            return False
        self.reason, self.stopped_at = reason, time.monotonic()
        thread, cancel = self.thread, self.cancel
        if thread == threading.get_ident():
            if cancel is not None:
                # An async task's thread, maybe inside one of its thread-sensitive calls,
                # which would hand the exception to the task as that call's error.
                cancel()
            raise reason
        if cancel is not None:
            cancel()
        elif thread is not None and thread == threading.main_thread().ident:
            signal.pthread_kill(thread, STOP_SIGNAL)
        elif thread is not None:
            threading.Thread(
                target=self._raise_in, args=(thread, type(reason)), daemon=True
            ).start()
        return True

    def _raise_in(self, thread: int, exc_type: type[BaseException]) -> None:
        """Raise ``exc_type`` in ``thread`` once: set again until its task has taken it
        (or left ``running()``), as before Python 3.13 the interpreter-wide signal for
        these is cleared by the first thread to take its exception, and another
        thread's, set meanwhile, waits for the next switch of threads, which a lone busy
        thread may not make soon. Not again once taken: the task's clean-up (its
        finally blocks) runs out, as on the main thread."""
        taken = threading.Event()

        class Stop(exc_type):  # type: ignore[valid-type,misc]
            """``exc_type``, made in the task's thread as it takes the exception."""

            def __init__(self, *args: object) -> None:
                taken.set()
                super().__init__(*args)

        Stop.__name__, Stop.__qualname__ = exc_type.__name__, exc_type.__qualname__
        Stop.__module__ = exc_type.__module__
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
        while self.thread == thread and not taken.is_set():
            set_async_exc(ctypes.c_ulong(thread), ctypes.py_object(Stop))
            time.sleep(RAISE_AGAIN_AFTER)
        set_async_exc(ctypes.c_ulong(thread), None)  # any left undelivered is dropped

    def deliver(self) -> None:
        """In STOP_SIGNAL's handler: raise the reason, if the task runs on this thread."""
        if self.reason is not None and self.thread == threading.get_ident():
            raise self.reason
