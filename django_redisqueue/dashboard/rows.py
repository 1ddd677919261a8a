"""What a dashboard page shows of each thing it lists (a job, a group, a broadcast
message), read leniently from whatever Redis holds, and the pages they come in.
``reads.py`` reads them; the templates show them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from django.utils import translation
from django.utils.html import avoid_wrapping
from django.utils.timesince import timesince, timeuntil

from django_redisqueue.core.fanout import GroupState
from django_redisqueue.core.jobs import (
    JOB_ID_RE,
    MAX_TIMESTAMP,
    Envelope,
    JobRecord,
    from_json,
    from_ms,
    owner_worker,
    to_json,
    whole_number,
)
from django_redisqueue.core.progress import JobProgress
from django_redisqueue.core.schedules import Schedule
from django_redisqueue.exceptions import InvalidPayload
from django_redisqueue.store.wire import AFTER_GROUP_PREFIX

PAGE_SIZE = 50
PREVIEW_CHARS = 80
# Queues a page names outside the overview's list (the menu, a worker's queues).
MENU_QUEUES = 10
RAN_PREFIX = "ran:"  # of a broadcast message's fields saying how a worker ran it

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


def relative(moment: datetime, now: datetime) -> str:
    """How long ago ``moment`` was, or how long until it comes, as people say it: "just
    now", "3 seconds ago", "in 59 minutes", "2 days, 3 hours ago". In English, as the rest of
    the dashboard is."""
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 1:
        return "now" if seconds >= 0 else "just now"
    if abs(seconds) < 60:
        count = int(abs(seconds))
        span = avoid_wrapping(f"{count} second{'s' if count != 1 else ''}")
    else:
        with translation.override("en"):
            span = timeuntil(moment, now) if seconds > 0 else timesince(moment, now)
    return f"in {span}" if seconds > 0 else f"{span} ago"


def is_path(value: str, most: int = 300) -> bool:
    """Whether ``value`` is a dotted Python path (a task's, an exception class's)."""
    return 0 < len(value) <= most and all(part.isidentifier() for part in value.split("."))


def status_label(fields: Mapping[str, str]) -> str:
    """A job's status as the dashboard shows it: "expired" for a record gone, and
    whether a READY job waits for another or a FAILED one was cancelled."""
    if not fields:
        return "expired"
    status = printable(fields.get("status", ""))
    if fields.get("waiting"):
        return f"{status} (waiting)"
    if fields.get("parked") and status == "READY":
        return f"{status} (parked)"
    if fields.get("cancelled"):
        return f"{status} (cancelled)"
    return status


@dataclass
class JobRow:
    """One job as the dashboard lists it: its record (read leniently, whatever Redis
    holds) and its score in the set it was listed from."""

    record: JobRecord
    score: float = 0.0
    in_outbox: bool = False  # committed, waiting for the relay to Redis (outbox.py)

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
    def selectable(self) -> bool:
        """Whether it can be picked for an action on several jobs: ids of other shapes
        (which Redis may hold all the same) have their own buttons only."""
        return bool(JOB_ID_RE.fullmatch(self.id))

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
    def parked(self) -> bool:
        """READY but held over its limit until a slot or a start frees."""
        return bool(self.fields.get("parked")) and self.fields.get("status") == "READY"

    @property
    def unique_key(self) -> str:
        """The unique key it holds until it ends ('' if none)."""
        return printable(self.fields.get("unique", ""))

    @property
    def limits(self) -> str:
        """Its limits in words: "partner:7: at most 2 running, 100 starts per 60 s"."""
        key = self.fields.get("limit")
        if not key:
            return ""
        parts = []
        if running := whole_number(self.fields.get("max_running")):
            parts.append(f"at most {running} running")
        starts, _, per_ms = self.fields.get("rate", "").partition("/")
        if (rate := whole_number(starts)) and (per := whole_number(per_ms)):
            parts.append(f"{rate} starts per {per / 1000:g} s")
        return printable(f"{key}: {', '.join(parts) or 'no limit readable'}")

    @property
    def attempts(self) -> int:
        return self.record.attempts

    @property
    def progress(self) -> JobProgress | None:
        return self.record.progress

    @property
    def enqueued_at(self) -> datetime | None:
        return self.record.enqueued_at

    @property
    def score_time(self) -> datetime | None:
        """The score as a time: due time, lease deadline or finish time."""
        return from_ms(self.score)

    @property
    def started_at(self) -> datetime | None:
        return self.record.last_attempted_at

    @property
    def finished_at(self) -> datetime | None:
        return self.record.finished_at

    @property
    def worker(self) -> str:
        return owner_worker(self.record.owner)

    @property
    def errors(self) -> list[dict[str, str]]:
        return [{k: printable(v) for k, v in error.items()} for error in self.record.errors]

    @property
    def exception_class(self) -> str:
        """The class path of its last error ('' if none)."""
        errors = self.errors
        return errors[-1]["exception_class_path"] if errors else ""

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

    @property
    def last_index(self) -> int:
        return self.offset + len(self.rows)


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
    counted: int  # members whose status was read: all, or the first many of a large group
    members: Page[JobRow]
    progress: JobProgress | None = None  # the counted members' progress, summed

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


@dataclass
class LimitRow:
    """A limit key holding jobs back, as the overview lists it."""

    key: str
    running: int
    parked: int
    next_look: datetime | None

    @property
    def name(self) -> str:
        return printable(self.key)


@dataclass
class ScheduleRow:
    """A periodic schedule as the dashboard lists it: its definition in settings (None
    for one left in Redis by settings of before, until a scheduler's sync deletes it),
    its state in Redis (read leniently: {} for none), and its last job."""

    name: str
    schedule: Schedule | None
    state: Mapping[str, str]
    last_job: JobRow | None = None
    now_ms: int = 0

    @property
    def declared(self) -> bool:
        return self.schedule is not None

    @property
    def registered(self) -> bool:
        """Whether a scheduler has registered it (it keeps its state in Redis)."""
        return bool(self.state)

    def _spec(self) -> dict[str, object]:
        try:
            spec = from_json(self.state.get("spec", ""))
        except (ValueError, RecursionError):
            return {}
        return spec if isinstance(spec, dict) else {}

    @property
    def task(self) -> str:
        if self.schedule is not None:
            return self.schedule.task_path
        return printable(str(self._spec().get("task", "?")))

    @property
    def expression(self) -> str:
        if self.schedule is not None:
            return self.schedule.expression
        spec = self._spec()
        return printable(str(spec.get("cron") or f"every {spec.get('every', '?')}s"))

    @property
    def words(self) -> str:
        """When it runs, in words: "every 5 minutes", "At 03:00"."""
        if self.schedule is None:
            return ""
        if self.schedule.cron is not None:
            return cron_words(self.schedule.cron)
        return interval_words(self.schedule.every_ms or 1)

    @property
    def catch_up(self) -> str:
        return self.schedule.catch_up if self.schedule is not None else ""

    @property
    def paused(self) -> bool:
        return bool(self.state.get("paused"))

    @property
    def last_ms(self) -> int | None:
        return _ms(self.state.get("last"))

    @property
    def next_run(self) -> datetime | None:
        """The next occurrence: from the settings (after the last one, or now), else
        as Redis holds it."""
        if self.schedule is not None:
            try:
                return from_ms(self.schedule.next_after(max(self.now_ms, self.last_ms or 0)))
            except Exception:  # cronsim missing here, or a cron it refuses: say nothing
                return None
        return from_ms(_ms(self.state.get("next")))

    @property
    def last_run(self) -> datetime | None:
        """When its last job was stored (an occurrence's, or a "run now")."""
        return from_ms(_ms(self.state.get("last_at")))

    @property
    def last_job_id(self) -> str:
        return self.state.get("last_job", "")

    @property
    def outcome(self) -> str:
        """The status of the last job ("expired" once its record is gone)."""
        if not self.last_job_id or self.last_job is None:
            return ""
        return status_label(self.last_job.fields)

    @property
    def skipped(self) -> int:
        return _ms(self.state.get("skipped")) or 0


def _ms(value: str | None) -> int | None:
    """A whole number of ms read from Redis, or None for anything else."""
    try:
        number = int(value or "")
    except ValueError:
        return None
    return number if 0 <= number <= MAX_TIMESTAMP * 1000 else None


def interval_words(every_ms: int) -> str:
    """An interval in words: "every 30 seconds", "every 5 minutes", "every hour"."""
    for unit, ms in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if every_ms % ms == 0:
            count = every_ms // ms
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    seconds = every_ms / 1000
    if seconds == 1:
        return "every second"
    return f"every {seconds:g} seconds"


def cron_words(expression: str) -> str:
    """A cron expression in words (cron-descriptor: "At 03:00"), or the expression if
    it cannot."""
    try:
        from cron_descriptor import Options, get_description

        # English, 24-hour times: its default follows the process's locale, which
        # would make the words differ from one host (or process) to the next.
        options = Options(use_24hour_time_format=True, locale_code="en_US")
        return str(get_description(expression, options))
    except Exception:  # not installed, or an expression it does not read: show it as is
        return expression
