"""What the admin dashboard shows, read from Redis with bounded reads and shaped for
the templates. Views live in ``admin.py``; every Redis command is the broker's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.utils.timezone import localtime

from .backend import RedisQueueBackend
from .broker import GroupState, now_ms
from .exceptions import InvalidPayload
from .jobs import STATUSES, Envelope, JobRecord, from_ms, to_json

PAGE_SIZE = 50
# Running jobs read for the overview: far more than any fleet runs at once.
RUNNING_READ_LIMIT = 1000
# A worker or scheduler silent for longer than this is shown as gone.
WORKER_ALIVE_MS = 30_000
SCHEDULER_ALIVE_MS = 15_000
CHART_MINUTES = 60
PREVIEW_CHARS = 80
# Members of a group whose status the group page counts: a larger group's counts are
# of its first members only, so that a refresh never reads a huge group whole.
MEMBER_COUNT_LIMIT = 10_000
MEMBER_READ_BATCH = 1000
# A job's ``after`` field when it is a group's callback: ``group:<gid>``.
AFTER_GROUP_PREFIX = "group:"
# The prefix of a broadcast message's fields saying how a worker ran it.
RAN_PREFIX = "ran:"

JOB_FIELDS = (
    "payload", "queue", "priority", "status", "attempts", "lost", "owner", "workers",
    "enqueued_at", "started_at", "last_attempted_at", "finished_at", "errors", "result",
    "cancelled", "group", "after", "waiting",
)  # fmt: skip
# What the overview reads of each running job: no payloads, results or tracebacks.
RUNNING_FIELDS = ("queue", "owner", "status")
# What the group pages read of a group's members and callback: no results or tracebacks.
MEMBER_FIELDS = ("payload", "queue", "status", "cancelled", "waiting")
STATUS_FIELDS = ("status", "cancelled", "waiting")

Row = TypeVar("Row")


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """JSON text of ``value``, cut to ``limit`` characters."""
    return preview_text(to_json(value), limit)


def printable(text: str) -> str:
    """``text`` with lone surrogates (JSON can hold them, a page cannot) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_arguments(envelope: Envelope) -> str:
    """An envelope's arguments as one line of previews."""
    parts = [preview(a) for a in envelope.args]
    parts += [f"{k}={preview(v)}" for k, v in envelope.kwargs.items()]
    return preview_text(", ".join(parts))


def status_label(fields: Mapping[str, str]) -> str:
    """A job's status as the dashboard shows it: "expired" for a record gone, and
    whether a READY job waits for another or a FAILED one was cancelled."""
    if not fields:
        return "expired"
    status = printable(fields.get("status", ""))
    if fields.get("waiting"):
        return f"{status} (waiting)"
    if fields.get("cancelled"):
        return f"{status} (cancelled)"
    return status


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
        return describe_arguments(self.envelope)

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
    def status_label(self) -> str:
        return status_label(self.fields)

    @property
    def group_id(self) -> str:
        """The group this job is a member of ('' if none)."""
        return self.fields.get("group", "")

    @property
    def after_job_id(self) -> str:
        """The job this one runs after ('' if none, or if it waits for a group)."""
        after = self.fields.get("after", "")
        return "" if after.startswith(AFTER_GROUP_PREFIX) else after

    @property
    def after_group_id(self) -> str:
        """The group this job runs after, as its callback ('' if none)."""
        after = self.fields.get("after", "")
        return (
            after.removeprefix(AFTER_GROUP_PREFIX) if after.startswith(AFTER_GROUP_PREFIX) else ""
        )

    @property
    def waiting(self) -> bool:
        """READY but held until the job or group it runs after ends."""
        return bool(self.fields.get("waiting"))

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


def page_number(number: int, total: int, size: int = PAGE_SIZE) -> int:
    """``number`` brought within the pages that ``total`` rows fill (at least one)."""
    return min(max(number, 1), max(1, -(-total // size)))


@dataclass
class Page(Generic[Row]):
    """One page of a long list, numbered from 1."""

    number: int
    total: int
    rows: list[Row] = field(default_factory=list)
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


@dataclass
class GroupRow:
    """A group as the dashboard lists it: its counts (zeros for one whose record
    expired while the index still names it) and its callback job."""

    id: str
    score: float  # its time in the index of groups (ms)
    state: GroupState
    exists: bool = True
    callback: JobRow | None = None

    @classmethod
    def expired(cls, group_id: str, score: float = 0.0) -> GroupRow:
        state = GroupState(
            group_id=group_id,
            size=0,
            total=None,
            ended=0,
            failed=0,
            callback_id="",
            created_at_ms=0,
            finished_at_ms=None,
            cancelled=False,
        )
        return cls(group_id, score, state, exists=False)

    @property
    def created_at(self) -> datetime | None:
        return from_ms(self.state.created_at_ms or self.score)

    @property
    def sealed(self) -> bool:
        """Whether every member was stored (an unsealed group is still being queued)."""
        return self.state.total is not None

    @property
    def total(self) -> int:
        return self.state.total if self.state.total is not None else self.state.size

    @property
    def ended(self) -> int:
        return self.state.ended

    @property
    def failed(self) -> int:
        return self.state.failed

    @property
    def finished(self) -> bool:
        return self.state.finished_at_ms is not None

    @property
    def finished_at(self) -> datetime | None:
        return from_ms(self.state.finished_at_ms)

    @property
    def cancelled(self) -> bool:
        return self.state.cancelled

    @property
    def callback_id(self) -> str:
        return self.state.callback_id

    @property
    def cancellable(self) -> bool:
        """Whether cancelling could still stop something: a member or the callback."""
        if not self.exists:
            return False
        return not self.finished or (self.callback is not None and self.callback.status == "READY")


@dataclass
class GroupDetail:
    """The group page: the group, its members counted by status, a page of them."""

    group: GroupRow
    statuses: list[tuple[str, int]]
    counted: int  # members whose status was read: all, up to MEMBER_COUNT_LIMIT
    members: Page[JobRow]

    @property
    def exists(self) -> bool:
        return self.group.exists

    @property
    def partly_counted(self) -> bool:
        return self.counted < self.members.total


@dataclass(frozen=True)
class WorkerRun:
    """How one worker ran a broadcast message: RUNNING, SUCCESSFUL or FAILED, when."""

    worker: str
    status: str
    at: datetime | None


@dataclass
class BroadcastRow:
    """A broadcast message as the dashboard lists it, read leniently: an envelope that
    does not parse leaves ``envelope`` None and says why in ``problem``."""

    number: str
    score: float  # its send time in the index of messages (ms)
    fields: Mapping[str, str]
    envelope: Envelope | None
    problem: str = ""

    @classmethod
    def build(
        cls, number: str, score: float, fields: Mapping[str, str] | None, max_bytes: int
    ) -> BroadcastRow:
        fields = fields or {}
        try:
            envelope: Envelope | None = Envelope.loads(fields.get("payload", ""), max_bytes)
            problem = ""
        except InvalidPayload as exc:
            envelope, problem = None, str(exc)
        return cls(number, score, fields, envelope, problem)

    @property
    def exists(self) -> bool:
        return bool(self.fields)

    @property
    def sent_at(self) -> datetime | None:
        return from_ms(self.fields.get("sent_at")) or from_ms(self.score)

    @property
    def queue(self) -> str:
        """The queue whose workers run it; '' for every worker."""
        return self.fields.get("queue", "")

    @property
    def task(self) -> str:
        return printable(self.envelope.task_path) if self.envelope else "?"

    @property
    def arguments(self) -> str:
        return describe_arguments(self.envelope) if self.envelope else printable(self.problem)

    @property
    def runs(self) -> list[WorkerRun]:
        """Each worker that took the message, by name: its outcome ("STATUS ms")."""
        runs = []
        for name, value in self.fields.items():
            if name.startswith(RAN_PREFIX):
                status, _, at = value.partition(" ")
                runs.append(
                    WorkerRun(printable(name[len(RAN_PREFIX) :]), printable(status), from_ms(at))
                )
        return sorted(runs, key=lambda run: run.worker)


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

    def _page(
        self,
        key: str,
        number: int,
        build: Callable[[list[tuple[str, float]]], list[Row]],
        *,
        newest_first: bool = False,
    ) -> Page[Row]:
        """Page ``number`` of the sorted set ``key``, its members made rows by ``build``."""
        total = self.broker.size(key)
        page: Page[Row] = Page(number=page_number(number, total), total=total)
        page.rows = build(self.broker.page(key, page.offset, page.size, newest_first=newest_first))
        return page

    def waiting(self, queue: str, number: int) -> Page[JobRow]:
        """READY jobs of a queue, in the order they will run."""
        return self._page(self.keys.queue(queue), number, self._rows)

    def delayed(self, queue: str, number: int) -> Page[JobRow]:
        """READY jobs of a queue that are not due yet, the first due first."""
        return self._page(self.keys.delayed(queue), number, self._rows)

    def failed(self, queue: str, number: int) -> Page[JobRow]:
        """FAILED jobs of a queue, the latest first."""
        return self._page(self.keys.failed(queue), number, self._rows, newest_first=True)

    def groups(self, number: int) -> Page[GroupRow]:
        """Groups, the latest created first."""
        return self._page(self.keys.groups, number, self._group_rows, newest_first=True)

    def _group_rows(self, scored: list[tuple[str, float]]) -> list[GroupRow]:
        # A read per group: the broker reads one group hash at a time.
        rows = []
        for group_id, score in scored:
            state = self.broker.group(group_id)
            rows.append(
                GroupRow(group_id, score, state) if state else GroupRow.expired(group_id, score)
            )
        return self._with_callbacks(rows)

    def _with_callbacks(self, rows: list[GroupRow]) -> list[GroupRow]:
        """``rows`` with their callback jobs' statuses, read in one round trip."""
        ids = [row.callback_id for row in rows if row.callback_id]
        callbacks = {job.id: job for job in self._rows([(i, 0.0) for i in ids], MEMBER_FIELDS)}
        for row in rows:
            row.callback = callbacks.get(row.callback_id)
        return rows

    def group(self, group_id: str, number: int) -> GroupDetail:
        """A group, its members counted by status and page ``number`` of them."""
        state = self.broker.group(group_id)
        if state is None:
            return GroupDetail(GroupRow.expired(group_id), [], 0, Page(number=1, total=0))
        row = self._with_callbacks([GroupRow(group_id, state.created_at_ms, state)])[0]
        members: Page[JobRow] = Page(number=page_number(number, state.size), total=state.size)
        ids = self.broker.group_members(group_id, members.offset, members.size)
        members.rows = self._rows([(job_id, 0.0) for job_id in ids], MEMBER_FIELDS)
        statuses, counted = self._member_statuses(group_id, state.size)
        return GroupDetail(row, statuses, counted, members)

    def _member_statuses(self, group_id: str, size: int) -> tuple[list[tuple[str, int]], int]:
        """How many of the group's first MEMBER_COUNT_LIMIT members are in each status
        (in the order jobs move through them), and how many were read."""
        counts: Counter[str] = Counter()
        limit = min(size, MEMBER_COUNT_LIMIT)
        for start in range(0, limit, MEMBER_READ_BATCH):
            ids = self.broker.group_members(group_id, start, min(MEMBER_READ_BATCH, limit - start))
            counts.update(status_label(fields) for fields in self.broker.jobs(ids, *STATUS_FIELDS))
        order = {status: i for i, status in enumerate(STATUSES)}
        ranked = sorted(
            counts.items(),
            key=lambda item: (order.get(item[0].partition(" ")[0], len(order)), item[0]),
        )
        return ranked, sum(counts.values())

    def broadcasts(self, number: int) -> Page[BroadcastRow]:
        """Broadcast messages, the latest sent first."""
        return self._page(
            self.keys.broadcast_sent, number, self._broadcast_rows, newest_first=True
        )

    def _broadcast_rows(self, scored: list[tuple[str, float]]) -> list[BroadcastRow]:
        # A read per message: the broker reads one hash at a time.
        max_bytes = self.backend.config.max_payload_bytes
        return [
            BroadcastRow.build(
                number, score, self.broker.get_hash(self.keys.broadcast_message(number)), max_bytes
            )
            for number, score in scored
        ]

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
