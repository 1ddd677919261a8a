"""Tasks of the tests of many jobs at once (tests/test_slots*.py, test_async_tasks.py):
each leaves in Redis which process and thread ran it, and what it overlapped.
Registered by tests/support/tasks.py, which imports this module."""

import asyncio
import json
import os
import threading
import time

from asgiref.sync import sync_to_async
from django.db import connections

from django_redisqueue import task
from tests.support import tasks


def client():
    """tests.support.tasks.client, read when called: this module is imported by that one."""
    return tasks.client()


SLOT_RUNS = "test:slots:runs"  # "start|end <number> <pid> <attempt>", in order
SLOT_HOLD = "test:slots:hold"  # while it exists, a slot_run that starts holds its slot

# Count a job in under a key, keeping the most seen at once, in one atomic step:
# KEYS[1] the running count, KEYS[2] the most.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
return now
"""


def overlap_key(name: str) -> tuple[str, str]:
    """The running count and the most seen at once of the jobs counted under ``name``."""
    return f"test:overlap:{name}:running", f"test:overlap:{name}:most"


def _counted(name: str, hold: float) -> None:
    """Count this job in under ``name`` while it holds for ``hold`` s."""
    running, most = overlap_key(name)
    r = client()
    r.eval(_ENTER, 2, running, most)
    try:
        time.sleep(hold)
    finally:
        r.decr(running)


@task(takes_context=True)
def slot_run(context, number, ms):
    """A kill chaos job: say it started (its number, its worker's pid, its attempt),
    hold while SLOT_HOLD exists (for up to a minute), run ``ms`` ms, say it ended."""
    r, run = client(), f"{number} {os.getpid()} {context.attempt}"
    r.rpush(SLOT_RUNS, f"start {run}")
    deadline = time.monotonic() + 60
    while r.exists(SLOT_HOLD) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(ms / 1000)
    r.rpush(SLOT_RUNS, f"end {run}")


@task(concurrency_limit=1)
def one_at_a_time(label, hold):
    """Limited to one at a time: counted under its task's name while it runs."""
    _counted("one_at_a_time", hold)
    client().rpush("test:slots:done", label)
    return label


@task(concurrency_limit=2, limit_key="two-at-a-time")
def two_at_a_time(label, hold):
    """Two at a time, by a limit key of its own."""
    _counted("two-at-a-time", hold)
    client().rpush("test:slots:done", label)
    return label


@task(unique=True)
def unique_counted(key, hold):
    """Unique by ``key``: counted under it while it runs."""
    _counted(f"unique:{key}", hold)
    client().rpush(f"test:slots:unique:{key}", 1)
    return key


@task(takes_context=True, retries=2, retry_backoff=0.05, retry_jitter=False)
def fails_twice_counted(context, label, hold):
    """Record each attempt, fail the first two; hold ``hold`` s, counted as a free job."""
    client().rpush(f"test:slots:attempts:{label}", context.attempt)
    _counted("free", hold)
    if context.attempt < 3:
        raise ConnectionError(f"attempt {context.attempt} fails")
    return context.attempt


@task
async def rendezvous_async(me, peer, timeout):
    """tests.support.tasks.rendezvous as a coroutine, which waits on the loop, not in Redis."""
    r = client()
    r.rpush(f"test:arrived:{me}", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.lpop(f"test:arrived:{peer}") is not None:
            return True
        await asyncio.sleep(0.01)
    return False


@task
async def steps_until_released_async(label, timeout):
    """tests.support.tasks.steps_until_released as a coroutine: waits on its loop."""
    r = client()
    r.rpush(tasks.LOG, f"started:{label}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.lpop("test:release") is not None:
            r.rpush(tasks.LOG, f"done:{label}")
            return True
        await asyncio.sleep(0.01)
    return False


# The database's tests (tests/test_slots_db.py): jobs on the "postgresql" alias that
# say which server process (backend pid) served them, from which thread, and how many
# connections the test database had open meanwhile.

PG_JOBS = "test:pg:jobs"
_USERS = "test:pg:users:"  # a set per backend pid: the threads using it now
COUNT_OPEN = (
    "SELECT pg_backend_pid(), count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND backend_type = 'client backend'"
)


@task
def pg_job(label, meet, timeout):
    """Query PostgreSQL from this job's thread; with ``meet``, first wait until that
    many jobs hold a connection at once. Record the backend pid, the thread, whether
    the thread had no connection open as the job began, the open connections seen, and
    how many threads used the pid at once."""
    r, connection, thread = client(), connections["postgresql"], threading.get_ident()
    fresh = connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
        users = r.eval("redis.call('SADD', KEYS[1], ARGV[1]) return redis.call('SCARD', KEYS[1])",
                       1, f"{_USERS}{pid}", thread)  # fmt: skip
        if meet:  # a barrier: the last to arrive lets every one go
            if r.incr("test:pg:arrived") == meet:
                r.rpush("test:pg:go", *[1] * meet)
            r.blpop("test:pg:go", timeout)
        cursor.execute(COUNT_OPEN)
        same_pid, open_connections = cursor.fetchone()
        r.srem(f"{_USERS}{pid}", thread)
    entry = {
        "label": label, "pid": pid, "same_pid": same_pid == pid, "thread": thread,
        "fresh": fresh, "open": open_connections, "users": users,
        "sharing": connection.allow_thread_sharing,
    }  # fmt: skip
    r.rpush(PG_JOBS, json.dumps(entry))


# The event loop's tests (tests/test_async_tasks.py).

ARRIVED = "test:arrived"
RELEASE = "test:release"


def _where() -> str:
    """The loop this runs on, and its thread's name."""
    return f"{id(asyncio.get_running_loop())}@{threading.current_thread().name}"


@task
async def meets_on_the_loop(me: str, others: list[str], seconds: float) -> bool:
    """Record where it runs, then wait, without holding the loop, until ``others``
    have arrived too: True if they did within ``seconds`` (they ran at once)."""
    r = client()
    r.rpush(tasks.LOG, f"loop:{_where()}")
    r.sadd(ARRIVED, me)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not set(others) <= r.smembers(ARRIVED):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@task(timeout=0.5)
async def awaits_past_its_timeout(seconds: float) -> None:
    """Await longer than its timeout; say when it is cancelled."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        client().rpush(tasks.LOG, "cancelled")
        raise
    client().rpush(tasks.LOG, "slept")


@task
async def awaits_until_released(label: str, seconds: float) -> bool:
    """Report "started:<label>", then await until the test pushes to RELEASE; report
    "cancelled:<label>" if it is cancelled first."""
    r = client()
    r.rpush(tasks.LOG, f"started:{label}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while not r.llen(RELEASE):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        r.rpush(tasks.LOG, f"cancelled:{label}")
        raise
    r.rpush(tasks.LOG, f"done:{label}")
    return True


@task
async def thread_of_its_sync_calls() -> str:
    """The name of the thread its thread-sensitive calls (the ORM's) run on."""
    return await sync_to_async(lambda: threading.current_thread().name)()


@task(timeout=0.5)
def blocks_in_c() -> None:
    """Wait on a lock nobody releases: a C call no exception raised in its thread ends."""
    client().rpush(tasks.LOG, "blocked")
    threading.Event().wait()


@task(timeout=0.5, retries=1, retry_backoff=600)
def blocks_in_c_retried() -> None:
    """The same, with a retry policy: a give-up follows it (its retry far off)."""
    client().rpush(tasks.LOG, "blocked, retried")
    threading.Event().wait()


@task(timeout=0.5)
async def swallows_its_cancellation() -> str:
    """Swallow the time limit's cancellation at its await, then return a value."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        client().rpush(tasks.LOG, "swallowed")
    return "returned"


@task(timeout=0.5)
async def catches_the_time_limit_in_a_sync_call() -> str:
    """Catch what its thread-sensitive call (the ORM's) raises, as a task catches a
    database error; the time limit comes in the middle of that call."""
    try:
        await sync_to_async(time.sleep)(2)
    except Exception as exc:
        client().rpush(tasks.LOG, f"caught {type(exc).__name__}")
    return "returned"


@task(timeout=0.5)
async def blocks_the_loop(seconds: float) -> None:
    """A sync call inside an ``async def``: it holds the event loop for ``seconds``."""
    client().rpush(tasks.LOG, "blocking")
    time.sleep(seconds)
