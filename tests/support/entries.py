"""Fresh jobs in either form (docs/protocol.md, "A waiting job kept as an entry"): the
enqueue keeps one as an entry; a process older than entries stored its hash. The tests
of both forms, and the protocol model, rewrite a fresh waiting job from one form to the
other, at the same place in its queue."""

from __future__ import annotations

import redis

from django_redisqueue.store.gateway import text
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.wire import entry_fields

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


def keep_as_hash(r: redis.Redis, keys: KeySchema, job_id: str) -> bool:
    """Rewrite a job kept as an entry as the hash a process older than entries stored.
    False, and nothing changed, for a job with no entry."""
    fields = entry_fields(text(r.hget(keys.entries(job_id), job_id)) or "")
    if fields is None:
        return False
    pipe = r.pipeline(transaction=True)
    pipe.hdel(keys.entries(job_id), job_id)
    pipe.hset(keys.job(job_id), mapping=fields)
    pipe.execute()
    return True


def as_hash(r: redis.Redis, keys: KeySchema, job_id: str) -> str:
    """The key of a job's hash, its entry made that hash first if the job is kept as
    one: for a test that changes a waiting job's fields by hand."""
    keep_as_hash(r, keys, job_id)
    return keys.job(job_id)
