"""The dashboard's actions: what each one is (``ACTIONS``, ``SELECTION_ACTIONS``, which
drive the views and the templates), and what doing one changes in Redis, told as the
messages the page shows. The views in ``admin.py`` check permissions and CSRF first."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages

from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.exceptions import NotCancellable, NotStoppable
from django_redisqueue.runtime.periodic import PeriodicTaskError, run_now, schedules_of

# What an action tells: (a level of django.contrib.messages, the text).
Told = tuple[int, str]
# Jobs changed per script call by the "all" actions, so that Redis never blocks long.
ACTION_BATCH = 1000


@dataclass(frozen=True)
class Action:
    label: str
    destructive: bool
    needs_job: bool = False  # acts on one job only
    needs_group: bool = False  # acts on one group, of no one queue
    needs_schedule: bool = False  # acts on one periodic schedule, of no one queue


ACTIONS = {
    "retry_failed": Action("Retry failed jobs", destructive=False),
    "delete_failed": Action("Delete failed jobs", destructive=True),
    "run_now": Action("Run the delayed job now", destructive=False, needs_job=True),
    "cancel": Action("Cancel the job", destructive=True, needs_job=True),
    "stop": Action("Abort the running job", destructive=True, needs_job=True),
    "pause": Action("Pause the queue", destructive=False),
    "resume": Action("Resume the queue", destructive=False),
    "empty": Action("Delete every waiting job of the queue", destructive=True),
    "cancel_group": Action("Cancel the group", destructive=True, needs_group=True),
    "pause_schedule": Action("Pause", destructive=False, needs_schedule=True),
    "resume_schedule": Action("Resume", destructive=False, needs_schedule=True),
    "run_schedule": Action("Run now", destructive=False, needs_schedule=True),
}


# What an action of the queue's script did, in its message.
DONE = {
    "retry_failed": "put back on their queue",
    "delete_failed": "deleted",
    "run_now": "queued to run now",
    "empty": "deleted from the queue",
}
GONE = " The others had left that list meanwhile."

# The actions on the jobs selected in each list, as its select offers them.
SELECTION_ACTIONS = {
    "waiting": [("cancel", "Cancel selected jobs")],
    "delayed": [("run_now", "Run selected jobs now"), ("cancel", "Cancel selected jobs")],
    "failed": [("retry_failed", "Retry selected jobs"), ("delete_failed", "Delete selected jobs")],
}
SELECTION_LABELS = dict(action for actions in SELECTION_ACTIONS.values() for action in actions)


def apply(backend: RedisQueueBackend, action: str, queue: str, job_id: str) -> list[Told]:
    """An action on one job, or on a whole queue (no ``job_id``)."""
    broker = backend.broker
    if action == "cancel":
        try:
            backend.cancel(job_id)
        except (NotCancellable, TaskResultDoesNotExist) as exc:
            return [(messages.ERROR, f"Job {job_id} was not cancelled: {exc}")]
        return [(messages.SUCCESS, f"Job {job_id} cancelled.")]
    if action == "stop":
        return _stop(backend, job_id)
    if action in ("pause", "resume"):
        broker.operate(action, queue)
        return [(messages.SUCCESS, f"Queue {queue} {action}d.")]
    if job_id:
        changed = broker.operate(action, queue, [job_id])
    else:
        changed = 0
        while batch := broker.operate(action, queue, limit=ACTION_BATCH):
            changed += batch
    level = messages.SUCCESS if changed else messages.WARNING
    return [(level, f"{changed} job(s) of queue {queue} {DONE[action]}.")]


def apply_to_selection(
    backend: RedisQueueBackend, action: str, queue: str, job_ids: list[str]
) -> list[Told]:
    """An action on the jobs selected in a list."""
    if action != "cancel":
        changed = backend.broker.operate(action, queue, job_ids)
        level = messages.SUCCESS if changed == len(job_ids) else messages.WARNING
        text = f"{changed} of {len(job_ids)} selected job(s) of queue {queue} {DONE[action]}." + (
            "" if changed == len(job_ids) else GONE
        )
        return [(level, text)]
    refused = []
    for job_id in job_ids:
        try:
            backend.cancel(job_id)
        except (NotCancellable, TaskResultDoesNotExist):
            refused.append(job_id)
    told: list[Told] = []
    cancelled = len(job_ids) - len(refused)
    if cancelled:
        told.append(
            (messages.SUCCESS, f"{cancelled} of {len(job_ids)} selected job(s) cancelled.")
        )
    if refused:
        shown = ", ".join(refused[:5]) + (", …" if len(refused) > 5 else "")
        told.append(
            (
                messages.WARNING,
                f"{len(refused)} selected job(s) not cancelled, as they had started, ended "
                f"or expired meanwhile: {shown}.",
            )
        )
    return told


def act_on_schedule(backend: RedisQueueBackend, action: str, name: str) -> list[Told]:
    """Pause, resume or run now a schedule of the settings; LookupError for any other
    name."""
    schedule = next((s for s in schedules_of(backend) if s.name == name), None)
    if schedule is None:
        raise LookupError(f"No periodic job {name!r} in backend {backend.alias!r}")
    if action == "run_schedule":
        try:
            job_id = run_now(backend, schedule)
        except PeriodicTaskError as exc:
            return [(messages.ERROR, str(exc))]
        return [(messages.SUCCESS, f"Periodic job {name}: job {job_id} queued to run now.")]
    paused = action == "pause_schedule"
    backend.broker.periodic_pause(name, paused=paused)
    if paused:
        return [
            (messages.SUCCESS, f"Periodic job {name} paused: its occurrences pass without a job.")
        ]
    return [
        (
            messages.SUCCESS,
            f"Periodic job {name} resumed: from its next occurrence, the paused time is not "
            "caught up.",
        )
    ]


def _stop(backend: RedisQueueBackend, job_id: str) -> list[Told]:
    try:
        asked = backend.stop(job_id)
    except (NotStoppable, TaskResultDoesNotExist) as exc:
        return [(messages.ERROR, f"Job {job_id} was not aborted: {exc}")]
    if not asked:
        return [(messages.WARNING, f"Job {job_id} had ended already: nothing changed.")]
    return [
        (
            messages.SUCCESS,
            f"Job {job_id} aborted: its worker stops it within a second, and it ends FAILED "
            "(JobStopped), not retried.",
        )
    ]


def cancel_group(backend: RedisQueueBackend, group_id: str) -> list[Told]:
    if backend.queries.group(group_id) is None:
        return [
            (
                messages.ERROR,
                f"Group {group_id} was not cancelled: it does not exist (or it expired).",
            )
        ]
    cancelled = backend.cancel_group(group_id)
    level = messages.SUCCESS if cancelled else messages.WARNING
    return [
        (
            level,
            f"Group {group_id} cancelled: {cancelled} job(s) that had not started were "
            "cancelled. Members already running finish; a callback that has not started "
            "never runs.",
        )
    ]
