"""What the model-based tests (tests/test_protocol_model.py, tests/test_periodic_model.py)
share: a client whose next script call fails as Redis can make it fail, the errors
injected, deterministic job ids, a snapshot of what Redis holds, the counters each run
reports, what every machine starts from, and the run itself."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any
from unittest import mock

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from django_redisqueue.store.broker import Broker
from django_redisqueue.store.calls import has_no_functions, is_missing
from django_redisqueue.store.spares import Spares

FAR = 3_600_000  # ms: an hour, longer than any run of a model
RESULT_TTL = 24 * 3600  # s: the backend's (a cancel goes through the backend)
# The phases of a run that reports its first failing sequence unshrunk.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)

# Errors Redis (or the way to it) raises; injected before a script runs.
INJECTED = {
    "oom": lambda: redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'."
    ),
    "readonly": lambda: redis.exceptions.ReadOnlyError(
        "You can't write against a read only replica."
    ),
    "busy": lambda: redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    "connection": lambda: redis.exceptions.ConnectionError("Connection reset by peer"),
    "timeout": lambda: redis.exceptions.TimeoutError("Timeout reading from socket"),
}

# The commands that call a script: as a Redis Function, or by SHA.
SCRIPT_CALLS = ("FCALL", "EVALSHA")

# Steps (by kind), and distinct model states, over one run; reported at its end.
RUN: Counter[str] = Counter()
STATES: set[int] = set()


class FaultyRedis(redis.Redis):
    """A client whose next script call can be made to fail: refused before it runs
    (``fault``), or run with its reply lost (``lose_reply``)."""

    fault: Exception | None = None
    lose_reply: Exception | None = None

    def _script_call(self, call, *args):
        if self.fault is not None:
            exc, self.fault = self.fault, None
            raise exc
        reply = call(*args)
        if self.lose_reply is not None:
            exc, self.lose_reply = self.lose_reply, None
            raise exc
        return reply

    def evalsha(self, sha, numkeys, *keys_and_args):  # type: ignore[override]
        return self._script_call(super().evalsha, sha, numkeys, *keys_and_args)

    def fcall(self, function, numkeys, *keys_and_args):  # type: ignore[override]
        return self._script_call(super().fcall, function, numkeys, *keys_and_args)

    def pipeline(self, transaction=True, shard_hint=None):  # type: ignore[override]
        pipe = FaultyPipeline(self.connection_pool, self.response_callbacks, transaction, None)
        pipe.owner = self
        return pipe


class FaultyPipeline(redis.client.Pipeline):
    """A pipeline of FaultyRedis: a pipeline that calls scripts fails as FaultyRedis's
    script calls do (the broker pipelines its calls with REPLICA_ACKS)."""

    owner: FaultyRedis

    def execute(self, raise_on_error=True):  # type: ignore[override]
        owner = self.owner
        if not any(args[0] in SCRIPT_CALLS for args, _ in self.command_stack):
            return super().execute(raise_on_error)
        if owner.fault is not None:
            exc, owner.fault = owner.fault, None
            self.reset()
            raise exc
        replies = super().execute(raise_on_error)
        if any(is_missing(reply) or has_no_functions(reply) for reply in replies):
            return replies  # nothing ran: the reply to lose is the next call's, as above
        if owner.lose_reply is not None:
            exc, owner.lose_reply = owner.lose_reply, None
            raise exc
        return replies


def forget_scripts(r: redis.Redis) -> None:
    """What a restart or a failover to a server that never had them does: Redis
    forgets every script and every Function (calls get NOSCRIPT, Function not found)."""
    r.script_flush()
    with contextlib.suppress(redis.ResponseError):  # a server without Functions
        r.function_flush()


def snapshot(r: redis.Redis, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """Every key's type, contents and whether it expires (in two round trips)."""
    keys = sorted(key for key in r.keys("*") if not key.startswith(skip))
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    read = {
        "string": pipe.get,
        "hash": pipe.hgetall,
        "list": lambda key: pipe.lrange(key, 0, -1),
        "set": pipe.smembers,
        "zset": lambda key: pipe.zrange(key, 0, -1, withscores=True),
    }
    for key, kind in zip(keys, kinds, strict=True):
        read.get(kind, pipe.exists)(key)
        pipe.ttl(key)
    replies = pipe.execute()
    state: dict[str, object] = {}
    for i, (key, kind) in enumerate(zip(keys, kinds, strict=True)):
        value, ttl = replies[2 * i : 2 * i + 2]
        state[key] = (kind, sorted(value) if kind == "set" else value, ttl > 0)
    return state


class Ids:
    """Deterministic job ids in a pseudo-random order (ties between equal scores are
    broken by id in Redis), so that a failing sequence replays with the same ids."""

    def __init__(self) -> None:
        self.n = 0

    def new_job_id(self) -> str:
        self.n += 1
        return hashlib.sha256(str(self.n).encode()).hexdigest()[:26]


def model_env(
    r: redis.Redis,
    backend: Any,
    url: str,
    make_broker: Callable[[FaultyRedis], Broker],
    task: Any,
) -> dict[str, Any]:
    """What a machine is made from: the suite's client ``r`` (the test's own reads and
    writes), the backend, a FaultyRedis on ``url`` and the broker ``make_broker`` makes
    on it (the calls under test), the ids jobs get, and ``task``'s envelope."""
    client = FaultyRedis.from_url(url)
    broker = make_broker(client)
    # Its calls stay on the faulty client, where the model makes them fail: the broker
    # lends itself rather than connections of their own (Broker.spares).
    broker.spares = Spares(lambda: None, Broker.close, broker)
    return {
        "r": r,
        "backend": backend,
        "client": client,
        "broker": broker,
        "ids": Ids(),
        "payload": backend.prepare(task, (), {})._payload,
    }


class ModelMachine(RuleBasedStateMachine):
    """What each machine starts from: the objects of its ``env`` (``model_env``), an
    empty Redis, ids counted from the first again, and no fault pending."""

    def __init__(self, env: dict[str, Any]) -> None:
        super().__init__()
        self.r: redis.Redis = env["r"]
        self.backend = env["backend"]
        self.client: FaultyRedis = env["client"]
        self.broker = env["broker"]
        self.payload: str = env["payload"]  # the envelope of model_env's task
        self.keys = self.broker.keys
        self.ids: Ids = env["ids"]
        self.ids.n = 0
        self.client.fault = self.client.lose_reply = None
        self.r.flushall()
        RUN["examples"] += 1

    def clock(self) -> int:
        """Redis's clock (ms)."""
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000


def run_model(
    machine: Callable[[dict[str, Any]], RuleBasedStateMachine],
    env: dict[str, Any],
    *,
    examples: int,
    steps: int,
    patches: Sequence[AbstractContextManager[Any]] = (),
) -> float:
    """Run ``machine(env)`` for ``examples`` sequences of up to ``steps`` steps, with
    jobs given env's ids and ``patches`` applied; return the seconds it took. Whatever
    happens, Redis's memory limit (an out-of-memory step sets one) is lifted and the
    client closed."""
    RUN.clear()
    STATES.clear()
    r, client = env["r"], env["client"]
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                mock.patch("django_redisqueue.backends.base.new_job_id", env["ids"].new_job_id)
            )
            for patch in patches:
                stack.enter_context(patch)
            run_state_machine_as_test(
                lambda: machine(env),
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                    # REDISQUEUE_MODEL_NO_SHRINK=1: report the first failing sequence
                    # at once, unshrunk (shrinking one can take minutes).
                    **(
                        {"phases": NO_SHRINK}
                        if os.environ.get("REDISQUEUE_MODEL_NO_SHRINK")
                        else {}
                    ),
                ),
            )
    finally:
        r.config_set("maxmemory", 0)
        client.close()
    return time.monotonic() - started
