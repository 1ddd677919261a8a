"""Run, inside a test, the jobs the test enqueued: through Redis, on the test's thread
and database, delayed jobs and retries included, without waiting for their time.

``run_jobs()`` goes round by round. Each round moves the delayed jobs due within
``horizon`` of Redis's clock (those a ``delay``, ``run_after`` or a retry's backoff put
off) to their queues, with the dashboard's "run now" (``operate.lua``), then a burst
worker runs every job ready, the jobs that chains and group callbacks release
included. Rounds go on until one runs nothing; a retry is the next round's. Nothing
sleeps and no clock is changed: only which jobs are queued now.

It runs and moves every job of its backend, not only the test's: the tests need a
Redis (or a ``KEY_PREFIX``) of their own. When workers of other processes are alive on
its backend, ``run_jobs()`` warns (``LiveWorkersWarning``): they would take the test's
jobs, and it would run theirs.

``RunJobsMixin`` gives a ``TestCase`` the same as ``self.run_jobs()``;
``django_redisqueue.pytest_plugin`` gives pytest a ``run_jobs`` fixture.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import timedelta

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.compat import BaseTaskBackend, ImmediateBackend, task_backends
from django_redisqueue.core.tasks import RedisTaskResult
from django_redisqueue.runtime.worker import Finished, Worker
from django_redisqueue.store.wire import Claimed

# Delayed jobs due within this much of Redis's clock run; later ones are left delayed.
DEFAULT_HORIZON = timedelta(days=1)
# Rounds before run_jobs() gives up: enough for any retry policy short of a loop.
DEFAULT_MAX_ROUNDS = 50
# Most delayed jobs moved per queue and round.
BATCH = 1000
# Most live workers read to warn of them.
LIVE_WORKERS_READ = 100

__all__ = [
    "DEFAULT_HORIZON",
    "DEFAULT_MAX_ROUNDS",
    "JobsStillDue",
    "LiveWorkersWarning",
    "RunJobsMixin",
    "run_jobs",
]


class JobsStillDue(AssertionError):
    """``run_jobs()`` ran ``max_rounds`` rounds and jobs are still queued or due within
    its horizon: a task that retries for ever, or more retries than rounds."""


class LiveWorkersWarning(UserWarning):
    """``run_jobs()`` found live workers on its backend: the tests share the Redis (and
    the key prefix) of a development or production setup. pytest's ``filterwarnings``
    (``error::django_redisqueue.testing.LiveWorkersWarning``) or
    ``warnings.simplefilter("error", LiveWorkersWarning)`` make it an error."""


class _TestWorker(Worker):
    """A burst worker that keeps the test's database connection (and so its
    transaction) and records the results of what it ran."""

    def __init__(self, backend: RedisQueueBackend, queues: Sequence[str] | None) -> None:
        # No notice that no scheduler runs: run_jobs() moves delayed jobs itself.
        super().__init__(
            backend, queues, burst=True, close_connections=False, watch_scheduler=False
        )
        self.ran: list[RedisTaskResult] = []

    def execute(self, claimed: Claimed) -> Finished:
        finished = super().execute(claimed)
        if finished.result is not None:
            self.ran.append(finished.result)
        return finished


def run_jobs(
    backend: BaseTaskBackend | str | None = None,
    *,
    horizon: timedelta = DEFAULT_HORIZON,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    queues: Sequence[str] | None = None,
) -> list[RedisTaskResult]:
    """Run the jobs queued, and those delayed by up to ``horizon``, on this thread, until
    none is left; return a result for each attempt run, in order.

    ``backend``: a backend or its alias in ``TASKS`` (``"default"`` when None).
    ``queues``: the queues to run (default: those a worker serves). A retried attempt's
    result has the status ``READY`` and its error in ``errors``; the job's last attempt
    has its final status. Broadcasts run too, but have no result. The database
    connection stays open between jobs, so a ``TestCase``'s transaction holds: the
    jobs see the test's rows, and the test sees theirs.

    Under an ``ImmediateBackend`` every job ran as it was enqueued: this returns ``[]``.
    Raises ``JobsStillDue`` when jobs remain after ``max_rounds`` rounds. Warns
    (``LiveWorkersWarning``) when workers are alive on the backend: they share it.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, not {max_rounds!r}.")
    chosen = (
        backend if isinstance(backend, BaseTaskBackend) else task_backends[backend or "default"]
    )
    if isinstance(chosen, ImmediateBackend):
        return []
    if not isinstance(chosen, RedisQueueBackend):
        raise TypeError(f"run_jobs() runs the jobs of a RedisQueueBackend, not of {chosen!r}.")
    _warn_of_live_workers(chosen)
    horizon_ms = int(horizon.total_seconds() * 1000)
    ran: list[RedisTaskResult] = []
    for _ in range(max_rounds):
        _promote(chosen, horizon_ms, queues)
        worker = _TestWorker(chosen, queues)
        worker.run()
        if not worker.ran:
            return ran
        ran += worker.ran
    served = list(queues or chosen.served_queues())
    if _promote(chosen, horizon_ms, queues) or any(
        chosen.queries.queue_length(queue) for queue in served
    ):
        raise JobsStillDue(
            f"Jobs are still queued or due within {horizon} after {max_rounds} rounds "
            f"({len(ran)} attempt(s) run): a task that retries for ever? Raise max_rounds "
            "if it is a long retry policy."
        )
    return ran


def _warn_of_live_workers(backend: RedisQueueBackend) -> None:
    """Warn when workers heartbeat on ``backend``: asked before the first round, when no
    worker of this call is registered yet."""
    queries = backend.queries
    live = queries.live_workers(queries.clock_ms(), LIVE_WORKERS_READ)
    if not live:
        return
    hosts = sorted({worker.host for worker in live})
    warnings.warn(
        f"run_jobs(): {len(live)}{'+' if len(live) >= LIVE_WORKERS_READ else ''} live "
        f"worker(s) (on {', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''}) share "
        f"backend {backend.alias!r} (Redis {backend.broker.describe()}, key prefix "
        f"{backend.config.key_prefix!r}) with this test. They take the test's jobs, and "
        "run_jobs() runs theirs and starts their delayed jobs now. Give the tests a Redis "
        "of their own: another database in OPTIONS['URL'] (redis://127.0.0.1:6379/15) or "
        "a KEY_PREFIX of their own in the test settings' TASKS.",
        LiveWorkersWarning,
        stacklevel=3,
    )


def _promote(backend: RedisQueueBackend, horizon_ms: int, queues: Sequence[str] | None) -> int:
    """Queue the delayed jobs due within ``horizon_ms`` of Redis's clock; how many."""
    served = list(queues or backend.served_queues())
    due = backend.queries.delayed_due_by(served, backend.queries.clock_ms() + horizon_ms, BATCH)
    return sum(backend.broker.operate("run_now", queue, ids) for queue, ids in due.items() if ids)


class RunJobsMixin:
    """For a ``TestCase`` (or ``TransactionTestCase``, or any ``unittest.TestCase``):
    ``self.run_jobs()`` runs the jobs the test enqueued, as ``run_jobs()`` does, on the
    backend named by ``run_jobs_backend``."""

    run_jobs_backend: str = "default"

    def run_jobs(
        self,
        *,
        horizon: timedelta = DEFAULT_HORIZON,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        queues: Sequence[str] | None = None,
    ) -> list[RedisTaskResult]:
        return run_jobs(
            self.run_jobs_backend, horizon=horizon, max_rounds=max_rounds, queues=queues
        )
