"""Jobs kept as entries, as a newer process's enqueue will write them (docs/protocol.md,
"What a smaller waiting job would take"): the tests of every reader of both forms, and
the protocol model, rewrite a fresh waiting job so."""

from __future__ import annotations

import redis

from django_redisqueue.store.gateway import text
from django_redisqueue.store.keys import KeySchema

# What the hash of a fresh job holds, all of it: a job with anything more is not fresh.
FRESH_FIELDS = frozenset({"payload", "queue", "enqueued_at", "status", "priority"})


def entry_text(fields: dict[str, str]) -> str:
    """A fresh job's hash fields as its entry."""
    priority = fields.get("priority", "0")
    return f"{fields['enqueued_at']}|{priority}|{fields['queue']}|{fields['payload']}"


def keep_as_entry(r: redis.Redis, keys: KeySchema, job_id: str) -> bool:
    """Rewrite a fresh job waiting on its queue (its hash holds only what an enqueue
    stored) as an entry in its bucket. False, and nothing changed, for any other job."""
    raw = r.hgetall(keys.job(job_id))
    fields = {text(k) or "": text(v) or "" for k, v in raw.items()}
    if not fields or set(fields) - FRESH_FIELDS or fields.get("status") != "READY":
        return False
    if r.zscore(keys.queue(fields["queue"]), job_id) is None:  # delayed, or not queued
        return False
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.job(job_id))
    pipe.hset(keys.entries(job_id), job_id, entry_text(fields))
    pipe.execute()
    return True
