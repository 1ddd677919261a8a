"""What the model-based tests (tests/test_protocol_model.py, tests/test_periodic_model.py)
share: a client whose next script call fails as Redis can make it fail, the errors
injected, deterministic job ids, the counters each run reports, and the run itself."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

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

# Steps (by kind), and distinct model states, over one run; reported at its end.
RUN: Counter[str] = Counter()
STATES: set[int] = set()


class FaultyRedis(redis.Redis):
    """A client whose next script call can be made to fail: refused before it runs
    (``fault``), or run with its reply lost (``lose_reply``)."""

    fault: Exception | None = None
    lose_reply: Exception | None = None

    def evalsha(self, sha, numkeys, *keys_and_args):  # type: ignore[override]
        if self.fault is not None:
            exc, self.fault = self.fault, None
            raise exc
        reply = super().evalsha(sha, numkeys, *keys_and_args)
        if self.lose_reply is not None:
            exc, self.lose_reply = self.lose_reply, None
            raise exc
        return reply

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
        if not any(args[0] == "EVALSHA" for args, _ in self.command_stack):
            return super().execute(raise_on_error)
        if owner.fault is not None:
            exc, owner.fault = owner.fault, None
            self.reset()
            raise exc
        replies = super().execute(raise_on_error)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            return replies  # nothing ran: the reply to lose is the next call's, as above
        if owner.lose_reply is not None:
            exc, owner.lose_reply = owner.lose_reply, None
            raise exc
        return replies


class Ids:
    """Deterministic job ids in a pseudo-random order (ties between equal scores are
    broken by id in Redis), so that a failing sequence replays with the same ids."""

    def __init__(self) -> None:
        self.n = 0

    def new_job_id(self) -> str:
        self.n += 1
        return hashlib.sha256(str(self.n).encode()).hexdigest()[:26]


def run_model(
    machine: Callable[[], RuleBasedStateMachine],
    *,
    examples: int,
    steps: int,
    r: redis.Redis,
    client: redis.Redis,
    patches: Sequence[AbstractContextManager[Any]] = (),
) -> float:
    """Run ``machine`` for ``examples`` sequences of up to ``steps`` steps, with
    ``patches`` applied; return the seconds it took. Whatever happens, Redis's memory
    limit (an out-of-memory step sets one) is lifted and the client closed."""
    RUN.clear()
    STATES.clear()
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
    finally:
        r.config_set("maxmemory", 0)
        client.close()
    return time.monotonic() - started
