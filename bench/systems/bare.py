"""The floor: RPUSH a small JSON job to enqueue, BLPOP it and call the function to run
it; no ids, no states, no results.

    python -m bench.systems.bare    # the worker
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from redis import Redis

from bench.systems.base import DEFAULT, FOUR, PROCESSES, Args, System, python, redis_url
from bench.systems.stamps import run_job

KEY = "bare:queue"
FUNCTIONS = {"job": run_job}
BULK_CHUNK = 1000


class Bare(System):
    name = "bare"
    title = "bare loop"
    distributions = ()
    settings = (
        "redis-py: `RPUSH` of `[name, args]` as JSON; worker: `BLPOP` (1 s timeout), "
        f"`json.loads`, call; {PROCESSES} processes: {PROCESSES} such loops; bulk: `RPUSH` of "
        f"{BULK_CHUNK} jobs per call; no delayed jobs"
    )
    has_bulk = True
    has_delay = False

    def connect(self) -> None:
        self.client = Redis.from_url(redis_url())

    def enqueue_one(self, *args: float) -> None:
        self.client.rpush(KEY, json.dumps(["job", args]))

    def enqueue_bulk(self, calls: Sequence[Args]) -> None:
        for i in range(0, len(calls), BULK_CHUNK):
            self.client.rpush(KEY, *(json.dumps(["job", a]) for a in calls[i : i + BULK_CHUNK]))

    def commands(self, config: str) -> list[list[str]]:
        if config == DEFAULT:
            return []  # one loop, one process: no concurrency to choose
        return [python("-m", "bench.systems.bare")] * (PROCESSES if config == FOUR else 1)


def work() -> None:
    client = Redis.from_url(redis_url())
    while True:
        item = client.blpop([KEY], 1)
        if item:
            name, args = json.loads(item[1])
            FUNCTIONS[name](*args)


SYSTEM = Bare()

if __name__ == "__main__":
    work()
