"""How one attempt at a job ended, as the log and the metrics see it: the worker makes
a ``JobEvent`` once the outcome is stored, and hands it to both."""

from __future__ import annotations

from dataclasses import dataclass

from django_redisqueue.core.jobs import Envelope, first_wait, whole_number
from django_redisqueue.store.wire import Claimed


@dataclass(frozen=True, slots=True)
class JobEvent:
    """How one attempt at a job ended, for the log and the metrics: labels and figures
    only (no arguments, results or tracebacks)."""

    job_id: str
    task: str  # the task's path; '' when the payload could not be read
    queue: str
    status: str  # SUCCESSFUL, FAILED, RETRY or RELEASE
    duration: float  # seconds the task ran; 0.0 when it never started
    attempt: int
    wait: float | None  # seconds from when it could first run to its start (attempt 1)

    @classmethod
    def of(
        cls, claimed: Claimed, envelope: Envelope | None, status: str, duration: float
    ) -> JobEvent:
        fields = claimed.fields
        attempt = whole_number(fields.get("attempts")) or 1
        wait = None
        if attempt == 1:
            wait = first_wait(fields, envelope.run_after if envelope else None)
        task = envelope.task_path if envelope else ""
        return cls(claimed.job_id, task, fields.get("queue", ""), status, duration, attempt, wait)
