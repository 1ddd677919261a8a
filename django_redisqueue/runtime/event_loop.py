"""The worker process's one event loop, on a thread of its own: ``async def`` tasks run
there, as many at once as the worker has slots, rather than each on a loop (and a
thread) of its own, as ``async_to_sync`` would run them.

The thread that runs the attempt waits for the task and meanwhile runs its
thread-sensitive calls (the ORM), on that thread's own database connections; a stop
cancels the task on the loop (docs/architecture.md, "Many jobs in one process").
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from inspect import iscoroutinefunction
from typing import Any

from asgiref.current_thread_executor import CurrentThreadExecutor
from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.db import connections

from django_redisqueue.exceptions import WorkerShutdown
from django_redisqueue.runtime.stopping import StopToken

# From asgiref 3.13 a context's thread-sensitive calls go to the executor it is given
# (the waiting thread's); earlier, each context has a thread of its own. Before 3.9 the
# waiting thread's executor takes no parent.
_CONTEXT_TAKES_EXECUTOR = "executor" in inspect.signature(ThreadSensitiveContext).parameters
_EXECUTOR_TAKES_PARENT = "old_executor" in inspect.signature(CurrentThreadExecutor).parameters
# Seconds between the loop's ticks, by which a blocked loop is told.
TICK = 0.5


class EventLoop:
    """A loop started on a daemon thread at the first ``async def`` task."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._waiting: dict[Future[Any], StopToken] = {}  # the tasks threads wait for
        self._answered_at = time.monotonic()  # the loop's last tick (see ``_tick``)

    def _tick(self) -> None:
        """On the loop, every TICK seconds: it answers (``give_back_if_blocked``)."""
        self._answered_at = time.monotonic()
        if self._loop is not None:
            self._loop.call_later(TICK, self._tick)

    def give_back_if_blocked(self, seconds: float) -> bool:
        """If the loop has not run for ``seconds`` while threads wait for it (a task
        blocks it: a sync call inside an ``async def``), release them: each task's
        stop token is stopped (WorkerShutdown: its job given back, unless stopped
        already, by a time limit say) and its thread returns, the task left on the
        loop, which the process leaves behind. True if it did."""
        if not self._waiting or time.monotonic() - self._answered_at < seconds:
            return False
        for future, token in list(self._waiting.items()):
            token.stop(WorkerShutdown())
            future.cancel()
        return True

    def call(
        self, task: Any, args: Sequence[Any], kwargs: dict[str, Any], token: StopToken
    ) -> Any:
        """Call a task (an ``attempts.Call``): an ``async def`` one on this loop
        (``run``), another as Django's ``Task.call``."""
        if iscoroutinefunction(getattr(task, "func", None)):
            return self.run(task.func, args, kwargs, token)
        return task.call(*args, **kwargs)

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._starting:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="redisqueue-loop", daemon=True
                )
                self._thread.start()
                self._loop = loop
                self._answered_at = time.monotonic()
                loop.call_soon_threadsafe(self._tick)
            return self._loop

    def run(
        self,
        func: Callable[..., Coroutine[Any, Any, Any]],
        args: Any,
        kwargs: dict[str, Any],
        token: StopToken,
    ) -> Any:
        """Await ``func(*args, **kwargs)`` on the loop and return its value, running its
        thread-sensitive calls on this thread meanwhile; a stop of ``token`` cancels it,
        and raises the stop's reason here."""
        executor = (
            CurrentThreadExecutor(None) if _EXECUTOR_TAKES_PARENT else CurrentThreadExecutor()  # type: ignore[call-arg]
        )
        loop = self._running()
        started: list[asyncio.Task[Any]] = []
        future: Future[Any] = asyncio.run_coroutine_threadsafe(
            _in_context(func(*args, **kwargs), executor, started), loop
        )

        def cancel() -> None:
            # The task itself, once it started: the future then ends with it, its
            # except and finally blocks run (one that swallows the cancellation runs on).
            loop.call_soon_threadsafe(lambda: started[0].cancel() if started else future.cancel())

        self._waiting[future] = token
        try:
            with token.cancelling(cancel):
                executor.run_until_future(future)
        except BaseException:  # the stop raised here, by a signal: cancel it there too
            cancel()
            raise
        finally:
            self._waiting.pop(future, None)
        if token.reason is not None:
            # Stopped: the attempt ends with the stop's reason however the task ended
            # (one that swallowed its cancellation, or caught the exception raised in
            # its thread-sensitive call, may have returned).
            raise token.reason
        return future.result()

    def close(self) -> None:
        """Stop the loop (the tasks still on it are dropped with the process)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None


async def _in_context(
    awaitable: Coroutine[Any, Any, Any],
    executor: CurrentThreadExecutor,
    started: list[asyncio.Task[Any]],
) -> Any:
    """Await the task (its asyncio task put in ``started``) with its thread-sensitive
    calls sent to ``executor``; before asgiref 3.13, to a thread of the task's own,
    whose connections it closes."""
    if (running := asyncio.current_task()) is not None:
        started.append(running)
    if _CONTEXT_TAKES_EXECUTOR:
        async with ThreadSensitiveContext(executor=executor):
            return await awaitable
    async with ThreadSensitiveContext() as context:
        try:
            return await awaitable
        finally:
            if SyncToAsync.context_to_thread_executor.get(context) is not None:
                await sync_to_async(connections.close_all)()  # in that thread, which ends
