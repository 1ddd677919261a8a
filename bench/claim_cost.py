"""What a claim costs Redis, against a Redis-streams layout and a bare list.

On a private redis-server, per job over ``--jobs`` jobs (Redis CPU from ``INFO cpu``,
commands from ``INFO commandstats``, as ``bench/redisstats.py`` counts them):

- this app: an enqueue (one ``enqueue()`` call per job), then a claim that finishes the
  job before it (one script call per job, as a busy worker makes them), and a claim that
  finds its queue empty: what every claim pays whatever it does (the script call, its
  clock, its first look), which a claim of several jobs per call would share;
- what a script call pays before it does anything: one that returns at once, and one
  that returns once the claim's shared Lua definitions are made (each call makes them
  again);
- Redis streams with a consumer group, as taskiq's broker uses them: ``XADD`` per job,
  then ``XREADGROUP`` of one message and of 100 messages per call, each message
  acknowledged (``XACK``) and deleted (``XDEL``) once run, in one round trip per read;
- a bare list: ``RPUSH`` per job, then ``LPOP`` per job (no lease, no result: the floor).

    .venv/bin/python -m bench.claim_cost              # about a minute
    .venv/bin/python -m bench.claim_cost --jobs 50000

Prints a markdown table. docs/protocol.md ("Why not streams") reads it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench import redisstats
from tests.support.servers import RedisServer

STREAM, GROUP = "bench:stream", "workers"
BATCH = 100  # messages per XREADGROUP in the batched row (taskiq's default)


def measured(client: redis.Redis, jobs: int, work: Callable[[], Any]) -> tuple[float, float]:
    """Commands and Redis CPU µs per job that ``work()`` costs."""
    before = redisstats.snapshot(client)
    work()
    return redisstats.between(before, redisstats.snapshot(client)).per_job(jobs)


def drain(broker: Any, jobs: int) -> None:
    """Run ``jobs`` jobs off the queue ``default`` as a busy worker does: each claim
    stores the outcome of the job before."""
    from django_redisqueue.core.jobs import SUCCESSFUL
    from django_redisqueue.store.wire import Outcome

    finished = None
    for _ in range(jobs):
        _, claimed = broker.claim(["default"], "bench", finished, broadcasts=False)
        assert claimed is not None, "the queue ran out"
        finished = Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")
    broker.claim([], "bench", finished, broadcasts=False)


def this_app(client: redis.Redis, jobs: int) -> dict[str, tuple[float, float]]:
    from bench.tasks import job
    from django_redisqueue.compat import task_backends

    broker = task_backends["default"].broker.pinned()

    def enqueue() -> None:
        for i in range(jobs):
            job.enqueue(i)

    def empty_claims() -> None:
        for _ in range(jobs):
            broker.claim(["default"], "bench", None, broadcasts=False)

    rows = {
        "this app: enqueue": measured(client, jobs, enqueue),
        "this app: finish + claim": measured(client, jobs, lambda: drain(broker, jobs)),
        "this app: a claim that finds nothing": measured(client, jobs, empty_claims),
    }
    broker.close()
    return rows


def script_calls(client: redis.Redis, jobs: int) -> dict[str, tuple[float, float]]:
    from django_redisqueue.store import scripts

    source = scripts.sources()["claim"]
    own = (scripts.LUA / "claim.lua").read_text()
    definitions = source[: len(source) - len(own if own.endswith("\n") else own + "\n")]
    nothing = client.script_load("return 1")
    defined = client.script_load(definitions + "return 1\n")
    prefix = "{drq:bench}:"  # KEYS[1], which the definitions read

    def call(sha: str) -> Callable[[], None]:
        def calls() -> None:
            for _ in range(jobs):
                client.evalsha(sha, 1, prefix)

        return calls

    return {
        "a script that returns at once": measured(client, jobs, call(nothing)),
        "the claim's shared definitions, then return": measured(client, jobs, call(defined)),
    }


def streams(client: redis.Redis, jobs: int, count: int) -> dict[str, tuple[float, float]]:
    client.delete(STREAM)
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    payload = '{"task": "bench.tasks.job", "args": [1], "kwargs": {}}'

    def enqueue() -> None:
        for _ in range(jobs):
            client.xadd(STREAM, {"data": payload})

    def drain() -> None:
        done: list[bytes] = []
        while True:
            pipe = client.pipeline(transaction=False)
            if done:
                pipe.xack(STREAM, GROUP, *done)
                pipe.xdel(STREAM, *done)
            pipe.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=count)
            read = pipe.execute()[-1]
            if not read:
                return
            done = [message_id for message_id, _ in read[0][1]]

    return {
        "streams: XADD": measured(client, jobs, enqueue),
        f"streams: XREADGROUP of {count}, XACK + XDEL": measured(client, jobs, drain),
    }


def bare_list(client: redis.Redis, jobs: int) -> dict[str, tuple[float, float]]:
    def enqueue() -> None:
        for i in range(jobs):
            client.rpush("bench:list", i)

    def drain() -> None:
        while client.lpop("bench:list") is not None:
            pass

    return {
        "bare list: RPUSH": measured(client, jobs, enqueue),
        "bare list: LPOP": measured(client, jobs, drain),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    options = parser.parse_args()
    jobs = options.jobs
    with RedisServer() as server:
        os.environ.update(
            BENCH_REDIS_URL=server.url,
            BENCH_STAMPS=str(Path(tempfile.mkdtemp(prefix="bench-claim-")) / "stamps"),
            DJANGO_SETTINGS_MODULE="bench.settings",
        )
        import django

        django.setup()
        client = redis.Redis.from_url(server.url)
        this_app(client, 500)  # warm-up: connections, scripts
        rows = this_app(client, jobs)
        rows.update(script_calls(client, jobs))
        rows.update(streams(client, jobs, 1))
        rows.update(streams(client, jobs, BATCH))
        rows.update(bare_list(client, jobs))
        version = client.info("server")["redis_version"]
    print(f"{jobs:,} jobs, one private redis-server {version}.\n")
    print("| step | commands per job | Redis CPU per job (µs) |")
    print("|---|---|---|")
    for label, (commands, cpu) in rows.items():
        print(f"| {label} | {commands:.2f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
