"""The one class that speaks to Redis: every command this app sends goes through here.

The rest of the code speaks verbs (``enqueue``, ``claim``, ``finish``,
``wait_for_work``, ``heartbeat``, ``watch``); the keys come from ``keys.py`` and
the atomic steps are the Lua scripts in ``lua/``, loaded once per client and called
by SHA. ``docs/protocol.md`` explains the delivery protocol.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .keys import KeySchema

SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"
RETRY = "RETRY"  # an outcome only: the job goes back to the delayed set, READY
RELEASE = "RELEASE"  # an outcome only: given back unfinished to its queue, READY

# Seconds a worker's record outlives its last heartbeat.
WORKER_TTL = 60

# What a lost or refused connection to Redis raises.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def _load_scripts(client: redis.Redis) -> dict[str, Any]:
    """Every script in lua/, with common.lua prepended, registered on the client (they
    are called by SHA, and loaded again if Redis has forgotten them)."""
    lua = resources.files(__package__) / "lua"
    common = (lua / "common.lua").read_text()
    return {
        file.name.removesuffix(".lua"): client.register_script(common + file.read_text())
        for file in lua.iterdir()
        if file.name.endswith(".lua") and file.name != "common.lua"
    }


def now_ms() -> int:
    return int(time.time() * 1000)


def text(value: bytes | str | None) -> str | None:
    """Decode a reply whether or not the client decodes responses itself."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job taken by a worker: it owns it until it finishes or the lease runs out."""

    job_id: str
    payload: bytes
    attempts: int  # claims so far, this one included
    owner: str  # the fencing token: only this owner may finish the job
    worker_ids: list[str]
    lost: int  # how many of the earlier attempts ended with their worker lost


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended, as the worker hands it back to finish it."""

    job_id: str
    owner: str
    status: str  # SUCCESSFUL, FAILED, RETRY or RELEASE
    result: str = ""  # JSON return value
    error: str = ""  # JSON {"exception_class_path": ..., "traceback": ...}
    retry_at: int = 0  # ms, for RETRY

    def as_args(self) -> list[Any]:
        return [self.job_id, self.owner, self.status, self.result, self.error, self.retry_at]


@dataclass(frozen=True, slots=True)
class Tick:
    """What one scheduler step did, and when the next step is due."""

    promoted: int
    recovered: int
    failed: int
    next_at: int | None  # ms; None when nothing is delayed or running; 0 to go again


class Reconnector:
    """Backoff for a loop that must outlive Redis restarts: call ``failed(exc)`` when a
    command could not reach Redis (it sleeps), ``succeeded()`` after one that did."""

    def __init__(self, logger: logging.Logger, who: str) -> None:
        self.logger = logger
        self.who = who
        self.failures = 0

    def failed(self, exc: Exception) -> None:
        delay = min(0.1 * 2**self.failures, 5.0) * random.uniform(0.5, 1.0)
        self.failures += 1
        self.logger.warning(
            "%s: Redis unreachable (%s); retry %d in %.2f s", self.who, exc, self.failures, delay
        )
        time.sleep(delay)

    def succeeded(self) -> None:
        if self.failures:
            self.logger.warning(
                "%s: Redis reachable again after %d retries", self.who, self.failures
            )
            self.failures = 0


class Broker:
    """Queues, leases and results of one backend in one Redis database."""

    def __init__(
        self, client: redis.Redis, keys: KeySchema, *, lease: float, result_ttl: int
    ) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = int(lease * 1000)
        self.result_ttl = result_ttl
        self._scripts = _load_scripts(client)

    def _run(self, script: str, *args: Any) -> Any:
        return self._scripts[script](keys=self.keys.script_keys, args=args)

    # Producers

    def enqueue(
        self, job_id: str, queue: str, priority: int, payload: str, due_ms: int = 0
    ) -> bool:
        """Store a job, ready now or (``due_ms`` > 0) in the delayed set until then.

        Returns False, changing nothing, if the id is taken.
        """
        return bool(self._run("enqueue", job_id, payload, queue, priority, due_ms))

    def cancel(self, job_id: str, error: str) -> str | None:
        """Cancel a READY job; return "CANCELLED", or the status that prevents it."""
        return text(self._run("cancel", job_id, now_ms(), self.result_ttl, error)) or None

    # Workers

    def claim(
        self,
        queues: Sequence[str],
        worker_id: str,
        finish: Sequence[Outcome] = (),
        count: int = 1,
        *,
        starting: Claimed | None = None,
        client: redis.Redis | None = None,
    ) -> tuple[list[bool], list[Claimed]]:
        """Store the outcomes in ``finish``, then claim up to ``count`` jobs from the
        first non-empty queue of ``queues``.

        Returns, per outcome, whether it was stored (False: the caller no longer owned
        the job), and the jobs claimed (none when every queue is empty).
        """
        args = self._claim_args(queues, worker_id, finish, count, starting)
        stored, claimed = self._scripts["claim"](
            keys=self.keys.script_keys, args=args, client=client or self.client
        )
        return [bool(flag) for flag in stored], [
            Claimed(
                job_id=text(job_id) or "",
                payload=payload,
                attempts=int(attempts),
                owner=text(owner) or "",
                worker_ids=(text(workers) or "").split(","),
                lost=int(lost),
            )
            for job_id, payload, attempts, owner, workers, lost in claimed
        ]

    def _claim_args(
        self,
        queues: Sequence[str],
        worker_id: str,
        finish: Sequence[Outcome],
        count: int,
        starting: Claimed | None = None,
    ) -> list[Any]:
        args: list[Any] = [now_ms(), self.lease_ms, worker_id, self.result_ttl]
        args += [len(finish), count]
        args += [starting.job_id, starting.owner] if starting else ["", ""]
        for outcome in finish:
            args += outcome.as_args()
        return args + list(queues)

    def session(self) -> WorkerSession:
        """A connection of its own for one worker loop; see WorkerSession."""
        return WorkerSession(self)

    def finish(self, outcome: Outcome) -> bool:
        """Store a job's outcome; False if the caller no longer owns the job."""
        return self.claim((), "", [outcome], count=0)[0][0]

    def wait_for_work(
        self, queues: Sequence[str], timeout: float, *, client: redis.Redis | None = None
    ) -> bool:
        """Block until a wake-up token arrives for one of ``queues``, or the timeout."""
        client = client or self.client
        return client.blpop([self.keys.wake(q) for q in queues], timeout) is not None

    def heartbeat(
        self, worker_id: str, info: Mapping[str, str | int], owned: Mapping[str, str]
    ) -> list[str]:
        """Record the worker as alive (for the dashboard) and extend the leases of the
        jobs it still owns; return the ids it no longer owns."""
        now = now_ms()
        args: list[Any] = [now, now + self.lease_ms, worker_id, WORKER_TTL, len(info)]
        for name, value in info.items():
            args += [name, value]
        for job_id, owner in owned.items():
            args += [job_id, owner]
        return [text(job_id) or "" for job_id in self._run("heartbeat", *args)]

    # Schedulers

    def tick(self, scheduler_id: str, *, batch: int, lost_limit: int, lost_error: str) -> Tick:
        """Promote due delayed jobs and recover jobs whose lease has passed."""
        promoted, recovered, failed, next_at = self._run(
            "tick", now_ms(), batch, lost_limit, self.result_ttl, lost_error, scheduler_id
        )
        next_at = int(next_at)
        return Tick(int(promoted), int(recovered), int(failed), None if next_at < 0 else next_at)

    def wait_for_schedule(self, timeout: float) -> bool:
        """Block until a job becomes the first due, or the timeout (~0.1 s precise)."""
        return self.client.blpop([self.keys.scheduler_wake], timeout) is not None

    # Results

    def get_job(self, job_id: str) -> dict[str, str] | None:
        """Return the stored fields of a job, or None if it does not exist (or expired)."""
        fields = self.client.hgetall(self.keys.job(job_id))
        if not fields:
            return None
        return {text(k) or "": text(v) or "" for k, v in fields.items()}

    def watch(self, job_id: str) -> str | None:
        """Ask to be woken when the job finishes; return its status (None: no such job)."""
        return text(self._run("watch", job_id)) or None

    def wait_finished(self, job_id: str, timeout: float) -> bool:
        """Block until a watched job finishes; True if it did within ``timeout``.

        BLMOVE from the list to itself leaves the token in place for other waiters.
        """
        done = self.keys.done(job_id)
        return self.client.blmove(done, done, timeout, "LEFT", "RIGHT") is not None

    # Liveness, for the dashboard

    def unregister_worker(self, worker_id: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.keys.workers, worker_id)
        pipe.delete(self.keys.worker(worker_id))
        pipe.execute()

    # Operators

    def operate(self, action: str, queue: str, job_ids: Sequence[str] = (), limit: int = 0) -> int:
        """Apply a dashboard action (see lua/operate.lua); return how many it changed."""
        return int(self._run("operate", action, queue, limit or len(job_ids), *job_ids))

    # Inspection: bounded reads only (no KEYS, no scans, pages of a known size)

    def counts(self, queues: Sequence[str]) -> dict[str, dict[str, int | bool]]:
        """Ready, delayed and failed jobs per queue, and whether it is paused."""
        failed_since = now_ms() - self.result_ttl * 1000
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.zcard(self.keys.queue(queue))
            pipe.zcount(self.keys.failed(queue), failed_since, "+inf")
        pipe.hmget(self.keys.delayed_counts, list(queues))
        pipe.smembers(self.keys.paused)
        *per_queue, delayed, paused = pipe.execute()
        paused_names = {text(name) for name in paused}
        return {
            queue: {
                "ready": int(per_queue[2 * i]),
                "failed": int(per_queue[2 * i + 1]),
                "delayed": int(delayed[i] or 0),
                "paused": queue in paused_names,
            }
            for i, queue in enumerate(queues)
        }

    def jobs(self, job_ids: Sequence[str], *fields: str) -> list[dict[str, str]]:
        """The given fields of each job, in one round trip ({} for a job gone)."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(self.keys.job(job_id), list(fields))
        return [
            {f: text(v) or "" for f, v in zip(fields, values, strict=True) if v is not None}
            for values in pipe.execute()
        ]

    def page(
        self, key: str, offset: int, limit: int, *, newest_first: bool = False
    ) -> list[tuple[str, float]]:
        """A page of a sorted set (a queue, the delayed or running set, a failed
        index): ids with their scores."""
        rows = self.client.zrange(
            key, offset, offset + limit - 1, desc=newest_first, withscores=True
        )
        return [(text(member) or "", score) for member, score in rows]

    def size(self, key: str) -> int:
        return int(self.client.zcard(key))

    def finished_per_minute(self, minutes: int) -> list[tuple[int, dict[str, int]]]:
        """Jobs finished per minute over the last ``minutes``, oldest first."""
        this_minute = now_ms() // 60_000
        span = range(this_minute - minutes + 1, this_minute + 1)
        pipe = self.client.pipeline(transaction=False)
        for minute in span:
            pipe.hgetall(self.keys.stats(minute))
        return [
            (minute, {text(k) or "": int(v) for k, v in counts.items()})
            for minute, counts in zip(span, pipe.execute(), strict=True)
        ]

    def alive(self, key: str, limit: int = 200) -> list[tuple[str, float]]:
        """Workers or schedulers, most recently seen first, with their last-seen time."""
        return self.page(key, 0, limit, newest_first=True)

    def worker_info(self, worker_ids: Sequence[str]) -> list[dict[str, str]]:
        pipe = self.client.pipeline(transaction=False)
        for worker_id in worker_ids:
            pipe.hgetall(self.keys.worker(worker_id))
        return [{text(k) or "": text(v) or "" for k, v in info.items()} for info in pipe.execute()]

    # Inspection

    def queue_length(self, queue: str) -> int:
        return int(self.client.zcard(self.keys.queue(queue)))

    def delayed_count(self) -> int:
        return int(self.client.zcard(self.keys.delayed))

    def running_count(self) -> int:
        return int(self.client.zcard(self.keys.running))

    def ping(self, timeout: float) -> None:
        """PING Redis on a fresh connection that gives up after ``timeout`` seconds,
        without retries; raise what the connection raised."""
        pool = self.client.connection_pool
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
        finally:
            connection.disconnect()


class WorkerSession:
    """The connection of one worker loop, with outcomes written behind.

    A worker claims several short jobs per round trip. To still store each outcome as
    soon as its job ends (so a worker killed later re-runs at most the job in hand), it
    sends the finish at once and reads the reply later, before the next command that
    needs an answer: one connection, so Redis runs the commands in the order sent.
    Outcomes whose reply was not read when the connection broke are sent again with the
    next claim; the fencing token makes a repeat harmless (it is refused).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._client: redis.Redis | None = None
        self.unread: list[tuple[Outcome, Any]] = []  # sent, reply not read yet
        self.unsent: list[tuple[Outcome, Any]] = []  # to send with the next claim

    @property
    def client(self) -> redis.Redis:
        """The session's own connection, made on first use (Redis may be down at start)."""
        if self._client is None:
            self._client = redis.Redis(
                connection_pool=self.broker.client.connection_pool,
                single_connection_client=True,
            )
        return self._client

    def finish_soon(
        self, outcome: Outcome, tag: Any = None, starting: Claimed | None = None
    ) -> None:
        """Send a job's outcome now, and mark the next job (``starting``) as started;
        the reply is read by the next ``claim``."""
        if self.unsent:
            self.unsent.append((outcome, tag))
            return
        script = self.broker._scripts["claim"]
        keys = self.broker.keys.script_keys
        args = self.broker._claim_args((), "", [outcome], 0, starting)
        try:
            connection = self.client.connection
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except CONNECTION_ERRORS:
            self.reset()
            self.unsent.append((outcome, tag))
            return
        self.unread.append((outcome, tag))

    def claim(
        self, queues: Sequence[str], worker_id: str, count: int
    ) -> tuple[list[tuple[Outcome, Any, bool]], list[Claimed]]:
        """Read what finish_soon sent, send what it could not, and claim up to ``count``
        jobs. Returns each outcome now settled with its tag and whether it was stored,
        and the jobs claimed."""
        settled = self._read_unread()
        pending = self.unsent
        try:
            stored, claimed = self.broker.claim(
                queues, worker_id, [o for o, _ in pending], count, client=self.client
            )
        except CONNECTION_ERRORS:
            self.reset()
            raise
        self.unsent = []
        settled += [(o, tag, flag) for (o, tag), flag in zip(pending, stored, strict=True)]
        return settled, claimed

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        try:
            return self.broker.wait_for_work(queues, timeout, client=self.client)
        except CONNECTION_ERRORS:
            self.reset()
            raise

    def _read_unread(self) -> list[tuple[Outcome, Any, bool]]:
        settled = []
        while self.unread:
            outcome, tag = self.unread[0]
            try:
                stored, _ = self.client.connection.read_response()
            except redis.exceptions.NoScriptError:
                # Redis restarted and forgot the script: send it again with the claim.
                self.unread.pop(0)
                self.unsent.append((outcome, tag))
                continue
            except CONNECTION_ERRORS:
                self.reset()
                raise
            self.unread.pop(0)
            settled.append((outcome, tag, bool(stored[0])))
        return settled

    def reset(self) -> None:
        """Drop the connection; outcomes without a reply go out again with the next claim."""
        if self._client is not None and self._client.connection is not None:
            self._client.connection.disconnect()
        self.unsent = self.unread + self.unsent
        self.unread = []
