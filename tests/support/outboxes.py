"""What the outbox's tests share: jobs as the outbox keeps them, two relays at once,
and a database without the outbox's table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

from django.db import connections

from django_redisqueue.backends import outbox
from django_redisqueue.models import OutboxJob
from django_redisqueue.store.wire import NewJob


def waiting(job_id: str, n: int, after: str = "") -> NewJob:
    """A job of tests.support.tasks.add(n, n) as the outbox keeps it."""
    payload = f'{{"v":1,"task":"tests.support.tasks.add","args":[{n},{n}]}}'
    return NewJob(job_id, "default", 0, payload, 0, after)


def two_relays_at_once(
    backend, database: str, first: int, second: int, *, skipping: Callable[[dict], None]
) -> dict[str, int | BaseException]:
    """Relay ``first`` rows in one thread and, while it holds them (stopped before it
    stores their jobs), up to ``second`` in another; return what each relayed (or the
    error it raised), by name. ``skipping(relayed)`` is called while the first still
    holds its rows, once the second has ended, where the database skips locked rows
    (elsewhere the second waits for the first)."""
    holding, release = threading.Event(), threading.Event()
    relayed: dict[str, int | BaseException] = {}
    store = outbox.store

    def held_store(*args, **kwargs):
        if threading.current_thread().name == "first":
            holding.set()
            assert release.wait(30)
        return store(*args, **kwargs)

    def relay(batch: int) -> None:
        name = threading.current_thread().name
        try:
            relayed[name] = outbox.relay(
                backend.broker, backend.alias, database, record_queues=False, batch=batch,
                settle=0,
            )  # fmt: skip
        except BaseException as exc:
            relayed[name] = exc
        finally:
            connections.close_all()

    with mock.patch.object(outbox, "store", held_store):
        threads = [threading.Thread(target=relay, args=(first,), name="first")]
        threads[0].start()
        assert holding.wait(30)
        threads.append(threading.Thread(target=relay, args=(second,), name="second"))
        threads[1].start()
        try:
            if connections[database].features.has_select_for_update_skip_locked:
                threads[1].join(30)
                skipping(dict(relayed))
        finally:
            release.set()
            for thread in threads:
                thread.join(30)
    return relayed


@contextmanager
def outbox_table_gone(database: str) -> Iterator[None]:
    """``database`` without the outbox's table, as before its migration: renamed away,
    and back after."""
    table = OutboxJob._meta.db_table
    with connections[database].schema_editor() as editor:
        editor.alter_db_table(OutboxJob, table, f"{table}_away")
    try:
        yield
    finally:
        with connections[database].schema_editor() as editor:
            editor.alter_db_table(OutboxJob, f"{table}_away", table)
