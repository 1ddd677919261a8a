"""The one class that speaks to Redis: every command this app sends goes through here.

The rest of the code speaks verbs (``enqueue``, ``claim``, ``finish``,
``wait_for_work``, ``extend_leases``, ``watch``); the keys come from ``keys.py`` and
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

# What a lost or refused connection to Redis raises.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def _load_script(client: redis.Redis, name: str) -> Any:
    lua = resources.files(__package__) / "lua"
    common = (lua / "common.lua").read_text()
    return client.register_script(common + (lua / f"{name}.lua").read_text())


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

    def as_args(self, result_ttl: int) -> list[Any]:
        return [
            self.job_id,
            self.owner,
            self.status,
            self.result,
            self.error,
            result_ttl,
            self.retry_at,
        ]


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
        self._scripts = {
            name: _load_script(client, name)
            for name in ("enqueue", "claim", "finish", "extend_leases", "watch", "tick", "cancel")
        }

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
        self, queues: Sequence[str], worker_id: str, finish: Outcome | None = None
    ) -> tuple[bool | None, Claimed | None]:
        """Finish ``finish`` (if given) and claim the next job from ``queues``, in order.

        Returns whether the finish was stored (None if none was asked) and the claimed
        job, or None when every queue is empty.
        """
        if finish:
            outcome = finish.as_args(self.result_ttl)
        else:
            outcome = ["", "", "", "", "", self.result_ttl, 0]
        reply = self._run("claim", now_ms(), self.lease_ms, worker_id, *outcome, *queues)
        finished = None if reply[0] == -1 else bool(reply[0])
        if len(reply) == 1:
            return finished, None
        _, job_id, payload, attempts, owner, workers, lost = reply
        claimed = Claimed(
            job_id=text(job_id) or "",
            payload=payload,
            attempts=int(attempts),
            owner=text(owner) or "",
            worker_ids=(text(workers) or "").split(","),
            lost=int(lost),
        )
        return finished, claimed

    def finish(self, outcome: Outcome) -> bool:
        """Store a job's outcome; False if the caller no longer owns the job."""
        return bool(self._run("finish", now_ms(), *outcome.as_args(self.result_ttl)))

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a wake-up token arrives for one of ``queues``, or the timeout."""
        return self.client.blpop([self.keys.wake(q) for q in queues], timeout) is not None

    def extend_leases(self, owned: Mapping[str, str]) -> list[str]:
        """Extend the leases of the jobs still owned; return the ids no longer owned."""
        if not owned:
            return []
        args: list[Any] = [now_ms() + self.lease_ms]
        for job_id, owner in owned.items():
            args += [job_id, owner]
        return [text(job_id) or "" for job_id in self._run("extend_leases", *args)]

    # Schedulers

    def tick(self, *, batch: int, lost_limit: int, lost_error: str) -> Tick:
        """Promote due delayed jobs and recover jobs whose lease has passed."""
        promoted, recovered, failed, next_at = self._run(
            "tick", now_ms(), batch, lost_limit, self.result_ttl, lost_error
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
