"""Django's own tests of its task backends (tests/tasks/ in Django's repository), run
on this backend: what applies to a backend with a real worker, through
``runworker --burst`` against real Redis. Plus async tasks, the task context on
retries, and the signals in the processes that send them.

The test names follow Django's where there is one to follow.
"""

import dataclasses
import json
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string

from django_redisqueue import RedisTask, RedisTaskResult, task
from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.compat import (
    DEFAULT_TASK_QUEUE_NAME,
    DJANGO_TASK_TAKES_OPTIONS,
    TASKS_PICKLE,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    django_task,
    task_backends,
)
from django_redisqueue.store.gateway import now_ms
from tests.conftest import manage, start_manage, wait_until
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS


def run_worker(*args: str) -> str:
    """Run ``runworker --burst`` to the end; return its log."""
    done = manage("runworker", "--burst", *args)
    assert done.returncode == 0, done.stderr
    return done.stderr


def queued_ids(r, queue=DEFAULT_TASK_QUEUE_NAME):
    return r.zrange(DEFAULT_KEYS.queue(queue), 0, -1)


@contextmanager
def running(*commands: str) -> Iterator[None]:
    """Background ``manage.py`` commands for the length of a ``with`` block."""
    processes = [start_manage(command) for command in commands]
    try:
        yield
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            output = process.communicate(timeout=30)[0]
            assert process.returncode == 0, output


def assert_finished_in_order(result):
    assert result.is_finished
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


# The backend (Django: test_custom_backend, test_using_correct_backend)


def test_the_backend_supports_every_feature_of_the_contract():
    backend = task_backends["default"]
    assert default_task_backend.alias == backend.alias == "default"
    assert isinstance(backend, BaseTaskBackend)
    assert isinstance(backend, RedisQueueBackend)
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task
    assert backend.options == {"URL": os.environ["REDISQUEUE_TEST_URL"]}


# Tasks (Django: test_tasks.TaskTestCase)


def test_task_decorator():
    made = [
        tasks.noop_any,  # @task
        tasks.noop_from_call,  # @task()
        tasks.noop_async,  # @task on async def
        tasks.made_by_django,  # Django's @task
    ]
    for made_task in made:
        assert isinstance(made_task, Task)
        assert type(made_task) is RedisTask


def test_using_priority_queue_name_run_after_backend():
    now = timezone.now()
    noop = tasks.noop_any
    assert noop.using(priority=1).priority == 1
    assert noop.using(queue_name="low").queue_name == "low"
    assert noop.using(run_after=now).run_after == now
    assert noop.using(backend="leased").backend == "leased"
    assert (noop.priority, noop.queue_name, noop.run_after, noop.backend) == (
        0,
        DEFAULT_TASK_QUEUE_NAME,
        None,
        "default",
    )


def test_using_creates_new_instance_and_chains():
    now = timezone.now()
    copy = tasks.noop_any.using()
    assert copy == tasks.noop_any
    assert copy is not tasks.noop_any

    later = tasks.noop_any.using(run_after=now)
    urgent_later = later.using(priority=10)
    assert (urgent_later.priority, urgent_later.run_after) == (10, now)
    assert later.priority == 0
    assert type(urgent_later) is RedisTask


def test_using_unknown_backend():
    with pytest.raises(InvalidTaskBackend, match="'unknown' doesn't exist"):
        tasks.noop_any.using(backend="unknown")


def test_naive_datetime():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        tasks.noop_any.using(run_after=datetime.now())


@pytest.mark.parametrize("priority", [-101, 101, 3.1])
def test_invalid_priority(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks.noop_any.using(priority=priority)


def test_valid_priorities():
    for priority in (-100, 0, 100):
        assert tasks.noop_any.using(priority=priority).priority == priority


def test_unknown_queue_name():
    with pytest.raises(InvalidTask, match=r"Queue 'queue-2' is not valid for backend\."):
        tasks.noop_any.using(queue_name="queue-2")
    # With an empty QUEUES, as in Django, any queue name is valid.
    assert tasks.noop_any.using(backend="anyqueue", queue_name="queue-2").queue_name == "queue-2"


def test_call_task():
    assert tasks.meaning_of_life.call() == 42
    assert tasks.meaning_of_life() == 42  # RedisTask is callable too
    assert async_to_sync(tasks.meaning_of_life.acall)() == 42
    assert async_to_sync(tasks.noop_async.acall)() is None
    assert tasks.noop_async.call() is None
    assert tasks.meaning_of_life_async.call() == 42


def nested_function():
    def inner():
        pass

    return inner


class Holder:
    def method(self):
        pass


@pytest.mark.parametrize("decorator", [task, django_task], ids=["ours", "django's"])
@pytest.mark.parametrize(
    "function", [any, nested_function(), Holder().method], ids=["builtin", "nested", "method"]
)
def test_invalid_function(decorator, function):
    with pytest.raises(InvalidTask, match="Task function must be defined at a module level"):
        decorator()(function)


@pytest.mark.parametrize("decorator", [task, django_task], ids=["ours", "django's"])
def test_takes_context_without_taking_context(decorator):
    with pytest.raises(InvalidTask, match="does not have a first argument of 'context'"):
        decorator(takes_context=True)(tasks.meaning_of_life.func)


@pytest.mark.parametrize("decorator", [task, django_task], ids=["ours", "django's"])
def test_run_after_in_decorator(decorator):
    with pytest.raises(TypeError):
        decorator(run_after=timezone.now())(tasks.meaning_of_life.func)


def test_get_backend_name_and_module_path():
    assert tasks.noop_any.get_backend() is task_backends["default"]
    assert tasks.noop_any.using(backend="leased").get_backend() is task_backends["leased"]
    assert tasks.noop_any.name == "noop_any"
    assert tasks.noop_async.name == "noop_async"
    assert tasks.noop_any.module_path == "tests.support.tasks.noop_any"
    assert import_string(tasks.noop_any.module_path) is tasks.noop_any
    assert import_string(tasks.noop_async.module_path) is tasks.noop_async


@pytest.mark.skipif(not TASKS_PICKLE, reason="tasks pickle from Django 6.1 on")
def test_pickle_task_and_result():
    with_options = tasks.with_options.using(priority=5)
    assert pickle.loads(pickle.dumps(with_options)) == with_options
    result = tasks.noop_any.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result


# Extra options through the decorators (this app's retry policy and time limit)


def test_our_decorator_passes_options_on_every_version():
    assert type(tasks.with_options) is RedisTask
    assert (tasks.with_options.retries, tasks.with_options.timeout) == (2, 30)
    assert tasks.with_options.using(priority=3).retries == 2


@pytest.mark.skipif(not DJANGO_TASK_TAKES_OPTIONS, reason="Django 6.0's @task takes no options")
def test_djangos_decorator_passes_options(r):
    made = tasks.django_with_options
    assert type(made) is RedisTask
    assert (made.retries, made.retry_backoff) == (1, 0.05)
    result = made.enqueue("x")
    with running("runworker", "runscheduler"):
        assert result.wait(timeout=30) == "second try worked"
    assert result.attempts == 2


@pytest.mark.skipif(DJANGO_TASK_TAKES_OPTIONS, reason="this Django's @task takes options")
def test_djangos_decorator_refuses_options_where_django_does():
    with pytest.raises(TypeError):
        django_task(retries=1)(tasks.meaning_of_life.func)


# Enqueueing (Django: test_enqueue_task*, the dummy backend's tests)


def test_enqueue_task(r):
    for made_task in (tasks.noop_any, tasks.noop_async):
        result = made_task.enqueue(1, two=3)

        assert isinstance(result, RedisTaskResult)
        assert result.status == TaskResultStatus.READY
        assert not result.is_finished
        assert result.enqueued_at is not None
        assert result.started_at is None
        assert result.finished_at is None
        with pytest.raises(ValueError, match="Task has not finished yet"):
            result.return_value  # noqa: B018
        assert result.task == made_task
        assert (result.args, result.kwargs) == ([1], {"two": 3})
        assert result.attempts == 0
    assert len(queued_ids(r)) == 2


def test_enqueue_task_async(r):
    for made_task in (tasks.noop_any, tasks.noop_async):
        result = async_to_sync(made_task.aenqueue)()
        assert result.status == TaskResultStatus.READY
        assert result.task == made_task
        assert (result.args, result.kwargs) == ([], {})
        assert result.id in queued_ids(r)


def test_enqueue_with_invalid_argument(r):
    with pytest.raises(TypeError):
        tasks.noop_any.enqueue(datetime.now())
    with pytest.raises(TypeError):
        async_to_sync(tasks.noop_any.aenqueue)(datetime.now())
    assert r.keys("*") == []


def test_validate_on_enqueue(r):
    made_for_low = tasks.noop_any.using(queue_name="low")
    only_default = {
        "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"URL": os.environ["REDISQUEUE_TEST_URL"]},
    }
    with override_settings(TASKS={"default": only_default}):
        with pytest.raises(InvalidTask, match=r"^Queue 'low' is not valid for backend\."):
            made_for_low.enqueue()
        with pytest.raises(InvalidTask, match=r"^Queue 'low' is not valid for backend\."):
            async_to_sync(made_for_low.aenqueue)()
    assert r.keys("*") == []


@pytest.mark.django_db(transaction=True)
def test_doesnt_wait_until_transaction_commit_by_default(r):
    with transaction.atomic():
        result = tasks.noop_any.enqueue()
        assert result.enqueued_at is not None
        assert queued_ids(r) == [result.id]  # in Redis before the commit


# Results (Django: test_get_result*, test_refresh_result*)


def test_get_result(backend):
    result = backend.enqueue(tasks.noop_any, (), {})
    assert tasks.noop_any.get_result(result.id) == result
    assert backend.get_result(result.id) == result
    assert async_to_sync(tasks.noop_any.aget_result)(result.id) == result
    assert async_to_sync(backend.aget_result)(result.id) == result


def test_get_missing_result(backend):
    for get_result in (
        backend.get_result,
        tasks.noop_any.get_result,
        async_to_sync(backend.aget_result),
        async_to_sync(tasks.noop_any.aget_result),
    ):
        with pytest.raises(TaskResultDoesNotExist):
            get_result("123")


def test_get_incorrect_result():
    result = tasks.noop_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        tasks.noop_any.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(tasks.noop_any.aget_result)(result.id)


def test_refresh_result():
    result = tasks.noop_any.enqueue()
    original = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original

    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    copy = tasks.noop_any.get_result(result.id)
    async_to_sync(copy.arefresh)()
    assert copy == result


# Running (Django: the immediate backend's tests, here through the worker)


def test_enqueue_task_runs_in_the_worker(r):
    results = [made.enqueue(1, two=3) for made in (tasks.noop_any, tasks.noop_async)]
    results.append(async_to_sync(tasks.noop_async.aenqueue)())
    run_worker()

    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert_finished_in_order(result)
        assert result.return_value is None
        assert result.attempts == 1
        assert len(result.worker_ids) == 1
    assert (results[1].args, results[1].kwargs) == ([1], {"two": 3})


def test_result():
    sync = tasks.meaning_of_life.enqueue()
    coroutine = async_to_sync(task_backends["default"].aenqueue)(
        tasks.meaning_of_life_async, (), {}
    )
    tuple_ = tasks.returns_tuple.enqueue()
    run_worker()
    assert sync.wait(timeout=5) == 42
    assert coroutine.wait(timeout=5) == 42
    assert tuple_.wait(timeout=5) == [1, "two"]  # a JSON round trip, as Django's
    async_to_sync(sync.arefresh)()
    assert sync.return_value == 42


@pytest.mark.parametrize(
    ("made_task", "exception", "message"),
    [
        (tasks.raises_value_error, ValueError, "This task failed due to ValueError"),
        (tasks.raises_system_exit, SystemExit, "This task failed due to SystemExit"),
        # Django's immediate backend lets it reach the caller; a worker fails the job.
        (tasks.raises_keyboard_interrupt, KeyboardInterrupt, "raised by the task"),
    ],
    ids=["ValueError", "SystemExit", "KeyboardInterrupt"],
)
def test_catches_exception(made_task, exception, message):
    result = made_task.enqueue()
    after = tasks.meaning_of_life.enqueue()  # the worker carries on after the failure
    log = run_worker()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert_finished_in_order(result)
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert (result.args, result.kwargs) == ([], {})
    assert f"Job {result.id} tests.support.tasks.{made_task.name} FAILED" in log
    assert after.wait(timeout=5) == 42


def test_complex_exception():
    result = tasks.complex_exception.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_complex_return_value():
    result = tasks.complex_return_value.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert_finished_in_order(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


# Priority and deferral: the capabilities the flags promise


def test_priority_larger_runs_sooner_first_in_first_out_among_equals(r):
    order = [0, -100, 100, 5, 0, -100, 100, 5, 99, -99, 0]
    for i, priority in enumerate(order):
        tasks.record.using(priority=priority).enqueue(f"{priority}:{i}")
    run_worker()
    expected = sorted(
        (f"{priority}:{i}" for i, priority in enumerate(order)),
        key=lambda label: (-int(label.split(":")[0]), int(label.split(":")[1])),
    )
    assert r.lrange(tasks.LOG, 0, -1) == expected


def test_run_after_is_honoured(r):
    run_after = timezone.now() + timedelta(seconds=1)
    later = tasks.meaning_of_life.using(run_after=run_after).enqueue()
    now = tasks.noop_any.enqueue()
    run_worker()
    assert now.wait(timeout=5) is None
    later.refresh()
    assert later.status == TaskResultStatus.READY  # not due: the worker left it alone
    assert abs(later.task.run_after - run_after) < timedelta(milliseconds=1)

    due_ms = r.zscore(DEFAULT_KEYS.delayed("default"), later.id)
    wait_until(lambda: now_ms() >= due_ms, 10, "the due time")
    assert manage("runscheduler", "--burst").returncode == 0
    run_worker()
    assert later.wait(timeout=5) == 42
    assert later.started_at >= run_after


# The task context (Django: test_takes_context, test_context)


def test_takes_context():
    result = tasks.get_task_id.enqueue()
    context = tasks.check_context.enqueue(1)
    coroutine = tasks.async_with_context.enqueue(21)
    run_worker()
    assert result.wait(timeout=5) == result.id
    assert context.wait(timeout=5) == 1
    assert coroutine.wait(timeout=5) == {"id": coroutine.id, "attempt": 1, "double": 42}


def test_context_attempt_on_retries(r):
    result = tasks.fails_twice.enqueue("x")
    with running("runworker", "runscheduler"):
        assert result.wait(timeout=30) == 3
    assert r.lrange("test:context:x", 0, -1) == ["1", "2", "3"]
    assert result.attempts == 3
    assert [e.exception_class for e in result.errors] == [ConnectionError, ConnectionError]


# Signals: task_enqueued where the job is enqueued, task_started and task_finished in
# the worker, each with the result as it stands then.


def test_signals_fire_in_the_right_process_with_the_right_result(r):
    ok = tasks.signalled_ok.enqueue(1)
    failing = tasks.signalled_fail.enqueue()
    run_worker()

    seen = [json.loads(entry) for entry in r.lrange("test:signals", 0, -1)]
    assert {entry["sender"] for entry in seen} == {"RedisQueueBackend"}
    enqueued = [e for e in seen if e["signal"] == "enqueued"]
    assert [(e["id"], e["status"], e["pid"], e["enqueued"]) for e in enqueued] == [
        (ok.id, "READY", os.getpid(), True),
        (failing.id, "READY", os.getpid(), True),
    ]
    in_worker = [e for e in seen if e["signal"] != "enqueued"]
    assert {e["pid"] for e in in_worker} != {os.getpid()}
    assert len({e["pid"] for e in in_worker}) == 1
    assert [(e["signal"], e["id"], e["status"]) for e in in_worker] == [
        ("started", ok.id, "RUNNING"),
        ("finished", ok.id, "SUCCESSFUL"),
        ("started", failing.id, "RUNNING"),
        ("finished", failing.id, "FAILED"),
    ]
    assert in_worker[1]["return_value"] == 2
    assert in_worker[3]["errors"] == ["builtins.ValueError"]
