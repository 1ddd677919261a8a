"""The model-based test of periodic jobs: ``lua/periodic.lua`` driven through
``Broker`` and ``PeriodicStep`` against the suite's real redis-server, step by step,
while a Python model says what every schedule's hash, every job and every queue must
hold. The model is the package tests/support/model/periodic/ (its docstring says which steps it
takes, what it checks, how it controls time, and which module holds what); here, how
many sequences run, and the test."""

from __future__ import annotations

import os
from unittest import mock

from django_redisqueue.core import schedules
from tests.support import tasks
from tests.support.model.harness import RESULT_TTL, RUN, STATES, FaultyRedis, model_env, run_model
from tests.support.model.periodic.calls import ModelBroker
from tests.support.model.periodic.machine import PeriodicMachine
from tests.support.model.periodic.schedules import BATCH, MAX_BACKLOG

# About a minute on two cores; REDISQUEUE_PERIODIC_EXAMPLES=2000 for a long local run.
EXAMPLES = int(os.environ.get("REDISQUEUE_PERIODIC_EXAMPLES", "250"))


def test_periodic_jobs_follow_their_model(r, redis_server, backend, report):
    def make_broker(client: FaultyRedis) -> ModelBroker:
        return ModelBroker(client, backend.keys, lease=60, result_ttl=RESULT_TTL)

    env = model_env(r, backend, redis_server.url, make_broker, tasks.noop_any)
    seconds = run_model(
        PeriodicMachine,
        env,
        examples=EXAMPLES,
        steps=40,
        patches=[
            mock.patch.object(schedules, "BATCH", BATCH),
            mock.patch.object(schedules, "MAX_BACKLOG", MAX_BACKLOG),
            mock.patch.object(backend, "broker", env["broker"]),
        ],
    )
    steps = RUN["checks"] - RUN["examples"]
    counted = ", ".join(
        f"{RUN[name]} {name}" for name in sorted(RUN) if name not in ("checks", "examples")
    )
    report(
        f"periodic model: {steps} steps in {RUN['examples']} sequences, {len(STATES)} "
        f"distinct states, {seconds:.1f} s ({counted})"
    )
