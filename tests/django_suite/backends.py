"""The backends that stand in for Django's built-in ones, and the hook that routes to them.

Django's tests name their backends by dotted path in ``@override_settings(TASKS=...)``.
``route_to_redisqueue()`` wraps ``task_backends.configure_settings``, the one place
Django turns ``settings.TASKS`` into the parameters its handler builds backends from:
at first use and again on every ``setting_changed`` for ``TASKS`` (Django's own receiver
calls it). Whatever the tests put in ``TASKS``, an alias naming Django's immediate
backend gets ``BurstWorkerBackend`` and one naming the dummy backend gets
``QueueOnlyBackend``, with the private Redis added to its ``OPTIONS``; every other alias
(the tests' own custom backends, a missing module) is left as it is. The test files,
``override_settings`` and Django's modules are not touched, so ``isinstance()`` checks
against Django's classes still see that the backend is not Django's.
"""

from __future__ import annotations

import threading
from typing import Any

from asgiref.local import Local

from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.compat import TASKS_PACKAGE, task_backends
from django_redisqueue.runtime.worker import Worker

# Seconds a burst worker may take to empty the queues of one enqueue.
WORKER_TIMEOUT = 60.0


class WorkerCrashed(RuntimeError):
    """The burst worker raised instead of returning: a bug, or a task that raised
    something the worker does not catch (it would have killed a real worker)."""


def run_burst_worker(backend: RedisQueueBackend) -> None:
    """Run ``Worker(backend, burst=True)`` until the backend's queues are empty.

    In a thread of its own, as if in a process of its own: its database connections
    are its own (it closes them between jobs, as a worker does, without touching the
    test's transaction), and what a task raises stays in the worker.
    """
    worker = Worker(backend, burst=True)
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            crashed.append(exc)

    thread = threading.Thread(target=run, name="burst-worker", daemon=True)
    thread.start()
    thread.join(WORKER_TIMEOUT)
    if thread.is_alive():
        worker.stop()
        thread.join(5)
        raise WorkerCrashed(
            f"the burst worker had not emptied the queues after {WORKER_TIMEOUT} s"
        )
    if crashed:
        exc = crashed[0]
        raise WorkerCrashed(f"the burst worker raised {type(exc).__name__}: {exc}") from exc


class BurstWorkerBackend(RedisQueueBackend):
    """Stands in for Django's ImmediateBackend, whose tests expect a finished job.

    ``enqueue()`` is RedisQueueBackend's (the job is checked and pushed to Redis), then
    a burst worker, the product's ``Worker``, claims and runs it from Redis and stores
    its outcome there; what the caller gets back is ``get_result()`` of the job, read
    from Redis, as another process would see it once the job is done. ``aenqueue()`` is
    Django's, which calls ``enqueue()``.
    """

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        run_burst_worker(self)
        return self.get_result(result.id)


class QueueOnlyBackend(RedisQueueBackend):
    """Stands in for Django's DummyBackend: jobs are queued in Redis and no worker runs
    them. ``clear()``, which the dummy's tests call in ``setUp``, deletes this backend's
    keys; the dummy's ``results`` list has no counterpart."""

    def clear(self) -> None:
        client = self.get_client()
        pattern = _glob_escape(self.keys.prefix) + "*"
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


STAND_INS = {
    f"{TASKS_PACKAGE}.backends.immediate.ImmediateBackend": (
        f"{BurstWorkerBackend.__module__}.{BurstWorkerBackend.__qualname__}"
    ),
    f"{TASKS_PACKAGE}.backends.dummy.DummyBackend": (
        f"{QueueOnlyBackend.__module__}.{QueueOnlyBackend.__qualname__}"
    ),
}


def route(tasks: dict[str, dict[str, Any]], redis_url: str) -> dict[str, dict[str, Any]]:
    """A copy of ``tasks`` with Django's immediate and dummy backends replaced."""
    routed = {}
    for alias, params in tasks.items():
        stand_in = STAND_INS.get(params.get("BACKEND", ""))
        if stand_in is not None:
            options = {**params.get("OPTIONS", {}), "URL": redis_url}
            params = {**params, "BACKEND": stand_in, "OPTIONS": options}
        routed[alias] = params
    return routed


def route_to_redisqueue(redis_url: str) -> None:
    """Install the hook on Django's task backend handler (see the module's docstring)."""
    original = task_backends.configure_settings

    def configure_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
        return route(original(settings), redis_url)

    task_backends.configure_settings = configure_settings  # type: ignore[method-assign]
    # Forget anything read before the hook was there.
    task_backends.__dict__.pop("settings", None)
    task_backends._settings = None
    task_backends._connections = Local()
