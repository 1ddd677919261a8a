"""Tasks the tests enqueue. They report to Redis (the ``log`` list) so that the tests
can see what ran, in which order, across processes."""

import os
import signal
import time

import redis

from django_redisqueue import task
from django_redisqueue.compat import django_task

LOG = "test:log"


def client() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDISQUEUE_TEST_URL"], decode_responses=True)


@task
def add(a, b):
    return a + b


@task
def noop():
    return None


@task(queue_name="high", priority=10)
def urgent(label):
    client().rpush(LOG, label)


@task
def record(label):
    client().rpush(LOG, label)


@task
def fail(message):
    raise ValueError(message)


@task
def returns_object():
    return object()


@task(takes_context=True)
def attempt_number(context, label):
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@django_task(backend="default", queue_name="low")
def made_by_django(x):
    return x * 2


@task
def rendezvous(me, peer, timeout):
    """Say "arrived" and wait for the peer: only two jobs running at once both meet."""
    r = client()
    r.rpush(f"test:arrived:{me}", 1)
    return r.blpop(f"test:arrived:{peer}", timeout) is not None


@task
def block_until_released(label, timeout):
    """Report "started", then run until the test pushes to test:release."""
    r = client()
    r.rpush(LOG, f"started:{label}")
    released = r.blpop("test:release", timeout) is not None
    r.rpush(LOG, f"done:{label}")
    return released


@task(retries=3, retry_backoff=0.2, retry_jitter=False)
def always_fails(label):
    client().rpush(f"test:attempts:{label}", time.time())
    raise ValueError(f"attempt failed: {label}")


@task(retries=2, retry_backoff=0.05)
def fails_once(label):
    if client().incr(f"test:tries:{label}") == 1:
        raise ConnectionError("first try fails")
    return "second try worked"


@task(retries=3, retry_on=(KeyError,))
def fails_with_value_error():
    raise ValueError("not a KeyError: no retry")


@task
def kill_own_worker():
    os.kill(os.getpid(), signal.SIGKILL)
