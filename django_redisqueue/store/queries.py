"""The read side: what the dashboard, the metrics and the health probe ask of Redis,
as bounded reads (no KEYS, no scans, pages of a known size). A key of another type,
spoilt by hand, reads as absent or empty (``gateway.readable``); nothing here writes."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry

from django_redisqueue.core.fanout import GroupState
from django_redisqueue.core.jobs import MAX_TIMESTAMP, QUEUE_NAME_RE, Envelope, whole_number
from django_redisqueue.exceptions import InvalidPayload
from django_redisqueue.store.connection import Client
from django_redisqueue.store.gateway import Gateway, read_leniently, readable, sync, text
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.wire import entry_fields

# Running jobs read at most by one look at them (overview, running page, metrics): far
# more than any fleet runs at once; past it, the counts per queue fall short.
RUNNING_READ_LIMIT = 10_000
# A worker or scheduler silent for longer than this is gone (dashboard, metrics, probe).
WORKER_ALIVE_MS = 30_000
# The most slots a worker's record is read as having: a value spoilt by hand cannot
# make a sum of them overflow a float (metrics) or a page say nonsense.
MOST_SLOTS = 1_000_000
SCHEDULER_ALIVE_MS = 15_000
# A fair queue's turn's priority, as the scripts write it (lua/lib/queues.lua).
TURN_PRIORITY_RE = re.compile(r"-?[0-9]{1,3}")


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A queue's jobs: ready, delayed and failed (within the result TTL) as Redis holds
    them, whether it is paused, and, where a caller read them too, its running jobs and
    those finished in the last hour."""

    ready: int
    delayed: int
    failed: int
    paused: bool
    running: int = 0
    finished: int = 0


@dataclass(frozen=True, slots=True)
class LimitState:
    """A limit key holding jobs back: its jobs running and parked, and when the
    scheduler looks at its parked jobs again (ms)."""

    key: str
    running: int
    parked: int
    next_look_ms: int


@dataclass(frozen=True, slots=True)
class FairTurn:
    """One turn of a fair queue: a fairness key's jobs at one priority, and the entries
    of its list (an upper bound of its jobs waiting: an entry of a job cancelled or
    moved since stays until its turn comes round)."""

    key: str
    priority: int
    entries: int


@dataclass(frozen=True, slots=True)
class Live:
    """A worker or scheduler heard from within its window: its id, when Redis last
    heard from it (ms, Redis's clock), and a worker's record."""

    id: str
    seen_ms: float
    info: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        # A worker's record names its host; ids are <host>:<pid>:<random> too.
        return self.info.get("host") or self.id.rsplit(":", 2)[0]

    @property
    def queues(self) -> list[str]:
        """The queues a worker's record says it serves ([] for every one)."""
        return [name for name in self.info.get("queues", "").split(",") if name]

    def serves(self, queue: str) -> bool:
        """Whether this worker serves ``queue``: one given no queue serves every one."""
        names = self.queues
        return not names or queue in names

    @property
    def slots(self) -> int:
        """The jobs a worker runs at once (``runworker --threads``), as its heartbeat
        records them: 1 for a record without them (an older worker's) or unreadable."""
        return min(whole_number(self.info.get("slots")), MOST_SLOTS) or 1

    def busy(self, in_hand: int) -> int:
        """Its busy slots, given the running jobs it owns (``in_hand``): at most its slots."""
        return min(in_hand, self.slots)


class Queries(Gateway):
    """Read-only queries over one backend's keys."""

    def __init__(self, client: Client, keys: KeySchema, *, result_ttl: int) -> None:
        super().__init__(client, keys)
        self.result_ttl = result_ttl

    def known_queues(self) -> list[str]:
        """The names of the queues jobs were enqueued to (kept when QUEUES is empty), in
        alphabetical order. Every reader of the set (workers, the scheduler, the
        dashboard, the metrics, the health probe) comes here: a member that breaks the
        queue-name rule (written by hand, by an older version, by a bug) is skipped, as
        its name could not be enqueued to, nor put in a URL or a key."""
        names = read_leniently(lambda: sync(self.client.smembers(self.keys.known_queues)))
        members = (text(member) or "" for member in names or ())
        return sorted(name for name in members if QUEUE_NAME_RE.fullmatch(name))

    def knows_queue(self, name: str) -> bool:
        """Whether ``name`` is one of ``known_queues()``, asked without reading them."""
        if not QUEUE_NAME_RE.fullmatch(name):
            return False
        key = self.keys.known_queues
        return bool(read_leniently(lambda: sync(self.client.sismember(key, name))))

    def get_job(self, job_id: str) -> dict[str, str] | None:
        """Return the stored fields of a job (its hash, or its entry if it is kept as
        one), or None if it does not exist (or expired, or its key is not a hash)."""
        return self.jobs([job_id])[0] or None

    def _job_reads(self, pipe: Pipeline, job_id: str, fields: Sequence[str]) -> None:
        """Queue the reads of a job's entry and of its fields (all: HGETALL), for
        ``_job_fields``: one round trip reads both forms. The entry first: a script may
        make it the job's hash between the two reads, never the other way, so a job
        read in neither form is gone."""
        pipe.hget(self.keys.entries(job_id), job_id)
        if fields:
            pipe.hmget(self.keys.job(job_id), list(fields))
        else:
            pipe.hgetall(self.keys.job(job_id))

    def _job_fields(self, replies: Any, fields: Sequence[str]) -> dict[str, str]:
        """A job's fields from the two replies ``_job_reads`` queued: its hash's, or
        its entry's when it has no hash ({} when it has neither)."""
        entry, stored = next(replies), next(replies)
        if isinstance(stored, dict):
            found = _strings(stored)
        elif isinstance(stored, list):
            found = {
                f: text(v) or "" for f, v in zip(fields, stored, strict=False) if v is not None
            }
        else:
            found = {}
        if not found:
            kept = entry_fields(text(entry))
            found = {f: kept[f] for f in fields or kept if f in kept} if kept else {}
        return found

    def get_hash(self, key: str) -> dict[str, str] | None:
        """Every field of a hash, or None if it does not exist (or is not a hash)."""
        return self.hashes([key])[0]

    def hashes(self, keys: Sequence[str]) -> list[dict[str, str] | None]:
        """Every field of each hash, in one round trip; None for a key that does not
        exist or is not a hash."""
        if not keys:
            return []
        pipe = self._pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return [_strings(fields) or None for fields in self._replies(pipe)]

    def group(self, group_id: str) -> GroupState | None:
        """A group's counts, or None if there is no such group (or it expired)."""
        return self.groups([group_id])[0]

    def groups(self, group_ids: Sequence[str]) -> list[GroupState | None]:
        """The counts of each group, in one round trip (None for one gone)."""
        keys = [self.keys.group(group_id) for group_id in group_ids]
        return [
            _group_state(group_id, fields)
            for group_id, fields in zip(group_ids, self.hashes(keys), strict=True)
        ]

    def group_members(self, group_id: str, offset: int = 0, limit: int = -1) -> list[str]:
        """Ids of a group's members, in the order given (a slice)."""
        end = -1 if limit < 0 else offset + limit - 1
        key = self.keys.group_members(group_id)
        members = read_leniently(lambda: sync(self.client.lrange(key, offset, end)))
        return [text(member) or "" for member in members or ()]

    def group_size(self, group_id: str) -> int:
        """How many member ids the group's list holds (0 if it is not a list)."""
        key = self.keys.group_members(group_id)
        return int(read_leniently(lambda: sync(self.client.llen(key))) or 0)

    def periodic_states(self, names: Sequence[str]) -> tuple[list[str], list[dict[str, str]]]:
        """The names registered in Redis, and the state of each of ``names`` ({} for
        none, or a key that is not a hash), in one round trip."""
        pipe = self._pipeline(transaction=False)
        pipe.smembers(self.keys.periodic)
        for name in names:
            pipe.hgetall(self.keys.periodic_schedule(name))
        registered, *states = self._replies(pipe)
        return sorted(text(n) or "" for n in registered or ()), [_strings(s) for s in states]

    def counts(self, queues: Sequence[str]) -> dict[str, QueueCounts]:
        """Ready, delayed and failed jobs per queue, and whether it is paused (a key of
        another type, spoilt by hand, reads as empty). Reads only what concerns
        ``queues``, however many other queues there are or are paused."""
        pipe = self._pipeline(transaction=False)
        pipe.time()
        for queue in queues:
            pipe.zcard(self.keys.queue(queue))
            pipe.zcard(self.keys.delayed(queue))
        if queues:
            pipe.smismember(self.keys.paused, list(queues))
        replies = self._replies(pipe)
        (seconds, _), *per_queue = replies
        paused = per_queue.pop() if queues else None
        failed_since = (int(seconds) - self.result_ttl) * 1000
        pipe = self._pipeline(transaction=False)
        for queue in queues:
            pipe.zcount(self.keys.failed(queue), failed_since, "+inf")
        failed = self._replies(pipe)
        return {
            queue: QueueCounts(
                ready=int(per_queue[2 * i] or 0),
                delayed=int(per_queue[2 * i + 1] or 0),
                failed=int(failed[i] or 0),
                paused=bool(paused and paused[i]),
            )
            for i, queue in enumerate(queues)
        }

    def jobs(self, job_ids: Sequence[str], *fields: str) -> list[dict[str, str]]:
        """The given fields (none: all) of each job, in one round trip ({} for a job
        gone, or a key that is not a hash)."""
        pipe = self._pipeline(transaction=False)
        for job_id in job_ids:
            self._job_reads(pipe, job_id, fields)
        replies = iter(self._replies(pipe))
        return [self._job_fields(replies, fields) for _ in job_ids]

    def page(
        self, key: str, offset: int, limit: int, *, newest_first: bool = False
    ) -> list[tuple[str, float]]:
        """A page of a sorted set (a queue, a delayed set, the running set, a failed
        index): ids with their scores."""
        rows: list[tuple[bytes | str, float]] = read_leniently(
            lambda: self.client.zrange(
                key, offset, offset + limit - 1, desc=newest_first, withscores=True
            )
        )
        return [(text(member) or "", score) for member, score in rows or ()]

    def size(self, key: str) -> int:
        """How many members a sorted set has (0 for a key of another type)."""
        return int(read_leniently(lambda: self.client.zcard(key)) or 0)

    def finished_per_minute(self, minutes: int) -> list[tuple[int, dict[str, int]]]:
        """Jobs finished per minute over the last ``minutes``, oldest first."""
        this_minute = self.clock_ms() // 60_000
        span = range(this_minute - minutes + 1, this_minute + 1)
        pipe = self._pipeline(transaction=False)
        for minute in span:
            pipe.hgetall(self.keys.stats(minute))
        return [
            (minute, _counts(counts))
            for minute, counts in zip(span, self._replies(pipe), strict=True)
        ]

    def metrics(self) -> dict[str, float]:
        """The metrics hash; fields that are not numbers are left out."""
        fields = read_leniently(lambda: sync(self.client.hgetall(self.keys.metrics)))
        counts = {}
        for name, value in (fields or {}).items():
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                counts[text(name) or ""] = number
        return counts

    def limits(self, most: int = 100) -> list[LimitState]:
        """The limit keys holding jobs back (those with a look due in ``{P}:limits``),
        soonest look first, with their running and parked jobs: two round trips."""
        looks = self.page(self.keys.limits, 0, most)
        pipe = self._pipeline(transaction=False)
        for key, _ in looks:
            pipe.scard(self.keys.limit(key, "running"))
            pipe.zcard(self.keys.limit(key, "parked"))
        counts = [int(count or 0) for count in self._replies(pipe)]
        return [
            LimitState(key, counts[2 * i], counts[2 * i + 1], int(at))
            for i, (key, at) in enumerate(looks)
        ]

    def fair_turns(self, queue: str, most: int) -> tuple[int, list[FairTurn]]:
        """How many turns a fair queue has with jobs waiting, and the first ``most`` of
        them to be served, with their entries: two round trips. A member that is no turn
        (``<priority>:<key>``, priority -100..100: written by hand) is skipped."""
        turns_key = self.keys.fair(queue)
        pipe = self._pipeline(transaction=False)
        pipe.zcard(turns_key)
        pipe.zrange(turns_key, 0, most - 1)
        total, members = self._replies(pipe)
        turns = [(member, turn) for member in members or () if (turn := _turn(member))]
        if not turns:
            return int(total or 0), []
        pipe = self._pipeline(transaction=False)
        for member, _ in turns:
            # The member as Redis holds it, bytes that need not be UTF-8.
            raw = member.encode() if isinstance(member, str) else member
            pipe.zcard(turns_key.encode() + b":" + raw)
        return int(total or 0), [
            FairTurn(key, priority, int(entries or 0))
            for (_, (priority, key)), entries in zip(turns, self._replies(pipe), strict=True)
        ]

    def alive(self, key: str, limit: int = 200) -> list[tuple[str, float]]:
        """Workers or schedulers, most recently seen first, with their last-seen time."""
        return self.page(key, 0, limit, newest_first=True)

    def live_workers(self, now_ms: int, limit: int) -> list[Live]:
        """The workers whose heartbeat is under WORKER_ALIVE_MS old and whose record has
        not expired, of the ``limit`` heard from last."""
        heard = self.alive(self.keys.workers, limit)
        seen = [(worker_id, at) for worker_id, at in heard if now_ms - at < WORKER_ALIVE_MS]
        infos = self.worker_info([worker_id for worker_id, _ in seen])
        return [Live(i, at, info) for (i, at), info in zip(seen, infos, strict=True) if info]

    def live_schedulers(
        self, now_ms: int, limit: int, *, within_ms: int = SCHEDULER_ALIVE_MS
    ) -> list[Live]:
        """The schedulers that stepped within ``within_ms`` (by default
        SCHEDULER_ALIVE_MS), of the ``limit`` last."""
        seen = self.alive(self.keys.schedulers, limit)
        return [Live(i, at) for i, at in seen if now_ms - at < within_ms]

    def worker_info(self, worker_ids: Sequence[str]) -> list[dict[str, str]]:
        pipe = self._pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.hgetall(self.keys.worker(worker_id))
        return [_strings(info) for info in self._replies(pipe)]

    def _replies(self, pipe: Pipeline) -> list[Any]:
        """A pipeline's replies read by the one lenient rule (``gateway.readable``): a
        key of another type reads as None; any other error (a lost connection, an ACL
        refusal, LOADING) is raised, never read as absent."""
        return [readable(reply) for reply in self._execute(pipe, raise_on_error=False)]

    def queue_length(self, queue: str) -> int:
        return self.size(self.keys.queue(queue))

    def delayed_count(self, queues: Sequence[str]) -> int:
        pipe = self._pipeline(transaction=False)
        for queue in queues:
            pipe.zcard(self.keys.delayed(queue))
        return sum(int(n or 0) for n in self._replies(pipe))

    def delayed_due_by(
        self, queues: Sequence[str], due_ms: int, limit: int
    ) -> dict[str, list[str]]:
        """Per queue, the ids of up to ``limit`` delayed jobs due at or before ``due_ms``
        (Redis's clock), the soonest first."""
        pipe = self._pipeline(transaction=False)
        for queue in queues:
            pipe.zrangebyscore(self.keys.delayed(queue), "-inf", due_ms, start=0, num=limit)
        return {
            queue: [text(member) or "" for member in ids or ()]
            for queue, ids in zip(queues, self._replies(pipe), strict=True)
        }

    def running(self) -> list[tuple[str, float]]:
        """The running jobs (ids and lease deadlines), up to RUNNING_READ_LIMIT: what the
        overview, the running page and the metrics count and show."""
        return self.page(self.keys.running, 0, RUNNING_READ_LIMIT)

    def running_count(self) -> int:
        return self.size(self.keys.running)

    def ping(self, timeout: float, *, write: bool = False) -> None:
        """PING Redis on a fresh connection that gives up after ``timeout`` seconds,
        without retries; raise what the connection raised. ``write``: then send a write
        that changes nothing, which Redis refuses as it would the heartbeats' when it
        is out of memory (OOM) or a read-only replica (READONLY). Redis refuses those
        before it runs a command, so WRONGTYPE (the key spoilt by hand) is no refusal."""
        pool = self._server().connection_pool
        kwargs = {
            **pool.connection_kwargs,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        connection = pool.connection_class(**kwargs)
        try:
            connection.connect()
            connection.send_command("PING")
            connection.read_response()
            if write:
                # XX adds no member and GT never lowers a score to -inf: a no-op on
                # whatever the set holds, refused or not as the heartbeat's ZADD is.
                connection.send_command("ZADD", self.keys.workers, "XX", "GT", "-inf", "")
                read_leniently(connection.read_response)
        finally:
            connection.disconnect()

    def head_waits(
        self, queues: Sequence[str], now_ms: int | None = None
    ) -> dict[str, float | None]:
        """For each queue, the seconds (by Redis's clock) its next job has waited since
        it could first run: since the latest of its enqueue, its ``run_after`` and the
        start of its last attempt. None for an empty queue; 0.0 for a job that records
        none of those times (fields holding garbage count as absent). Two round trips.
        ``now_ms``: Redis's clock as the caller read it (``clock_ms``, which a test can
        pin), else read here in the first round trip."""
        if not queues:
            return {}
        pipe = self._pipeline(transaction=False)
        if now_ms is None:
            pipe.time()
        for queue in queues:
            pipe.zrange(self.keys.queue(queue), 0, 0)
        heads = self._replies(pipe)
        if now_ms is None:
            clock = heads.pop(0)
            now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
        head_ids = {
            queue: text(members[0]) or ""
            for queue, members in zip(queues, heads, strict=True)
            if isinstance(members, list) and members
        }
        heads = self.jobs(list(head_ids.values()), "enqueued_at", "last_attempted_at", "payload")
        waits: dict[str, float | None] = dict.fromkeys(queues)
        for queue, values in zip(head_ids, heads, strict=True):
            enqueued, attempted = values.get("enqueued_at"), values.get("last_attempted_at")
            ready_ms = max(_ms(enqueued), _ms(attempted), _run_after_ms(values.get("payload")))
            waits[queue] = max(now_ms - ready_ms, 0) / 1000 if ready_ms else 0.0
        return waits


def _group_state(group_id: str, fields: dict[str, str] | None) -> GroupState | None:
    if fields is None:
        return None
    finished = _whole(fields.get("finished_at"))
    return GroupState(
        group_id=group_id,
        size=_whole(fields.get("size")) or 0,
        total=_whole(fields.get("total")),
        ended=_whole(fields.get("ended")) or 0,
        failed=_whole(fields.get("failed")) or 0,
        callback_id=fields.get("callback", ""),
        created_at_ms=_whole(fields.get("created_at")) or 0,
        finished_at_ms=finished or None,
        cancelled=bool(fields.get("cancelled")),
    )


def _turn(member: bytes | str) -> tuple[int, str] | None:
    """A fair queue's turn, ``<priority>:<key>``, as its priority and its fairness key
    (which may hold ':' too); None for a member that is none."""
    priority, colon, key = (text(member) or "").partition(":")
    if not (colon and TURN_PRIORITY_RE.fullmatch(priority)) or abs(int(priority)) > 100:
        return None
    return int(priority), key


def _whole(value: str | None) -> int | None:
    """A whole number read from Redis, or None for anything else."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _strings(fields: dict[Any, Any] | None) -> dict[str, str]:
    """A hash read (None: a key of another type) as a dict of strings."""
    return {text(k) or "": text(v) or "" for k, v in (fields or {}).items()}


def _counts(counts: dict[Any, Any] | None) -> dict[str, int]:
    """A stats hash as counts; fields that are not whole numbers are left out."""
    result = {}
    for key, value in (counts or {}).items():
        try:
            result[text(key) or ""] = int(value)
        except ValueError:
            continue
    return result


def _ms(value: str | None) -> int:
    """A time stored in ms since the epoch, or 0 for anything that is not one."""
    ms = _whole(value)
    return ms if ms is not None and 0 < ms <= MAX_TIMESTAMP * 1000 else 0


def _run_after_ms(payload: bytes | str | None) -> int:
    """A job envelope's ``run_after`` in ms, or 0 when it has none or is unreadable."""
    if not payload:
        return 0
    try:
        run_after = Envelope.loads(payload, len(payload)).run_after
    except InvalidPayload:
        return 0
    return int(run_after * 1000) if run_after else 0
