"""Stopping a running task from outside its own code: a lost lease, a time limit, a
second SIGTERM. Each task a worker runs has a ``StopToken``; whoever stops it names the
exception the task gets, raised in the task's own thread, once; an ``async def`` task
(``call_task``) is cancelled on its event loop instead, and gets it there."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync

# Sent to the task's thread by a stop from another thread (the heartbeat's).
STOP_SIGNAL = signal.SIGUSR1
# How soon a stop raised in a thread other than the main one is raised again while the
# task has not taken it (s).
RAISE_AGAIN_AFTER = 0.05


class StopToken:
    """The one way a running task is stopped. ``stop(reason)`` raises ``reason`` in the
    task's thread while it runs (inside ``running()``): at once from that thread itself
    (a signal handler there: the time limit's, a second SIGTERM's); on the main thread
    from another (the heartbeat's) by STOP_SIGNAL, whose handler (``deliver``) raises it,
    ending a blocking sleep too; on any other thread by ``PyThreadState_SetAsyncExc``,
    which raises ``reason``'s class at the task's next bytecode (a sleep or a call into
    C ends first; ``reason`` itself is the token's, for the message). An ``async def``
    task, whose thread only waits for its loop, is cancelled on the loop (``cancel``,
    set by ``call_task``). A token stopped before its task runs raises as the task
    begins. The first reason wins."""

    def __init__(self) -> None:
        self.reason: BaseException | None = None
        self.thread: int | None = None  # the running task's thread
        self.cancel: Callable[[], None] | None = None  # while an async task runs

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

    @property
    def is_running(self) -> bool:
        return self.thread is not None

    def stop(self, reason: BaseException) -> bool:
        """Stop the task with ``reason``; False if it was stopped already."""
        if self.reason is not None:
            return False
        self.reason = reason
        if (cancel := self.cancel) is not None:
            cancel()
            return True
        thread = self.thread
        if thread == threading.get_ident():
            raise reason
        if thread is not None and thread == threading.main_thread().ident:
            signal.pthread_kill(thread, STOP_SIGNAL)
        elif thread is not None:
            threading.Thread(
                target=self._raise_in, args=(thread, type(reason)), daemon=True
            ).start()
        return True

    def _raise_in(self, thread: int, exc_type: type[BaseException]) -> None:
        """Raise ``exc_type`` in ``thread`` until its task has left ``running()``, not
        once: before Python 3.13 the interpreter-wide signal for these is cleared by the
        first thread to take its exception, and another thread's, set meanwhile, waits
        for the next switch of threads, which a lone busy thread may not make soon."""
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
        while self.thread == thread:
            set_async_exc(ctypes.c_ulong(thread), ctypes.py_object(exc_type))
            time.sleep(RAISE_AGAIN_AFTER)
        set_async_exc(ctypes.c_ulong(thread), None)  # any left undelivered is dropped

    def deliver(self) -> None:
        """In STOP_SIGNAL's handler: raise the reason, if the task runs on this thread."""
        if self.reason is not None and self.thread == threading.get_ident():
            raise self.reason


def call_task(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any], token: StopToken) -> Any:
    """Call ``task`` as Django's ``Task.call`` does, an ``async def`` one on an event loop
    of its own (``async_to_sync``), where a stop through ``token`` cancels it: the task
    ends there, its ``finally`` blocks run, and ``token``'s reason is raised. (Raised in
    the thread that waits for the loop, it would leave the coroutine running on in the
    background, or, off the main thread, land only once the coroutine has ended.)"""
    if not iscoroutinefunction(task.func):
        return task.call(*args, **kwargs)

    async def cancellable() -> Any:
        loop, running = asyncio.get_running_loop(), asyncio.current_task()
        assert running is not None

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the task ended
                loop.call_soon_threadsafe(running.cancel)

        token.cancel = cancel
        try:
            if token.reason is not None:  # stopped while the loop started
                raise token.reason
            return await task.func(*args, **kwargs)
        except asyncio.CancelledError:
            if token.reason is None:
                raise
            raise token.reason from None
        finally:
            token.cancel = None

    return async_to_sync(cancellable)()
