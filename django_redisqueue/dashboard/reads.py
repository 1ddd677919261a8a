"""What the admin dashboard shows, read from Redis with bounded reads and shaped for
the templates. Views live in ``admin.py``; every Redis command is a query of ``queries.py``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from django.utils.timezone import localtime

from django_redisqueue.backends import outbox
from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core.jobs import STATUSES, from_ms, whole_number
from django_redisqueue.core.progress import JobProgress, read_progress, summed
from django_redisqueue.dashboard.rows import (
    BroadcastRow,
    GroupDetail,
    GroupRow,
    JobRow,
    LimitRow,
    Page,
    Row,
    ScheduleRow,
    is_path,
    page_number,
    status_label,
)
from django_redisqueue.dashboard.workers import worker_rows
from django_redisqueue.runtime.periodic import schedules_of

# Workers and schedulers read for the overview, the heard from last first.
LIVE_READ_LIMIT = 200
CHART_MINUTES = 60
# Members of a group whose status the group page counts: a larger group's counts are
# of its first members only, so that a refresh never reads a huge group whole.
MEMBER_COUNT_LIMIT = 10_000
MEMBER_READ_BATCH = 1000

JOB_FIELDS = (
    "payload", "queue", "priority", "status", "attempts", "lost", "owner", "workers",
    "enqueued_at", "started_at", "last_attempted_at", "finished_at", "errors", "result",
    "cancelled", "group", "after", "waiting", "unique", "limit", "max_running", "rate", "parked",
    "progress",
)  # fmt: skip
# What the overview reads of each running job: no payloads, results or tracebacks.
RUNNING_FIELDS = ("queue", "owner", "status", "last_attempted_at")
# What it reads of a worker's jobs in hand that it shows: their tasks, no results.
IN_HAND_FIELDS = ("payload", "queue", "owner", "status", "attempts", "last_attempted_at")
# What the group pages read of a group's members and callback: no results or tracebacks.
MEMBER_FIELDS = ("payload", "queue", "status", "cancelled", "waiting", "parked")
STATUS_FIELDS = ("status", "cancelled", "waiting", "parked")
# The failed list's filters look at this many of a queue's newest failed jobs, read in
# batches: never a whole index of failures, however large it grew.
FILTER_SCAN_LIMIT = 500
FILTER_READ_BATCH = 100
# What the failed list shows of a job: no results.
FAILED_FIELDS = ("payload", "queue", "status", "attempts", "errors", "cancelled")
# A fair queue's page reads this many of its turns (one per fairness key and priority),
# the next to be served first, and shows the keys with the largest backlogs among them.
FAIR_TURNS_READ = 1000
FAIR_KEYS_SHOWN = 20


@dataclass
class FailedScan:
    """A queue's newest failed jobs as the failed list's filters see them: the tasks
    and exception classes seen (with how many jobs each, most first), and the jobs
    that match the filters given."""

    scanned: int  # failed jobs read: at most FILTER_SCAN_LIMIT
    total: int  # failed jobs in the queue's index
    tasks: list[tuple[str, int]] = field(default_factory=list)
    exceptions: list[tuple[str, int]] = field(default_factory=list)
    matching: list[JobRow] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Whether older failed jobs were left out."""
        return self.scanned < self.total


@dataclass
class FairKeys:
    """A fair queue's fairness keys with jobs waiting among its first FAIR_TURNS_READ
    turns: the FAIR_KEYS_SHOWN with the largest backlogs (entries, summed over the
    key's priorities), most first."""

    turns: int  # turns with jobs waiting, in all: the keys at each of their priorities
    keys: int  # keys with entries among the turns read
    rows: list[tuple[str, int]] = field(default_factory=list)
    read: int = FAIR_TURNS_READ

    @property
    def partial(self) -> bool:
        """Whether turns were left unread: then ``keys`` counts those of the turns read."""
        return self.turns > self.read

    @property
    def more(self) -> int:
        """Keys with entries among the turns read that are not shown."""
        return self.keys - len(self.rows)


def _most_first(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


class Dashboard:
    """The reads behind each page of one backend's dashboard."""

    def __init__(self, backend: RedisQueueBackend) -> None:
        self.backend = backend
        self.queries = backend.queries
        self.keys = backend.keys

    @cached_property
    def queues(self) -> list[str]:
        """The queues served, read once, when a page needs them."""
        return self.backend.served_queues()

    def queue_page(self, number: int, search: str = "") -> Page[str]:
        """Page ``number`` of the queues served, in their order; with ``search``, of
        those whose name holds it (in any case)."""
        needle = search.casefold()
        names = [name for name in self.queues if needle in name.casefold()]
        page: Page[str] = Page(number=page_number(number, len(names)), total=len(names))
        page.rows = names[page.offset : page.offset + page.size]
        return page

    def _rows(
        self, scored: Iterable[tuple[str, float]], fields: tuple[str, ...] = JOB_FIELDS
    ) -> list[JobRow]:
        scored = list(scored)
        infos = self.queries.jobs([job_id for job_id, _ in scored], *fields)
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
        total = self.queries.size(key)
        page: Page[Row] = Page(number=page_number(number, total), total=total)
        page.rows = build(
            self.queries.page(key, page.offset, page.size, newest_first=newest_first)
        )
        return page

    def waiting(self, queue: str, number: int) -> Page[JobRow]:
        """READY jobs of a queue, in the order they will run (a fair queue's, by priority
        and arrival: workers take them one fairness key at a time)."""
        return self._page(self.keys.queue(queue), number, self._rows)

    def delayed(self, queue: str, number: int) -> Page[JobRow]:
        """READY jobs of a queue that are not due yet, the first due first."""
        return self._page(self.keys.delayed(queue), number, self._rows)

    def failed(self, queue: str, number: int) -> Page[JobRow]:
        """FAILED jobs of a queue, the latest first."""
        return self._page(self.keys.failed(queue), number, self._rows, newest_first=True)

    def failed_scan(self, queue: str, task: str = "", exception: str = "") -> FailedScan:
        """The newest FILTER_SCAN_LIMIT failed jobs of a queue: the choices they offer,
        and those of ``task`` raising ``exception`` (either '' for any)."""
        key = self.keys.failed(queue)
        scored = self.queries.page(key, 0, FILTER_SCAN_LIMIT, newest_first=True)
        scan = FailedScan(scanned=len(scored), total=max(self.queries.size(key), len(scored)))
        tasks: Counter[str] = Counter()
        exceptions: Counter[str] = Counter()
        for start in range(0, len(scored), FILTER_READ_BATCH):
            for row in self._rows(scored[start : start + FILTER_READ_BATCH], FAILED_FIELDS):
                if is_path(row.task):
                    tasks[row.task] += 1
                if is_path(row.exception_class):
                    exceptions[row.exception_class] += 1
                if (not task or row.task == task) and (
                    not exception or row.exception_class == exception
                ):
                    scan.matching.append(row)
        scan.tasks, scan.exceptions = _most_first(tasks), _most_first(exceptions)
        return scan

    def fair_keys(self, queue: str) -> FairKeys:
        """The keys of a fair queue with the largest backlogs, among its first turns."""
        total, turns = self.queries.fair_turns(queue, FAIR_TURNS_READ)
        backlogs: Counter[str] = Counter()
        for turn in turns:
            if turn.entries:
                backlogs[turn.key] += turn.entries
        ranked = _most_first(backlogs)
        return FairKeys(turns=total, keys=len(ranked), rows=ranked[:FAIR_KEYS_SHOWN])

    def jobs(self, job_ids: Iterable[str]) -> list[JobRow]:
        """The given jobs, with what a list of them shows (no results, no errors)."""
        return self._rows([(job_id, 0.0) for job_id in job_ids], MEMBER_FIELDS)

    def groups(self, number: int) -> Page[GroupRow]:
        """Groups, the latest created first."""
        return self._page(self.keys.groups, number, self._group_rows, newest_first=True)

    def _group_rows(self, scored: list[tuple[str, float]]) -> list[GroupRow]:
        states = self.queries.groups([group_id for group_id, _ in scored])
        rows = [
            GroupRow(group_id, score, state) if state else GroupRow.expired(group_id, score)
            for (group_id, score), state in zip(scored, states, strict=True)
        ]
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
        state = self.queries.group(group_id)
        if state is None:
            return GroupDetail(GroupRow.expired(group_id), [], 0, Page(number=1, total=0))
        row = self._with_callbacks([GroupRow(group_id, state.created_at_ms, state)])[0]
        size = self.queries.group_size(group_id)  # what the list holds, not what it says
        members: Page[JobRow] = Page(number=page_number(number, size), total=size)
        ids = self.queries.group_members(group_id, members.offset, members.size)
        members.rows = self._rows([(job_id, 0.0) for job_id in ids], MEMBER_FIELDS)
        statuses, counted, progress = self._member_statuses(group_id, size)
        return GroupDetail(row, statuses, counted, members, progress)

    def _member_statuses(
        self, group_id: str, size: int
    ) -> tuple[list[tuple[str, int]], int, JobProgress | None]:
        """How many of the group's first MEMBER_COUNT_LIMIT members are in each status
        (in the order jobs move through them), how many were read, and the progress
        they reported, summed."""
        counts: Counter[str] = Counter()
        progresses: list[JobProgress | None] = []
        limit = min(size, MEMBER_COUNT_LIMIT)
        for start in range(0, limit, MEMBER_READ_BATCH):
            ids = self.queries.group_members(
                group_id, start, min(MEMBER_READ_BATCH, limit - start)
            )
            for fields in self.queries.jobs(ids, *STATUS_FIELDS, "progress", "attempts"):
                counts[status_label(fields)] += 1
                attempts = whole_number(fields.get("attempts"))
                progresses.append(read_progress(fields.get("progress"), attempts))
        order = {status: i for i, status in enumerate(STATUSES)}
        ranked = sorted(
            counts.items(),
            key=lambda item: (order.get(item[0].partition(" ")[0], len(order)), item[0]),
        )
        return ranked, sum(counts.values()), summed(progresses)

    def broadcasts(self, number: int) -> Page[BroadcastRow]:
        """Broadcast messages, the latest sent first."""
        return self._page(
            self.keys.broadcast_sent, number, self._broadcast_rows, newest_first=True
        )

    def _broadcast_rows(self, scored: list[tuple[str, float]]) -> list[BroadcastRow]:
        max_bytes = self.backend.config.max_payload_bytes
        messages = self.queries.hashes([self.keys.broadcast_message(n) for n, _ in scored])
        return [
            BroadcastRow.build(number, score, fields, max_bytes)
            for (number, score), fields in zip(scored, messages, strict=True)
        ]

    def schedules(self) -> list[ScheduleRow]:
        """The periodic schedules of the settings, in their order, then any other one
        Redis still holds (until a scheduler's sync deletes it), with their last jobs."""
        declared = {schedule.name: schedule for schedule in schedules_of(self.backend)}
        registered, states = self.queries.periodic_states(list(declared))
        left = [name for name in registered if name not in declared]
        if left:
            states += self.queries.periodic_states(left)[1]
        now = self.queries.clock_ms()
        rows = [
            ScheduleRow(name, declared.get(name), state, now_ms=now)
            for name, state in zip([*declared, *left], states, strict=True)
        ]
        jobs = {
            job.id: job
            for job in self._rows(
                [(r.last_job_id, 0.0) for r in rows if r.last_job_id], STATUS_FIELDS
            )
        }
        for row in rows:
            row.last_job = jobs.get(row.last_job_id)
        return rows

    def running(self, fields: tuple[str, ...] = JOB_FIELDS) -> list[JobRow]:
        return self._rows(self.queries.running(), fields)

    def job(self, job_id: str) -> JobRow:
        """The job, from Redis, or else from the outbox, where it waits for the relay."""
        row = self._rows([(job_id, 0.0)])[0]
        if not row.exists and (fields := self.backend.outboxed(job_id)) is not None:
            max_bytes = self.backend.config.max_payload_bytes
            return replace(JobRow.build(job_id, fields, 0.0, max_bytes), in_outbox=True)
        return row

    def overview(self, queues: Sequence[str] | None = None) -> dict[str, Any]:
        """What the overview shows, with the counts of ``queues`` (a page of them; by
        default every queue served). The totals of the ready, delayed and failed jobs
        are those of every queue or None: they would cost commands per queue. Running
        and finished jobs are read for all queues at once anyway."""
        every = queues is None
        counts = self.queries.counts(self.queues if queues is None else queues)
        running = self.running(RUNNING_FIELDS)
        minutes = self.queries.finished_per_minute(CHART_MINUTES)
        counts = {
            queue: replace(
                row,
                running=sum(1 for job in running if job.queue == queue),
                finished=sum(
                    stats.get(f"ok:{queue}", 0) + stats.get(f"failed:{queue}", 0)
                    for _, stats in minutes
                ),
            )
            for queue, row in counts.items()
        }
        now = self.queries.clock_ms()
        workers = worker_rows(
            self.queries.live_workers(now, LIVE_READ_LIMIT),
            running,
            now,
            lambda ids: self._rows([(job_id, 0.0) for job_id in ids], IN_HAND_FIELDS),
        )
        schedulers = [
            {"id": s.id, "seen_at": from_ms(s.seen_ms)}
            for s in self.queries.live_schedulers(now, LIVE_READ_LIMIT)
        ]
        drawn = chart(minutes)
        totals: dict[str, object] = {
            name: sum(getattr(row, name) for row in counts.values()) if every else None
            for name in ("ready", "running", "delayed", "failed", "finished")
        }
        if not every:
            totals.update(running=len(running), finished=drawn["total"])
        return {
            "counts": counts,
            "totals": totals,
            "every_queue": every,
            "running_jobs": len(running),
            "workers": workers,
            "slots": sum(worker.slots for worker in workers),
            "busy_slots": sum(worker.busy for worker in workers),
            "schedulers": schedulers,
            "chart": drawn,
            "limits": [
                LimitRow(limit.key, limit.running, limit.parked, from_ms(limit.next_look_ms))
                for limit in self.queries.limits()
            ],
            "outbox": self.outbox(),
        }

    def outbox(self) -> dict[str, Any] | None:
        """The jobs committed and waiting in the outbox for the relay, and how long the
        oldest has waited (s); None without an outbox. A database that cannot be read
        leaves ``jobs`` None and says why."""
        databases = self.backend.config.outbox
        if not databases:
            return None
        try:
            backlog = outbox.backlog(databases, self.backend.alias)
        except outbox.OUTBOX_ERRORS as exc:
            return {"jobs": None, "oldest_seconds": None, "error": str(exc)}
        return {"jobs": backlog.jobs, "oldest_seconds": round(backlog.age(), 3)}


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
