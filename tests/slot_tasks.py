"""Tasks of the tests of many jobs at once (test_async_tasks.py, test_slots.py): what
they record goes to tests.tasks.LOG."""

import asyncio
import threading

from asgiref.sync import sync_to_async

from django_redisqueue import task
from tests.tasks import LOG, client

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
    r.rpush(LOG, f"loop:{_where()}")
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
        client().rpush(LOG, "cancelled")
        raise
    client().rpush(LOG, "slept")


@task
async def awaits_until_released(label: str, seconds: float) -> bool:
    """Report "started:<label>", then await until the test pushes to RELEASE; report
    "cancelled:<label>" if it is cancelled first."""
    r = client()
    r.rpush(LOG, f"started:{label}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while not r.llen(RELEASE):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        r.rpush(LOG, f"cancelled:{label}")
        raise
    r.rpush(LOG, f"done:{label}")
    return True


@task
async def thread_of_its_sync_calls() -> str:
    """The name of the thread its thread-sensitive calls (the ORM's) run on."""
    return await sync_to_async(lambda: threading.current_thread().name)()


@task(timeout=0.5)
def blocks_in_c() -> None:
    """Wait on a lock nobody releases: a C call no exception raised in its thread ends."""
    client().rpush(LOG, "blocked")
    threading.Event().wait()
