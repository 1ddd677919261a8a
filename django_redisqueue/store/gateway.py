"""The one door to Redis: the client of one backend's keys, the errors Redis can
raise and how a loop outlives them, and how replies are read. The protocol's writes
(``broker.py``) and the read-side queries of the dashboard, metrics and health probe
(``queries.py``) both go through a ``Gateway``."""

from __future__ import annotations

import logging
import random
import select
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any, Self

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.sentinel import SentinelConnectionPool

from django_redisqueue.store.connection import Client, describe
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.spares import Spares

logger = logging.getLogger(__name__)

# Every error Redis or the connection to it can raise. A loop that must outlive Redis
# trouble (out of memory, read-only replica, loading, busy script, lost connection)
# backs off and tries again on any of them.
# RedisClusterException: a cluster client found no node that answers (as it is made, or
# reloading its slot map after a lost connection).
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)


# The errors after which a command may or may not have run, but those by which Redis
# answered (``answered``): then the reply was lost. Redis refuses a command it answers
# with an error (OOM, READONLY, BUSY, NOSCRIPT, LOADING...) before it changes anything,
# and our scripts never fail half-way (see lua/lib/keys.lua).
UNCERTAIN_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    RedisClusterException,
)
# Redis's own answers that redis-py raises as connection errors.
_REFUSALS = (
    redis.exceptions.BusyLoadingError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
)


def answered(exc: BaseException) -> bool:
    """Whether Redis answered the command that raised ``exc`` (it refused it: out of
    memory, a read-only replica, loading, a wrong password...), rather than not at all.
    The one place that decides it, for every message and every recovery."""
    return isinstance(exc, (redis.ResponseError, *_REFUSALS))


def reply_lost(exc: BaseException) -> bool:
    """Whether the command that raised ``exc`` may have run, its reply lost: then what
    it may have done is recovered (a claim's job given back, an outcome sent again)."""
    return isinstance(exc, UNCERTAIN_ERRORS) and not answered(exc)


def sync(reply: Any) -> Any:
    """A reply of the synchronous client. redis-py 5 annotates commands as returning a
    reply or an awaitable (its asyncio client shares them); this client never returns
    an awaitable, so the type checker is told so in this one place."""
    return reply


def now_ms() -> int:
    """This host's clock, in ms: for display only; Redis's clock decides (scripts)."""
    return int(time.time() * 1000)


def text(value: bytes | str | None) -> str | None:
    """Decode a reply whether or not the client decodes responses itself."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


class Reconnector:
    """Backoff for a loop that must outlive Redis trouble: call ``failed(exc)`` when a
    command raised a Redis error (it logs and sleeps), ``succeeded()`` after one that
    did not. ``where`` names the server that answers again (after a failover, the new
    master), for the one line logged when Redis comes back."""

    def __init__(
        self,
        logger: logging.Logger,
        who: str,
        ceiling: float = 5.0,
        where: Callable[[], str] | None = None,
    ) -> None:
        self.logger = logger
        self.who = who
        self.ceiling = ceiling
        self.where = where
        self.failures = 0

    def failed(self, exc: Exception) -> None:
        delay = min(0.1 * 2**self.failures, self.ceiling) * random.uniform(0.5, 1.0)
        self.failures += 1
        what = "refused a command" if answered(exc) else "unreachable"
        self.logger.warning(
            "%s: Redis %s (%s: %s); retry %d in %.2f s",
            self.who,
            what,
            type(exc).__name__,
            exc,
            self.failures,
            delay,
        )
        time.sleep(delay)

    def succeeded(self) -> None:
        if self.failures:
            self.logger.warning(
                "%s: Redis reachable again after %d retries%s",
                self.who,
                self.failures,
                f" ({self.where()})" if self.where else "",
            )
            self.failures = 0


def readable(reply: Any) -> Any:
    """A pipeline reply: None for a key of another type (spoilt by hand); any other
    error is Redis's own (LOADING, a lost connection...) and is raised."""
    if isinstance(reply, redis.ResponseError) and str(reply).startswith("WRONGTYPE"):
        return None
    if isinstance(reply, Exception):
        raise reply
    return reply


def read_leniently(read: Callable[[], Any]) -> Any:
    """What one read command answers, or None for a key of another type (readable)."""
    try:
        return read()
    except redis.ResponseError as exc:
        return readable(exc)


# A held connection unused this long (s) is looked at before it is used:
# the shortest idle ``timeout`` a server may have is 1 s.
HELD_CONNECTION_LOOK_AFTER = 0.5


class Gateway:
    """The client of the one Redis database (or cluster slot) that holds a backend's keys."""

    def __init__(self, client: Client, keys: KeySchema) -> None:
        self.client = client
        self.keys = keys
        self._script_keys = keys.script_keys
        # On a connection held from call to call (Broker.pinned): when it was last used.
        self._held_used_at: float | None = None

    def pinned(self, *, fall_back: bool = True) -> Self:
        """This gateway on a connection of its own, held from call to call: for one
        thread's loop (a worker's), which then skips the pool's hand-over on every
        call (about 20 µs of the client's CPU a call with redis-py 8; the claim is one
        call a job). Calls on it from several threads wait for each other, a BLPOP
        included: other threads keep to this one. Kept as it is: a cluster client,
        which routes each call itself; a Sentinel pool, whose fresh connections find
        the new master after a failover where a held one was seen to keep asking the
        old one; and, with ``fall_back``, the pool when Redis does not answer now (else
        that error is raised). The calls are then the same, only slower. ``close()``
        gives the connection back."""
        if not isinstance(self.client, redis.Redis) or isinstance(
            self.client.connection_pool, SentinelConnectionPool
        ):
            return self
        try:
            client = redis.Redis(
                connection_pool=self.client.connection_pool, single_connection_client=True
            )
        except REDIS_ERRORS:
            if not fall_back:  # a lent one's caller: one wait for Redis, not two
                raise
            return self
        pinned = self._on(client)
        pinned._held_used_at = time.monotonic()
        return pinned

    def _on(self, client: redis.Redis) -> Self:
        """This gateway's calls on ``client``."""
        return type(self)(client, self.keys)

    @cached_property
    def spares(self) -> Spares[Self]:
        """This gateway on connections lent one call at a time (``Spares.lend``), for
        calls made from many threads: the slots', and enqueues. A pinned one lends
        itself."""

        return Spares(self._spare_one, type(self).close, self)

    def _spare_one(self) -> Self | None:
        """A new pinned one for ``spares``; None where none can be held."""
        if self._held_used_at is not None:
            return None
        made = self.pinned(fall_back=False)
        return None if made is self else made

    def _look_at_held_connection(self, after: float = HELD_CONNECTION_LOOK_AFTER) -> None:
        """A held connection idle for a while may have been closed by the server (its
        ``timeout``) while a job ran: look before sending on it, so that the call goes
        on a new one and is not taken for a reply lost. Only after ``after`` seconds
        idle: a busy worker pays no look."""
        now = time.monotonic()
        if now - (self._held_used_at or now) >= after:
            self._look_at_connection()
        self._held_used_at = now

    def _look_at_connection(self) -> None:
        """Drop a held connection the server has closed (a restart, its ``timeout``),
        or that holds data no one asked for, as the pool does before it lends one: one
        ``select`` (about 2 µs), where the pool's look is three system calls."""
        connection = getattr(self.client, "connection", None)  # a cluster's: none
        sock = getattr(connection, "_sock", None)
        if connection is None or sock is None:
            return
        # poll, not select: select refuses a descriptor past FD_SETSIZE (1024).
        poller = select.poll()
        try:
            poller.register(sock, select.POLLIN)
            readable = poller.poll(0)
        except (OSError, ValueError):  # closed under us
            readable = [sock]
        if readable:
            connection.disconnect()

    def close(self) -> None:
        """Give a pinned broker's connection back to the pool (any other: nothing)."""
        if isinstance(self.client, redis.Redis) and self.client.connection is not None:
            self.client.close()

    def _server(self) -> redis.Redis:
        """The client of the one server that holds this backend's keys."""
        if isinstance(self.client, RedisCluster):
            node = self.client.get_node_from_key(self._script_keys[0])
            return node.redis_connection or self.client.get_redis_connection(node)
        return self.client

    def _pipeline(self, transaction: bool = False) -> Pipeline:
        """A pipeline on ``_server()``: a cluster's pipelines refuse scripts and
        keyless commands, which one slot's master takes like any server."""
        return self._server().pipeline(transaction=transaction)

    def _execute(self, pipe: Pipeline, raise_on_error: bool = True) -> list[Any]:
        try:
            return pipe.execute(raise_on_error=raise_on_error)
        except redis.RedisError:
            self._lost_server()
            raise

    def _lost_server(self) -> None:
        """After an error on ``_server()``: a cluster reloads its slot map, so that the
        next call finds the slot's new master after a failover."""
        if isinstance(self.client, RedisCluster):
            try:
                self.client.nodes_manager.initialize()
            except redis.RedisError as exc:
                logger.debug("Cluster slot map not reloaded: %s", exc)

    def describe(self) -> str:
        """Where the commands go: the server, the Sentinel master, or the cluster."""
        return describe(self.client)

    def clock_ms(self) -> int:
        """Redis's clock, in ms: the one that leases and due times are measured by."""
        seconds, micros = sync(self._server().time())
        return int(seconds) * 1000 + int(micros) // 1000
