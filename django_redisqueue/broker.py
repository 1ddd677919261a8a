"""The one class that speaks to Redis: every command this app sends goes through here.

The rest of the code speaks verbs (``enqueue``, ``claim``, ``finish``,
``wait_for_work``, ``extend_leases``, ``watch``); the keys come from ``keys.py`` and
the atomic steps are the Lua scripts in ``lua/``, loaded once per client and called
by SHA. ``docs/protocol.md`` explains the delivery protocol.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

from .keys import KeySchema

SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"


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
    attempts: int
    owner: str
    worker_ids: list[str]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended, as the worker hands it back to finish it."""

    job_id: str
    owner: str
    status: str  # SUCCESSFUL or FAILED
    result: str = ""  # JSON return value
    error: str = ""  # JSON {"exception_class_path": ..., "traceback": ...}

    def as_args(self, result_ttl: int) -> list[Any]:
        return [self.job_id, self.owner, self.status, self.result, self.error, result_ttl]


class Broker:
    """Queues, leases and results of one backend in one Redis database."""

    def __init__(
        self, client: redis.Redis, keys: KeySchema, *, lease: float, result_ttl: int
    ) -> None:
        self.client = client
        self.keys = keys
        self.lease_ms = int(lease * 1000)
        self.result_ttl = result_ttl
        self._enqueue = _load_script(client, "enqueue")
        self._claim = _load_script(client, "claim")
        self._finish = _load_script(client, "finish")
        self._extend_leases = _load_script(client, "extend_leases")
        self._watch = _load_script(client, "watch")

    # Producers

    def enqueue(self, job_id: str, queue: str, priority: int, payload: str) -> bool:
        """Store a job and make it ready; False if the id is taken."""
        keys = self.keys
        stored = self._enqueue(
            keys=[keys.job(job_id), keys.queue(queue), keys.wake(queue), keys.seq],
            args=[job_id, payload, priority],
        )
        return bool(stored)

    # Workers

    def claim(
        self, queues: Sequence[str], worker_id: str, finish: Outcome | None = None
    ) -> tuple[bool | None, Claimed | None]:
        """Finish ``finish`` (if given) and claim the next job from ``queues``, in order.

        Returns whether the finish was stored (None if none was asked) and the claimed
        job, or None when every queue is empty.
        """
        keys = self.keys
        args: list[Any] = [now_ms(), self.lease_ms, worker_id]
        args += finish.as_args(self.result_ttl) if finish else ["", "", "", "", "", 0]
        reply = self._claim(
            keys=[
                keys.running,
                keys.job_prefix,
                *(keys.queue(q) for q in queues),
                *(keys.wake(q) for q in queues),
            ],
            args=args,
        )
        finished = None if reply[0] == -1 else bool(reply[0])
        if len(reply) == 1:
            return finished, None
        _, job_id, payload, attempts, owner, workers = reply
        claimed = Claimed(
            job_id=text(job_id) or "",
            payload=payload,
            attempts=int(attempts),
            owner=text(owner) or "",
            worker_ids=(text(workers) or "").split(","),
        )
        return finished, claimed

    def finish(self, outcome: Outcome) -> bool:
        """Store a job's outcome; False if the caller no longer owns the job."""
        stored = self._finish(
            keys=[self.keys.running, self.keys.job_prefix],
            args=[now_ms(), *outcome.as_args(self.result_ttl)],
        )
        return bool(stored)

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
        lost = self._extend_leases(keys=[self.keys.running, self.keys.job_prefix], args=args)
        return [text(job_id) or "" for job_id in lost]

    # Results

    def get_job(self, job_id: str) -> dict[str, str] | None:
        """Return the stored fields of a job, or None if it does not exist (or expired)."""
        fields = self.client.hgetall(self.keys.job(job_id))
        if not fields:
            return None
        return {text(k) or "": text(v) or "" for k, v in fields.items()}

    def watch(self, job_id: str) -> str | None:
        """Ask to be woken when the job finishes; return its status (None: no such job)."""
        return text(self._watch(keys=[self.keys.job(job_id)])) or None

    def wait_finished(self, job_id: str, timeout: float) -> bool:
        """Block until a watched job finishes; True if it did within ``timeout``.

        BLMOVE from the list to itself leaves the token in place for other waiters.
        """
        done = self.keys.done(job_id)
        return self.client.blmove(done, done, timeout, "LEFT", "RIGHT") is not None

    # Inspection

    def queue_length(self, queue: str) -> int:
        return int(self.client.zcard(self.keys.queue(queue)))

    def running_count(self) -> int:
        return int(self.client.zcard(self.keys.running))
