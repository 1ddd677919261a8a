"""Calls made from many threads (enqueues, the slots') go on connections lent one call
at a time, not through the pool: never two calls on one connection, none of a parent's
in a child process, and every one back in the pool once its broker is gone."""

from __future__ import annotations

import ctypes
import gc
import os
import socket
import threading
from unittest.mock import patch

import pytest
import redis
from django.test import override_settings

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.exceptions import BrokerUnavailable
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


def test_threads_that_come_and_go_leave_no_connection_held_in_a_shared_pool(r):
    """A backend on a cache's pool (CONNECTION), one a thread, as Django makes them: a
    thread that enqueued and ended gives its connection back when its backend goes, not
    at the collector's next full pass; with the pool bounded, threads one after the
    other never run out of connections."""
    pool = task_backends["cached"].broker.client.connection_pool
    gc.collect()
    in_use = len(pool._in_use_connections)
    errors = []

    def request():
        try:
            tasks.add.using(backend="cached").enqueue(1, 1)
        except Exception as exc:
            errors.append(exc)

    bound = pool.max_connections
    pool.max_connections = pool._created_connections + 5
    gc.disable()  # no full pass of the collector to tidy up after them
    try:
        for _ in range(20):
            thread = threading.Thread(target=request)
            thread.start()
            thread.join()
        held = len(pool._in_use_connections) - in_use
    finally:
        gc.enable()
        pool.max_connections = bound
    assert errors == []
    assert held == 0


def test_a_process_with_a_thousand_files_open_keeps_its_connection(backend):
    """The look before an enqueue handles any descriptor: ``select`` refuses one past
    1024 (a busy server's), which would drop and remake the connection every time."""
    backend.broker.spares.close_all()
    backend.broker.client.connection_pool.disconnect()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the next socket's
    try:  # descriptor is past them
        tasks.add.enqueue(1, 1)
        with backend.broker.spares.lend() as lent:
            sock = lent.client.connection._sock
        assert sock.fileno() > 1024
        for i in range(5):
            tasks.add.enqueue(i, 1)
        with backend.broker.spares.lend() as lent:
            assert lent.client.connection._sock is sock  # not remade
    finally:
        for descriptor in opened:
            os.close(descriptor)
        backend.broker.spares.close_all()


def test_a_child_forked_in_c_lends_none_of_its_parents_connections_nor_ids(backend):
    """A fork in C (uWSGI's workers) runs no Python fork hooks."""
    libc = ctypes.CDLL(None, use_errno=True)
    tasks.add.enqueue(0, 0)
    parents = list(backend.broker.spares._made)
    read, write = os.pipe()
    pid = libc.fork()
    if pid == 0:  # the child
        answer = "0"
        try:
            result = tasks.add.enqueue(1, 1)
            with backend.broker.spares.lend() as lent:
                answer = f"{int(lent not in parents)} {result.id}"
        finally:
            os.write(write, answer.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode().split()
    os.waitpid(pid, 0)
    assert said[0] == "1"
    mine = tasks.add.enqueue(2, 2)  # its id is not the child's, nor its connection
    assert mine.id != said[1] and mine.status == TaskResultStatus.READY


def test_an_enqueue_to_a_redis_that_does_not_answer_waits_for_one_connection_only(r):
    """The lent connection's own wait is the enqueue's: no second one on the pool."""
    mute = socket.socket()  # takes connections, never answers
    mute.bind(("127.0.0.1", 0))
    mute.listen(50)
    url = f"redis://127.0.0.1:{mute.getsockname()[1]}/0"
    mute_backend = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"URL": url, "CLIENT_KWARGS": {"socket_timeout": 0.2}},
    }
    made = []
    connect = redis.connection.Connection._connect

    def counted(self):
        made.append(1)
        return connect(self)

    try:
        with (
            override_settings(TASKS={"default": mute_backend}),
            patch.object(redis.connection.Connection, "_connect", counted),
            pytest.raises(BrokerUnavailable),
        ):
            tasks.add.enqueue(1, 1)
        assert made == [1]
    finally:
        mute.close()


def test_a_connection_lent_when_its_spares_close_goes_back_only_as_its_call_ends(backend):
    """Given back under a call in flight (a heartbeat's wait as its worker ends), the
    pool's next user would read that call's reply."""
    spares = backend.broker.spares
    pool = backend.broker.client.connection_pool
    with spares.lend() as broker:
        spares.close_all()
        assert broker.client.connection is not None  # still this call's
        assert broker.client.connection in pool._in_use_connections
        broker.client.ping()
    assert broker.client.connection is None  # back in the pool once the call ended
    with spares.lend() as fresh:
        assert fresh is not broker
