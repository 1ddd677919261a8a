"""The model-based test of the delivery protocol: the Lua scripts, driven through
``Broker`` against the suite's real redis-server, step by step, while a Python model
says where every job must be. The model is the package tests/support/model/protocol/ (its
docstring says which steps it takes, what it checks after each, how it controls time,
and which module holds what); here, how many sequences run, and the test."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from django_redisqueue.store.broker import Broker
from django_redisqueue.store.queries import Queries
from tests.support import tasks
from tests.support.model.harness import RESULT_TTL, RUN, STATES, FaultyRedis, model_env, run_model
from tests.support.model.protocol.machine import ProtocolMachine
from tests.support.model.protocol.records import BATCH, LEASE

# About 9,000 steps in 90 s on two cores; REDISQUEUE_MODEL_EXAMPLES=3000 for a long
# local run.
EXAMPLES = int(os.environ.get("REDISQUEUE_MODEL_EXAMPLES", "200"))


@pytest.mark.parametrize(
    ("pipelined", "examples"),
    [(False, EXAMPLES), (True, max(EXAMPLES // 3, 1))],
    ids=["one-call", "pipelined"],
)
def test_the_protocol_follows_its_model(r, redis_server, backend, report, pipelined, examples):
    """``pipelined``: every script call goes the way REPLICA_ACKS sends it, in a
    pipeline (``Broker._run_many``: its own NOSCRIPT handling), without the WAIT, which
    tests/test_replication.py proves against a real replica."""

    def make_broker(client: FaultyRedis) -> Broker:
        broker = Broker(client, backend.keys, lease=LEASE, result_ttl=RESULT_TTL)
        broker.handed_ms = int(LEASE * 1000)  # the hand-off's deadline too
        if pipelined:
            broker._run = lambda script, *args, acked=False: broker._run_many([(script, args)])[0]
        return broker

    env = model_env(r, backend, redis_server.url, make_broker, tasks.noop)
    env["queries"] = Queries(env["client"], backend.keys, result_ttl=RESULT_TTL)
    seconds = run_model(
        ProtocolMachine,
        env,
        examples=examples,
        steps=50,
        patches=[
            mock.patch("django_redisqueue.store.wire.ENQUEUE_BATCH_JOBS", BATCH),
            # The task API's enqueues hand jobs over under the backend's lease: the
            # model's, which runs out only when a step says so.
            mock.patch.object(backend.broker, "lease_ms", int(LEASE * 1000)),
            mock.patch.object(backend.broker, "handed_ms", int(LEASE * 1000)),
        ],
    )
    steps = RUN["checks"] - RUN["examples"]
    extra = ", ".join(
        f"{RUN[name]} {name}"
        for name in (
            "claims",
            "promoted",
            "recovered",
            "failed by lost leases",
            "sleeps",
            "refused when out of memory",
            "groups completed",
            "released",
            "failed waiting jobs",
            "origins written by hand",
            "refused linked enqueues",
            "groups trimmed from the index",
            "messages received",
            "receives past other queues' messages",
            "lost fan-out replies",
            "parked",
            "limited jobs ended",
            "starts forgotten past a window",
            "unparked by a freed slot",
            "unparked by the tick",
            "parked jobs cancelled",
            "unique enqueues refused",
            "unique keys freed",
            "unique keys kept for their window",
            "unique keys taken again",
            "unique windows passed",
            "fresh jobs kept as entries",
            "entries stored as hashes",
            "hashes stored as entries",
            "entries made hashes",
            "registered idle",
            "registered idle, wide",
            "registrations run out",
            "handed over",
            "handed jobs received",
            "handed jobs claimed",
            "handed jobs given back",
            "handed jobs taken",
            "handed jobs given back untaken",
            "results expired",
            "rows relayed after their result expired",
            "relays run after a job relayed before",
            "relays refused: the job waited for is gone",
            "lost claim replies",
            "jobs kept in hand by a give-back",
            "claims beside jobs in hand",
            "slot claims beside a registration",
            "leases lost beside jobs in hand",
            "progress stored",
            "late progress refused",
            "progress forgotten with its attempt",
            "progress of the attempt before kept",
            "stops answered STOPPING",
            "stops answered STOPPED",
            "stopped jobs ended instead of going back",
            "heartbeats naming jobs to stop",
            "fair claims",
            "fair entries dropped",
            "fair entries made again",
        )
    )
    report(
        f"protocol model{' (pipelined)' if pipelined else ''}: {steps} steps in "
        f"{RUN['examples']} sequences, "
        f"{len(STATES)} distinct states, {seconds:.1f} s ({extra})"
    )
