"""How the protocol's scripts are called: as Redis Functions (``FCALL``) where Redis
has them (7.0 and later), else by ``EVALSHA``. Either way each is loaded on first use
and again when Redis has lost it (a restart, a failover to a server that never had
it, ``FUNCTION FLUSH`` or ``SCRIPT FLUSH``).

A Function's library makes the shared definitions of ``lua/lib/`` once, at its load;
a script makes them again at every call, about a quarter of an enqueue's cost in Redis
(docs/protocol.md, "Redis Functions").
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.exceptions import NoPermissionError, NoScriptError

from django_redisqueue.store import scripts
from django_redisqueue.store.connection import Client

logger = logging.getLogger(__name__)

# How a server without Functions answers FCALL and FUNCTION: as an unknown command,
# named as sent, in backticks before Redis 7.0 ("unknown command `FCALL`, with args
# beginning with: ..."), in quotes from 7.0 on (a command renamed away).
NO_FUNCTIONS_REPLY = re.compile(r"unknown command [`'](fcall|function)[`']", re.IGNORECASE)

# Seconds between two warnings that writes went unconfirmed by REPLICA_ACKS replicas.
UNREPLICATED_WARNING_INTERVAL = 10.0


class NotReplicated(redis.RedisError):
    """A write that the master made but fewer replicas than ``REPLICA_ACKS`` confirmed
    within ``REPLICA_ACKS_TIMEOUT``: it is lost if the master fails before they have it."""

    def __init__(self, acked: int, wanted: int, timeout: float, replies: list[Any]) -> None:
        super().__init__(
            f"the master made the write, but {acked} of the {wanted} replica(s) that "
            f"REPLICA_ACKS asks for confirmed it within {timeout} s"
        )
        self.replies = replies  # the scripts' replies, as if all was well


class UnreplicatedWrites:
    """The writes too few replicas confirmed, said in the log at most once per
    UNREPLICATED_WARNING_INTERVAL with how many there were: one count per backend,
    which its pinned brokers share (a worker's loop and its heartbeat thread)."""

    def __init__(self) -> None:
        self.count = 0  # since the last warning
        self._warn_at = 0.0
        self._lock = threading.Lock()

    def note(self, script: str, exc: NotReplicated) -> None:
        with self._lock:
            self.count += 1
            if time.monotonic() < self._warn_at:
                return
            self._warn_at = time.monotonic() + UNREPLICATED_WARNING_INTERVAL
            count, self.count = self.count, 0
        logger.warning(
            "Redis %s: %s (%d such write(s) since the last warning)", script, exc, count
        )


def is_missing(reply: Any) -> bool:
    """True for Redis's answer to a call of a Function or a script it does not hold:
    the call did not run."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, redis.ResponseError) and str(reply).startswith("Function not found")
    )


def has_no_functions(reply: Any) -> bool:
    """True for Redis's answer to ``FCALL`` or ``FUNCTION LOAD`` from a server without
    Functions (before 7.0), or a user whose ACL does not allow them: nothing ran."""
    if isinstance(reply, NoPermissionError):
        return "fcall" in str(reply).lower() or "function" in str(reply).lower()
    return isinstance(reply, redis.ResponseError) and bool(NO_FUNCTIONS_REPLY.match(str(reply)))


class ScriptCalls:
    """The scripts of one client (a backend's, or a pinned broker's), called with the
    backend's one key (``script_keys``) on the server ``server()`` returns (in a
    cluster, the master of the keys' slot)."""

    def __init__(
        self,
        client: Client,
        script_keys: Sequence[str],
        server: Callable[[], redis.Redis],
        lost_server: Callable[[], None],
        *,
        functions: bool = True,
    ) -> None:
        self.client = client
        self.script_keys = list(script_keys)
        self.server = server
        self.lost_server = lost_server
        self.scripts = scripts.scripts()
        # False once Redis has shown it has no Functions: then EVALSHA, for good.
        self.functions = functions

    def call(self, name: str, args: Sequence[Any]) -> Any:
        """Run script ``name`` with ``args`` on ``server()``; return its reply (its
        error raised). Sent to the server itself, not through a cluster client, which
        would ask a node of its own for an FCALL's keys first, and keep asking it when
        that node is gone; after an error, ``lost_server`` has the slot map reloaded."""
        loads = 0
        while True:
            server = self.server()
            try:
                return self._send(server, name, args)
            except redis.ResponseError as exc:
                if str(exc).startswith("MOVED"):
                    self.lost_server()
                if loads == 2 or not self.retry(exc):
                    raise
                self.load(server, [name])
                loads += 1
            except redis.RedisError:
                self.lost_server()
                raise

    def queue(self, pipe: Pipeline, name: str, args: Sequence[Any]) -> None:
        """Add a call of script ``name`` to a pipeline (of ``server()``)."""
        self._send(pipe, name, args)

    def _send(self, target: Any, name: str, args: Sequence[Any]) -> Any:
        script = self.scripts[name]
        if self.functions:
            return target.fcall(script.function, 1, *self.script_keys, *args)
        return target.evalsha(script.sha, 1, *self.script_keys, *args)

    def retry(self, reply: Any) -> bool:
        """True when ``reply`` says the call did not run and can be sent again once
        loaded: the Function or script is missing, or Redis has no Functions (from
        now on, scripts are called instead)."""
        if has_no_functions(reply):
            # (Also once the pipeline's first such reply has switched to scripts.)
            if self.functions:
                self._without_functions(reply)
            return True
        return is_missing(reply)

    def _without_functions(self, reason: Any) -> None:
        self.functions = False
        logger.info("Redis runs no Functions here (%s): scripts are called by EVALSHA", reason)

    def load(self, server: redis.Redis, names: Sequence[str]) -> None:
        """Load scripts ``names`` on ``server``, as Functions or scripts."""
        for name in dict.fromkeys(names):
            script = self.scripts[name]
            if not self.functions:
                server.script_load(script.source)
                continue
            try:
                server.function_load(script.library, replace=True)
            except redis.ResponseError as exc:
                if not has_no_functions(exc):
                    raise
                self._without_functions(exc)
                server.script_load(script.source)

    def prune(self) -> list[str]:
        """Delete from ``server()`` the libraries of this app's other versions (each
        some 50 KB of Redis memory, kept and replicated); return their names. Safe while
        processes of those versions run: a call that finds its Function gone loads it
        again, one round trip more."""
        if not self.functions:
            return []
        server = self.server()
        try:
            # (cast: redis-py 5's stubs say it may be awaitable; a sync client's is not)
            listed = cast(list[Any], server.function_list(library=f"{scripts.FUNCTION_PREFIX}*"))
        except redis.ResponseError:  # no Functions here, or an ACL that hides them
            return []
        current = {script.function for script in self.scripts.values()}
        names = [library_name(entry) for entry in listed]
        old = [name for name in names if name not in current]
        for name in old:
            # Deleted meanwhile by another scheduler: nothing to do.
            with contextlib.suppress(redis.ResponseError):
                server.function_delete(name)
        return old

    def run_many(
        self,
        calls: Sequence[tuple[str, Sequence[Any]]],
        execute: Callable[[Pipeline], list[Any]],
        lost_server: Callable[[], None],
        replica_acks: int = 0,
        replica_acks_timeout: float = 1.0,
    ) -> list[Any]:
        """Call scripts in one round trip, each atomic, on ``server()``; return their
        replies. ``execute`` runs the pipeline (not raising the scripts' errors);
        ``lost_server`` is told of a MOVED reply. With ``replica_acks``, a WAIT follows
        on the same connection: it counts the replicas that have every write of that
        connection. Raise the first error a script returned, or NotReplicated when too
        few replicas confirmed."""
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        acked = 0
        for attempt in range(3):
            server = self.server()
            pipe = server.pipeline(transaction=False)
            for i in pending:
                self.queue(pipe, *calls[i])
            if replica_acks:
                pipe.execute_command("WAIT", replica_acks, int(replica_acks_timeout * 1000))
            out = execute(pipe)
            if replica_acks:
                *out, acked = out
            missing = []
            for i, reply in zip(pending, out, strict=True):
                if attempt < 2 and self.retry(reply):
                    missing.append(i)  # not run: load the scripts and call it again
                else:
                    replies[i] = reply
            if not missing:
                break
            self.load(server, [calls[i][0] for i in missing])
            pending = missing
        for reply in replies:
            if isinstance(reply, Exception):
                if isinstance(reply, redis.ResponseError) and str(reply).startswith("MOVED"):
                    lost_server()
                raise reply
        if replica_acks and int(acked) < replica_acks:
            raise NotReplicated(int(acked), replica_acks, replica_acks_timeout, replies)
        return cast(list[Any], replies)


def library_name(entry: Any) -> str:
    """A library's name in one entry of FUNCTION LIST's reply (a flat list of field
    and value, as RESP2 gives it, or a mapping), decoded or not."""
    fields = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
    for key, value in fields.items():
        if (key.decode() if isinstance(key, bytes) else key) == "library_name":
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""
