"""What the admin dashboard shows, read from Redis with bounded reads and shaped for
the templates. Views live in ``admin.py``; every Redis command is the broker's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.timezone import localtime

from .backend import RedisQueueBackend
from .broker import now_ms
from .jobs import Envelope, JobRecord, from_ms, to_json

PAGE_SIZE = 50
# Running jobs read for the overview: far more than any fleet runs at once.
RUNNING_READ_LIMIT = 1000
# A worker or scheduler silent for longer than this is shown as gone.
WORKER_ALIVE_MS = 30_000
SCHEDULER_ALIVE_MS = 15_000
CHART_MINUTES = 60
PREVIEW_CHARS = 80

JOB_FIELDS = (
    "payload", "queue", "priority", "status", "attempts", "lost", "owner", "workers",
    "enqueued_at", "started_at", "last_attempted_at", "finished_at", "errors", "result",
    "cancelled",
)  # fmt: skip
# What the overview reads of each running job: no payloads, results or tracebacks.
RUNNING_FIELDS = ("queue", "owner", "status")


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """JSON text of ``value``, cut to ``limit`` characters."""
    return preview_text(to_json(value), limit)


def printable(text: str) -> str:
    """``text`` with lone surrogates (JSON can hold them, a page cannot) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass
class JobRow:
    """One job as the dashboard lists it: its record (read leniently, whatever Redis
    holds) and its score in the set it was listed from."""

    record: JobRecord
    score: float = 0.0

    @classmethod
    def build(cls, job_id: str, fields: dict[str, str], score: float, max_bytes: int) -> JobRow:
        return cls(JobRecord.parse(job_id, fields, max_bytes), score)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def fields(self) -> Mapping[str, str]:
        return self.record.fields

    @property
    def exists(self) -> bool:
        return self.record.exists

    @property
    def envelope(self) -> Envelope | None:
        return self.record.envelope

    @property
    def problem(self) -> str:
        return self.record.problem

    @property
    def task(self) -> str:
        return printable(self.envelope.task_path) if self.envelope else "?"

    @property
    def arguments(self) -> str:
        if not self.envelope:
            return printable(self.problem)
        parts = [preview(a) for a in self.envelope.args]
        parts += [f"{k}={preview(v)}" for k, v in self.envelope.kwargs.items()]
        return preview_text(", ".join(parts))

    @property
    def queue(self) -> str:
        return self.record.queue

    @property
    def priority(self) -> int:
        return self.record.priority

    @property
    def status(self) -> str:
        return self.fields.get("status", "")

    @property
    def attempts(self) -> int:
        return self.record.attempts

    @property
    def enqueued_at(self) -> datetime | None:
        return self.record.enqueued_at

    @property
    def score_time(self) -> datetime | None:
        """The score as a time: due time, lease deadline or finish time."""
        return from_ms(self.score)

    @property
    def seconds_left(self) -> float:
        return (self.score - now_ms()) / 1000

    @property
    def started_at(self) -> datetime | None:
        return self.record.last_attempted_at

    @property
    def finished_at(self) -> datetime | None:
        return self.record.finished_at

    @property
    def worker(self) -> str:
        return self.record.owner.rpartition("/")[0]

    @property
    def errors(self) -> list[dict[str, str]]:
        return [{k: printable(v) for k, v in error.items()} for error in self.record.errors]

    @property
    def last_error(self) -> str:
        errors = self.errors
        if not errors:
            return ""
        lines = errors[-1]["traceback"].strip().splitlines()
        return preview_text(lines[-1] if lines else "")

    @property
    def result(self) -> str:
        return self.fields.get("result", "")


def preview_text(text: str, limit: int = PREVIEW_CHARS * 2) -> str:
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Page:
    """One page of a long list, numbered from 1."""

    number: int
    total: int
    rows: list[JobRow] = field(default_factory=list)
    size: int = PAGE_SIZE

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None

    @property
    def first_index(self) -> int:
        return self.offset + 1


class Dashboard:
    """The reads behind each page of one backend's dashboard."""

    def __init__(self, backend: RedisQueueBackend) -> None:
        self.backend = backend
        self.broker = backend.broker
        self.keys = backend.keys
        self.queues = backend.served_queues()

    def _rows(
        self, scored: Iterable[tuple[str, float]], fields: tuple[str, ...] = JOB_FIELDS
    ) -> list[JobRow]:
        scored = list(scored)
        infos = self.broker.jobs([job_id for job_id, _ in scored], *fields)
        max_bytes = self.backend.config.max_payload_bytes
        return [
            JobRow.build(job_id, info, score, max_bytes)
            for (job_id, score), info in zip(scored, infos, strict=True)
        ]

    def _page(self, key: str, number: int, *, newest_first: bool = False) -> Page:
        page = Page(number=1, total=self.broker.size(key))
        page.number = min(max(number, 1), page.pages)
        page.rows = self._rows(
            self.broker.page(key, page.offset, page.size, newest_first=newest_first)
        )
        return page

    def waiting(self, queue: str, number: int) -> Page:
        """READY jobs of a queue, in the order they will run."""
        return self._page(self.keys.queue(queue), number)

    def delayed(self, queue: str, number: int) -> Page:
        """READY jobs of a queue that are not due yet, the first due first."""
        return self._page(self.keys.delayed(queue), number)

    def failed(self, queue: str, number: int) -> Page:
        """FAILED jobs of a queue, the latest first."""
        return self._page(self.keys.failed(queue), number, newest_first=True)

    def running(self, fields: tuple[str, ...] = JOB_FIELDS) -> list[JobRow]:
        return self._rows(self.broker.page(self.keys.running, 0, RUNNING_READ_LIMIT), fields)

    def job(self, job_id: str) -> JobRow:
        return self._rows([(job_id, 0.0)])[0]

    def overview(self) -> dict[str, Any]:
        counts = self.broker.counts(self.queues)
        running = self.running(RUNNING_FIELDS)
        minutes = self.broker.finished_per_minute(CHART_MINUTES)
        for queue, row in counts.items():
            row["running"] = sum(1 for job in running if job.queue == queue)
            row["finished"] = sum(
                stats.get(f"ok:{queue}", 0) + stats.get(f"failed:{queue}", 0)
                for _, stats in minutes
            )
        now = self.broker.clock_ms()
        worker_ids = self.broker.alive(self.keys.workers)
        by_worker = {job.worker: job for job in running}
        # The task of each worker's current job: payloads of those jobs only.
        current = {
            row.worker: row
            for row in self._rows(
                [(by_worker[w].id, 0.0) for w, _ in worker_ids if w in by_worker]
            )
        }
        infos = self.broker.worker_info([worker_id for worker_id, _ in worker_ids])
        workers = [
            {
                "id": worker_id,
                "info": info,
                "queues": info.get("queues", "").replace(",", ", "),
                "heartbeat_age": (now - seen) / 1000,
                "alive": bool(info) and now - seen < WORKER_ALIVE_MS,
                "job": current.get(worker_id),
            }
            for (worker_id, seen), info in zip(worker_ids, infos, strict=True)
        ]
        schedulers = [
            {
                "id": scheduler_id,
                "age": (now - seen) / 1000,
                "alive": now - seen < SCHEDULER_ALIVE_MS,
            }
            for scheduler_id, seen in self.broker.alive(self.keys.schedulers)
        ]
        return {
            "counts": counts,
            "totals": {
                name: sum(int(row[name]) for row in counts.values())
                for name in ("ready", "running", "delayed", "failed", "finished")
            },
            "running_jobs": len(running),
            "workers": [w for w in workers if w["alive"]],
            "schedulers": [s for s in schedulers if s["alive"]],
            "chart": chart(minutes),
        }


def chart(minutes: list[tuple[int, dict[str, int]]], height: int = 60) -> dict[str, object]:
    """Bars for an inline SVG: jobs finished per minute, failed ones on top."""
    totals = [
        (
            sum(v for k, v in stats.items() if k.startswith("ok:")),
            sum(v for k, v in stats.items() if k.startswith("failed:")),
        )
        for _, stats in minutes
    ]
    peak = max((ok + failed for ok, failed in totals), default=0) or 1
    bars = []
    for i, ((minute, _), (ok, failed)) in enumerate(zip(minutes, totals, strict=True)):
        at = localtime(from_ms(minute * 60_000))
        ok_height = round(ok / peak * height, 1)
        failed_height = round(failed / peak * height, 1)
        bars.append(
            {
                "x": i * 8,
                "ok_y": height - ok_height,
                "ok_height": ok_height,
                "failed_y": height - ok_height - failed_height,
                "failed_height": failed_height,
                "label": f"{at:%H:%M}: {ok} ok, {failed} failed",
            }
        )
    return {
        "bars": bars,
        "width": len(minutes) * 8,
        "height": height,
        "peak": peak if any(ok + failed for ok, failed in totals) else 0,
        "total": sum(ok + failed for ok, failed in totals),
    }
