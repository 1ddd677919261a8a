"""Calls made from many threads (enqueues, the slots') go on connections lent one call
at a time, not through the pool: never two calls on one connection, none of a parent's
in a child process, and every one back in the pool once its broker is gone."""

from __future__ import annotations

import gc
import os
import threading
from unittest.mock import patch

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.store.broker import Broker
from tests.support import tasks


def test_enqueues_after_the_first_take_no_connection_from_the_pool(backend):
    tasks.add.enqueue(0, 0)
    pool = backend.broker.client.connection_pool
    with patch.object(pool, "get_connection", side_effect=AssertionError("pooled")):
        results = [tasks.add.enqueue(i, 1) for i in range(5)]
    assert all(r.status == TaskResultStatus.READY for r in results)
    assert [backend.get_result(r.id).args for r in results] == [[i, 1] for i in range(5)]


def test_threads_enqueueing_at_once_never_share_a_connection(backend):
    """Replies of two calls on one connection would cross: a job would come back with
    another's enqueue time, or the client would read a reply in the middle."""
    start = threading.Barrier(8)
    made: list[list] = [[] for _ in range(8)]
    errors = []

    def enqueue(n: int) -> None:
        try:
            start.wait(timeout=10)
            for i in range(50):
                made[n].append(tasks.add.enqueue(n, i))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(8)]
    with patch("django_redisqueue.backends.redis.RedisQueueBackend.broker", backend.broker):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    for n, results in enumerate(made):
        assert [backend.get_result(r.id).args for r in results] == [[n, i] for i in range(50)]
    assert 1 <= len(backend.broker.spares._made) <= 8
    backend.broker.spares.close_all()


def test_a_child_process_lends_none_of_its_parents_connections(backend):
    tasks.add.enqueue(0, 0)  # the parent holds a spare connection
    parents = list(backend.broker.spares._made)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        ok = False
        try:
            result = tasks.add.enqueue(1, 1)
            with backend.broker.spares.lend() as lent:
                ok = lent not in parents and backend.get_result(result.id).args == [1, 1]
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    assert said == b"1"
    # The parent's connection is its own still: the child neither used nor closed it.
    assert tasks.add.enqueue(2, 2).status == TaskResultStatus.READY
    assert backend.broker.spares._made == parents


def test_the_connections_go_back_to_the_pool_when_their_broker_is_garbage(backend):
    pool = backend.broker.client.connection_pool
    broker = Broker(backend.broker.client, backend.keys, lease=30, result_ttl=60)
    with broker.spares.lend() as first, broker.spares.lend() as second:
        held = {first.client.connection, second.client.connection}
    assert held <= pool._in_use_connections
    del broker, first, second
    gc.collect()
    assert not held & pool._in_use_connections
    assert held <= set(pool._available_connections)


def test_a_pinned_broker_lends_itself(backend):
    pinned = backend.broker.pinned()
    try:
        with pinned.spares.lend() as lent:
            assert lent is pinned
    finally:
        pinned.close()
