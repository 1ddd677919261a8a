"""Jobs of a task the worker does not know: it started before the task was added, or a
deploy reached the web servers first. Such a job waits, given back, for a worker that
knows the task, for a bounded time; then it fails saying why."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from django_redisqueue.core.jobs import Envelope, whole_number
from django_redisqueue.exceptions import UnknownTask
from django_redisqueue.runtime import WORKER_LOGGER
from django_redisqueue.store.wire import RELEASE, Claimed, Outcome

logger = logging.getLogger(WORKER_LOGGER)

# How long such a job waits for a worker that knows its task (ms, from when it was
# ready); after each try it is given back for as long as it has waited, within these
# bounds (ms).
UNKNOWN_TASK_WAIT_MS = 15 * 60_000
UNKNOWN_TASK_RETRY_MS = (1_000, 60_000)


def for_a_worker_that_knows(claimed: Claimed, envelope: Envelope, worker_id: str) -> Outcome:
    """The job given back for later, uncounted; past UNKNOWN_TASK_WAIT_MS, UnknownTask
    saying what to do."""
    waited = waited_ms(claimed.fields, envelope.run_after)
    minutes = UNKNOWN_TASK_WAIT_MS // 60_000
    if waited >= UNKNOWN_TASK_WAIT_MS:
        raise UnknownTask(
            f"task {envelope.task_path!r} is not registered in this worker, nor in any "
            f"that took the job in the {minutes} minutes since it was ready: define it "
            "with @task in an installed app's tasks module, and restart the workers, "
            "which load the tasks when they start (runworker --reload restarts on code "
            "changes)"
        )
    delay = min(max(waited, UNKNOWN_TASK_RETRY_MS[0]), UNKNOWN_TASK_RETRY_MS[1])
    logger.warning(
        "Job %s: task %r is not registered in worker %s, which started before it was "
        "added (restart the workers, or use runworker --reload in development); given "
        "back to run in %.0f s on a worker that knows it (it fails after %d minutes)",
        claimed.job_id,
        envelope.task_path,
        worker_id,
        delay / 1000,
        minutes,
    )
    return Outcome(claimed.job_id, claimed.owner, RELEASE, retry_in_ms=delay)


def waited_ms(fields: Mapping[str, str], run_after: float | None) -> int:
    """How long a job has been ready to run (ms, Redis's clock): from its enqueue, or
    its due time, to this attempt."""
    ready = whole_number(fields.get("enqueued_at"))
    if run_after is not None and math.isfinite(run_after):
        ready = max(ready, int(run_after * 1000))
    return max(whole_number(fields.get("last_attempted_at")) - ready, 0)
