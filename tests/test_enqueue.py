"""Enqueueing from application code: the handle, validation, both decorators."""

import logging
import os
import re
import threading
from unittest.mock import patch

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings

from django_redisqueue import RedisTask, RedisTaskResult, task
from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.backends.base import enqueued_is_heard, new_job_id
from django_redisqueue.compat import (
    TASKS_PACKAGE,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_redisqueue.exceptions import BrokerUnavailable, ConfigurationError
from django_redisqueue.store.wire import NewJob
from tests.conftest import not_on_cluster, run_worker_here
from tests.support import tasks
from tests.support.keys import CACHED_KEYS, DEFAULT_KEYS
from tests.support.topology import keys_server, scripts_run


def queued(r, queue="default"):
    return r.zrange(DEFAULT_KEYS.queue(queue), 0, -1)


def test_enqueue_returns_a_ready_result_and_queues_the_job(r, backend):
    result = tasks.add.enqueue(2, 3)

    assert isinstance(result, RedisTaskResult)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3]
    assert result.enqueued_at is not None
    assert queued(r) == [result.id]
    assert backend.get_result(result.id).status == TaskResultStatus.READY


def test_delay_is_enqueue(r):
    result = tasks.add.delay(1, b=2)
    assert result.kwargs == {"b": 2}
    assert queued(r) == [result.id]


def test_using_picks_queue_and_priority(r, backend):
    result = tasks.add.using(queue_name="low", priority=-5).enqueue(1, 1)

    assert queued(r, "low") == [result.id]
    stored = backend.get_result(result.id)
    assert (stored.task.queue_name, stored.task.priority) == ("low", -5)
    assert stored.task.func is tasks.add.func


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((object(),), {}, "Argument 0 of tests.support.tasks.add()"),
        ((1,), {"b": {1, 2}}, "Argument 'b' of tests.support.tasks.add()"),
        ((1,), {"b": {1: "x"}}, "object keys must be strings"),
        ((float("nan"),), {}, "JSON cannot represent"),
        (([1, b"raw"],), {}, "Argument 0 of tests.support.tasks.add()[1]"),
    ],
)
def test_arguments_that_do_not_survive_json_are_refused(r, args, kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)) as refused:
        tasks.add.enqueue(*args, **kwargs)
    assert str(refused.value).startswith(("Unsupported type: ", "Unsupported value: "))
    assert r.keys("*") == []


def test_unknown_queue_is_refused_at_the_call_site(r):
    with pytest.raises(InvalidTask, match=r"^Queue 'urgent' is not valid for backend\. It is"):
        tasks.add.using(queue_name="urgent").enqueue(1, 2)
    assert r.keys("*") == []


def test_empty_queues_accept_any_queue_name_and_workers_find_them(r):
    """QUEUES: [] means any queue name is valid, as in Django; a worker given no queue
    serves every queue used, in alphabetical order."""
    backend = task_backends["anyqueue"]
    first = tasks.record.using(backend="anyqueue", queue_name="zeta").enqueue("z")
    second = tasks.record.using(backend="anyqueue", queue_name="alpha").enqueue("a")
    with pytest.raises(InvalidTask, match=r"^Queue 'no/slash' is not valid for backend"):
        tasks.record.using(backend="anyqueue", queue_name="no/slash").enqueue("x")
    assert backend.served_queues() == ["alpha", "zeta"]
    run_worker_here(backend)
    assert r.lrange(tasks.LOG, 0, -1) == ["a", "z"]
    assert backend.get_result(first.id).status == backend.get_result(second.id).status
    assert backend.get_result(first.id).status == "SUCCESSFUL"


def test_oversized_payload_is_refused(r):
    with pytest.raises(ValueError, match="MAX_PAYLOAD_BYTES"):
        tasks.record.enqueue("x" * (600 * 1024))
    assert r.keys("*") == []


def test_calling_the_task_runs_it_inline(r):
    assert tasks.add(2, 5) == 7
    assert r.keys("*") == []


def test_both_decorators_make_the_same_kind_of_task(r, backend):
    assert type(tasks.made_by_django) is RedisTask
    assert type(tasks.add) is RedisTask
    result = tasks.made_by_django.enqueue(21)
    assert queued(r, "low") == [result.id]
    assert tasks.made_by_django.delay(1).status == TaskResultStatus.READY


def test_get_result_of_unknown_id_raises(backend):
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("no-such-job")


@not_on_cluster  # django-redis serves no cluster
def test_a_django_redis_connection_alias_works(r):
    result = tasks.add.using(backend="cached").enqueue(1, 2)
    assert r.zrange(CACHED_KEYS.queue("default"), 0, -1) == [result.id]
    assert task_backends["cached"].get_result(result.id).args == [1, 2]


@not_on_cluster  # Django's Redis cache serves no cluster
def test_a_django_redis_cache_alias_shares_its_connection_pool(r):
    cache = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": settings.CACHES["default"]["LOCATION"],
    }
    backend_settings = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"CONNECTION": "django"},
    }
    with override_settings(
        CACHES={**settings.CACHES, "django": cache},
        TASKS={**settings.TASKS, "django-cache": backend_settings},
    ):
        backend = task_backends["django-cache"]
        django_cache = caches["django"]
        client = backend.get_client()
        assert client.connection_pool is django_cache._cache.get_client(write=True).connection_pool
        result = tasks.add.using(backend="django-cache").enqueue(1, 2)
        assert r.zrange(backend.keys.queue("default"), 0, -1) == [result.id]
        django_cache.set("shared", "yes")  # the cache goes on working beside the queue
        run_worker_here(backend)
        assert backend.get_result(result.id).return_value == 3
        assert django_cache.get("shared") == "yes"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"QUEUES": "default"}, "must be a list of queue names"),
        ({"QUEUES": ["a b"]}, "invalid queue name 'a b'"),
        ({"QUEUES": ["a", "a"]}, "lists a queue twice"),
        ({"OPTIONS": {"URLL": "redis://"}}, "unknown option(s) URLL"),
        ({"OPTIONS": {"URL": "redis://", "CONNECTION": "default"}}, "both CONNECTION and URL"),
        ({"OPTIONS": {"LEASE": 0}}, "LEASE"),
    ],
)
def test_bad_settings_say_what_to_fix(params, message):
    conf = {"BACKEND": "django_redisqueue.backend.RedisQueueBackend", **params}
    with override_settings(TASKS={"default": conf}):
        task_backends["default"]  # built without reading OPTIONS, so that checks can run
        # A task defined as its module is imported: no error there either, so that the
        # system checks, which import the URLconf and its views' tasks, can run.
        defined = task(tasks.add.func)
        with pytest.raises(ConfigurationError) as exc:
            defined.enqueue(1, 2)
    assert message in str(exc.value)
    assert re.search(r"^\(django_redisqueue\.E00\d\) TASKS\['default'\]", str(exc.value))


def test_enqueue_many_sends_every_job_in_one_call_in_order(r, backend):
    keys_server(r).config_resetstat()
    results = tasks.add.enqueue_many([((i, 1), {}) for i in range(5)] + [((), {"a": 9, "b": 1})])

    assert scripts_run(r) == 1
    assert queued(r) == [result.id for result in results]
    assert all(result.enqueued_at is not None for result in results)
    assert [backend.get_result(result.id).args for result in results[:2]] == [[0, 1], [1, 1]]
    assert backend.get_result(results[-1].id).kwargs == {"a": 9, "b": 1}
    run_worker_here(backend)
    assert [result.wait(timeout=5) for result in results] == [1, 2, 3, 4, 5, 10]


def test_enqueue_many_checks_every_job_before_sending_any(r):
    with pytest.raises(TypeError, match="Argument 0"):
        tasks.add.enqueue_many([((1, 2), {}), ((object(), 2), {})])
    assert queued(r) == []


def test_enqueue_many_of_a_delayed_task_fills_the_delayed_set(r, backend):
    results = tasks.noop.using(delay=60).enqueue_many([((), {})] * 3)
    delayed = r.zrange(DEFAULT_KEYS.delayed("default"), 0, -1, withscores=True)
    assert sorted(delayed) == sorted(
        (res.id, int(res.task.run_after.timestamp() * 1000)) for res in results
    )
    assert queued(r) == []


@not_on_cluster
def test_a_refusal_is_told_from_no_answer(r):
    """Out of memory, the enqueue is refused whole, and the entries beside the one it
    would have written stay (Redis 6.2 refuses a script's first write, not the call)."""
    first = tasks.add.enqueue(1, 1)
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(BrokerUnavailable, match=r"Redis refused it .*(OutOfMemoryError|-OOM)"):
            tasks.add.enqueue(1, 2)
        beside = NewJob(first.id[:3] + "0" * 23, "default", 0, first._payload)
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            first.task.get_backend().broker.enqueue([beside])
    finally:
        r.config_set("maxmemory", 0)
    assert r.hkeys(DEFAULT_KEYS.entries(first.id)) == [first.id]


@pytest.fixture
def only_the_frameworks_receiver():
    """task_enqueued with only the framework's DEBUG line listening: the test tasks'
    own receiver, for the signal tests, is disconnected meanwhile."""
    task_enqueued.disconnect(tasks.record_signal)
    yield
    task_enqueued.connect(tasks.record_signal)


def test_task_enqueued_reaches_every_receiver_and_the_frameworks_debug_line(
    r, caplog, only_the_frameworks_receiver
):
    """task_enqueued is not sent while only the framework's DEBUG line would hear it
    and nobody logs it; a receiver connected later, for any sender or this backend's,
    hears it, as does that line once DEBUG is on."""
    heard = []

    def receiver(sender, task_result, **kwargs):
        heard.append(task_result.id)

    with patch.object(task_enqueued, "send", side_effect=AssertionError("sent")):
        tasks.add.enqueue(1, 1)
    for sender in (None, RedisQueueBackend):
        task_enqueued.connect(receiver, sender=sender)
        try:
            result = tasks.add.enqueue(2, 2)
        finally:
            task_enqueued.disconnect(receiver, sender=sender)
        assert heard[-1:] == [result.id]
    tasks.add.enqueue(3, 3)
    assert len(heard) == 2
    with caplog.at_level(logging.DEBUG, logger=TASKS_PACKAGE):
        logged = tasks.add.enqueue(4, 4)
    assert [r.name for r in caplog.records if logged.id in r.getMessage()] == [TASKS_PACKAGE]


def test_a_receiver_connected_while_another_thread_asks_who_listens_hears_later_enqueues(
    r, only_the_frameworks_receiver
):
    """One thread reads the receivers, another connects one (which empties the signal's
    cache), then the first keeps its verdict: it must not keep it over the connect."""
    read, connected = threading.Event(), threading.Event()
    live_receivers = task_enqueued._live_receivers
    heard = []

    def receivers_read_before_a_connect(sender):
        found = live_receivers(sender)
        read.set()
        connected.wait(5)
        return found

    def receiver(sender, task_result, **kwargs):
        heard.append(task_result.id)

    def connect_meanwhile():
        read.wait(5)
        task_enqueued.connect(receiver, weak=False)
        connected.set()

    try:
        with patch.object(task_enqueued, "_live_receivers", receivers_read_before_a_connect):
            other = threading.Thread(target=connect_meanwhile)
            other.start()
            enqueued_is_heard(RedisQueueBackend)
            other.join()
        result = tasks.add.enqueue(1, 1)
        assert heard == [result.id]
    finally:
        task_enqueued.disconnect(receiver)


def test_a_child_process_draws_job_ids_of_its_own(r):
    """Ids are drawn from the system's random source many at a time: a child forked
    after the parent drew them must not hand out the parent's next ones."""
    new_job_id()  # the parent holds ids drawn ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, " ".join(new_job_id() for _ in range(300)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        child = answer.read().decode().split()
    os.waitpid(pid, 0)
    parent = [new_job_id() for _ in range(300)]
    assert len(child) == 300
    assert not set(child) & set(parent)
