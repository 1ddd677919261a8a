"""What a waiting job would cost Redis in other layouts: bytes per job of today's layout
and of the candidates for a smaller one, each filled with the same jobs on a private
redis-server (``used_memory`` over ``--jobs`` jobs; Redis's default encodings).

Each job has a 26-hex-digit id, the fields a waiting job holds today (a 51-byte
payload, its queue, its enqueue time, its status) and a place in its queue. The
candidates keep the same facts: an "entry" is the enqueue time and the payload in one
string. docs/protocol.md ("Memory per waiting job") reads the table.

    .venv/bin/python -m bench.waiting_layouts                    # about a minute
    .venv/bin/python -m bench.waiting_layouts --jobs 1000000

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Callable

import redis

from tests.support.servers import RedisServer

PAYLOAD = '{"v":1,"task":"app.tasks.send_email","args":[42]}'
ENQUEUED_AT = "1764355200123"
ENTRY = f"{ENQUEUED_AT}|{PAYLOAD}"
SCORE = 100 * 2**44  # a queue score of priority 0 (lua/lib/queues.lua)
PIPELINE = 1000

# How one job is written: (pipeline, its number, its id).
Fill = Callable[[redis.client.Pipeline, int, str], object]


def _bucket(job_id: str, bits: int) -> str:
    """The bucket of ``bits`` bits an id falls in (its leading hex digits)."""
    return format(int(job_id[:5], 16) >> (20 - bits), "x")


def _today(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
    fields = {"payload": PAYLOAD, "queue": "default", "enqueued_at": ENQUEUED_AT}
    pipe.hset(f"{{q}}:job:{job_id}", mapping={**fields, "status": "READY"})
    pipe.zadd("{q}:queue:default", {job_id: SCORE + n})


def _queue_entry(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
    pipe.zadd("{q}:queue:default", {job_id: SCORE + n})


def _one_hash(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
    pipe.hset("{q}:waiting:default", job_id, ENTRY)
    _queue_entry(pipe, n, job_id)


def _buckets(bits: int) -> Fill:
    def fill(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
        pipe.hset(f"{{q}}:waiting:{_bucket(job_id, bits)}", job_id, ENTRY)
        _queue_entry(pipe, n, job_id)

    return fill


def _list(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
    pipe.rpush("{q}:list:default", f"{job_id}|{ENTRY}")


def _ids_and_buckets(bits: int) -> Fill:
    def fill(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
        pipe.rpush("{q}:ready:default:0", job_id)
        pipe.hset(f"{{q}}:waiting:{_bucket(job_id, bits)}", job_id, ENTRY)

    return fill


def _list_and_index(bits: int) -> Fill:
    def fill(pipe: redis.client.Pipeline, n: int, job_id: str) -> None:
        _list(pipe, n, job_id)
        pipe.hset(f"{{q}}:index:{_bucket(job_id, bits)}", job_id, "")

    return fill


LAYOUTS: list[tuple[str, Fill]] = [
    ("today: a hash per job, and its queue's sorted set", _today),
    ("the sorted-set entry alone", _queue_entry),
    ("one hash per queue (id: entry), and the sorted set", _one_hash),
    *(
        (f"2^{bits} bucket hashes (id: entry), and the sorted set", _buckets(bits))
        for bits in (12, 16)
    ),
    ("a list of entries, each with its id (as Huey keeps jobs): no lookup by id", _list),
    ("the list, and 2^16 bucket hashes of the ids (a lookup by id)", _list_and_index(16)),
    ("a list of ids, and 2^12 bucket hashes (id: entry)", _ids_and_buckets(12)),
]


def bytes_per_job(client: redis.Redis, fill: Fill, ids: list[str]) -> float:
    client.flushall()
    before = client.info("memory")["used_memory"]
    pipe = client.pipeline(transaction=False)
    for n, job_id in enumerate(ids):
        fill(pipe, n, job_id)
        if n % PIPELINE == PIPELINE - 1:
            pipe.execute()
    pipe.execute()
    return (client.info("memory")["used_memory"] - before) / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    options = parser.parse_args()
    ids = [secrets.token_hex(13) for _ in range(options.jobs)]
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        version = client.info("server")["redis_version"]
        print(f"Redis {version}, {options.jobs:,} waiting jobs\n")
        print("| layout | bytes per waiting job |\n|---|---:|")
        for name, fill in LAYOUTS:
            print(f"| {name} | {bytes_per_job(client, fill, ids):.0f} |")


if __name__ == "__main__":
    main()
