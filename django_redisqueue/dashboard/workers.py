"""The overview's workers: each process's slots, how many are busy, and the jobs in
hand, found by the running jobs' owners (Redis holds them already: no write per job)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django_redisqueue.core.jobs import from_ms, whole_number
from django_redisqueue.dashboard.rows import MENU_QUEUES, JobRow
from django_redisqueue.store.queries import Live

# The jobs in hand shown per worker, the longest running first; the rest are counted
# (and listed on the running page), so that a refresh reads a few payloads a worker.
IN_HAND_SHOWN = 5


@dataclass
class WorkerRow:
    """A live worker process as the overview lists it."""

    live: Live
    now_ms: int
    in_hand: int = 0  # running jobs it owns
    jobs: list[JobRow] = field(default_factory=list)  # the first IN_HAND_SHOWN of them

    @property
    def id(self) -> str:
        return self.live.id

    @property
    def info(self) -> dict[str, str]:
        return self.live.info

    @property
    def queues(self) -> str:
        return ", ".join(self.live.queues)

    @property
    def queues_shown(self) -> list[str]:
        return self.live.queues[:MENU_QUEUES]

    @property
    def queues_left(self) -> int:
        return max(0, len(self.live.queues) - MENU_QUEUES)

    @property
    def heartbeat_age(self) -> float:
        return (self.now_ms - self.live.seen_ms) / 1000

    @property
    def seen_at(self) -> datetime | None:
        return from_ms(self.live.seen_ms)

    @property
    def slots(self) -> int:
        return self.live.slots

    @property
    def busy(self) -> int:
        return self.live.busy(self.in_hand)

    @property
    def more(self) -> int:
        """Jobs in hand not shown."""
        return self.in_hand - len(self.jobs)


def _started_ms(job: JobRow) -> int:
    return whole_number(job.fields.get("last_attempted_at"))


def worker_rows(
    live: Sequence[Live],
    running: Sequence[JobRow],
    now_ms: int,
    read: Callable[[list[str]], list[JobRow]],
) -> list[WorkerRow]:
    """A row per live worker, with its jobs in hand among ``running`` (rows with their
    owners and start times); ``read`` reads the jobs shown, all in one call."""
    held: dict[str, list[JobRow]] = {}
    for job in running:
        held.setdefault(job.worker, []).append(job)
    rows = []
    for worker in live:
        jobs = sorted(held.get(worker.id, []), key=lambda job: (_started_ms(job), job.id))
        rows.append(WorkerRow(worker, now_ms, len(jobs), jobs[:IN_HAND_SHOWN]))
    shown = {job.id: job for job in read([job.id for row in rows for job in row.jobs])}
    for row in rows:
        row.jobs = [shown.get(job.id, job) for job in row.jobs]
    return rows
