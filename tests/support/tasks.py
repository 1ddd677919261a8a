"""Tasks the tests enqueue. They report to Redis (the ``log`` list) so that the tests
can see what ran, in which order, across processes."""

import asyncio
import json
import logging
import os
import signal
import sys
import time
import warnings

import redis

from django_redisqueue import task
from django_redisqueue.compat import (
    DJANGO_TASK_TAKES_OPTIONS,
    TaskContext,
    TaskResultStatus,
    django_task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_redisqueue.exceptions import WorkerShutdown
from tests.support import slot_tasks  # noqa: F401  (the tasks of tests/test_slots*.py, registered)
from tests.support.topology import make_client

LOG = "test:log"


_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    """A client of the Redis the tests use, made once per process."""
    url = os.environ["REDISQUEUE_TEST_URL"]
    if url not in _clients:
        _clients[url] = make_client(url, decode_responses=True)
    return _clients[url]


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
def logs_and_warns(message):
    """Log as a project's task does (a warning, an exception), and warn."""
    logger = logging.getLogger(__name__)
    logger.warning("%s\nsecond line", message)
    try:
        raise KeyError(message)
    except KeyError:
        logger.exception("caught %s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=1)
    print(message, "printed\nover two lines")
    sys.stderr.write(f"{message} written to stderr\n")


@task
def collect(results, label):
    """A group's callback: logs its label and the members' results it was given."""
    client().rpush(LOG, json.dumps([label, results]))
    return len(results)


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


@task
def steps_until_released(label, timeout):
    """Report "started", then run Python steps until the test pushes to test:release: a
    stop from another thread lands between two steps (a blocking call ends first)."""
    r = client()
    r.rpush(LOG, f"started:{label}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.lpop("test:release") is not None:
            r.rpush(LOG, f"done:{label}")
            return True
        time.sleep(0.01)
    return False


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


# Fault tests: what runs, counted in an append-only ledger, and deaths at chosen points.


@task(retries=5, retry_backoff=0.2, retry_on=(redis.ConnectionError,))
def ledger(i, sleep_ms):
    """Run for a few ms and write to the ledger; retried if Redis is down for the write."""
    time.sleep(sleep_ms / 1000)
    client().rpush("test:ledger", i)


@task(takes_context=True)
def crash_on_start(context):
    return f"attempt {context.attempt}"


def die_when_crash_on_start_starts(sender, task_result, **kwargs):
    """Between the claim and the task body: killed by a task_started receiver."""
    if task_result.task.name == "crash_on_start" and task_result.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)


task_started.connect(die_when_crash_on_start_starts)


@task(takes_context=True)
def crash_mid_job(context):
    client().rpush(LOG, f"mid-job attempt {context.attempt}")
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"attempt {context.attempt}"


@task(takes_context=True)
def pause_before_finish(context):
    """On the first attempt, freeze Redis writes as the body ends, so the worker cannot
    store the result before the test kills it."""
    r = client()
    r.rpush(LOG, f"body done, attempt {context.attempt}")
    if context.attempt == 1:
        r.client_pause(5000, all=False)  # WRITE: the worker's finish script must wait
    return f"attempt {context.attempt}"


@task(takes_context=True)
def held(context, timeout):
    """Report the start of each attempt, wait for its own release, return the pid."""
    r = client()
    r.rpush(LOG, f"started:{context.attempt}")
    r.blpop(f"test:release:{context.attempt}", timeout)
    return os.getpid()


@task
def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


@task
def outlast_idle_connections(timeout):
    """Runs until Redis has closed every connection whose last command was a script
    (the worker's own among them): those idle longer than the server's ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(c.get("cmd") in ("fcall", "evalsha", "eval") for c in client().client_list()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Redis closed no idle connection within {timeout} s")
        time.sleep(0.05)


@task
def broadcast_record(label):
    """Sends a broadcast message that records ``label`` on every worker."""
    from django_redisqueue.core.fanout import broadcast

    broadcast(record.job(label))


@task
def record_after(label, seconds):
    time.sleep(seconds)
    record(label)


@task(timeout=0.5)
def overruns(seconds):
    time.sleep(seconds)
    return "finished"


@task(timeout=0.5)
def overruns_in_steps(seconds):
    """Python that runs past its timeout a step at a time: stopped from another thread,
    a task stops between two steps (a sleep in C ends first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return "finished"


# The conformance suite: the cases Django's own tests run on its backends.


@task
def noop_any(*args, **kwargs):
    return None


@task()
def noop_from_call(*args, **kwargs):
    return None


@task
async def noop_async(*args, **kwargs):
    return None


@task()
def meaning_of_life():
    return 42


@task
async def meaning_of_life_async():
    return 42


@task
def raises_value_error():
    raise ValueError("This task failed due to ValueError")


@task
def raises_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task
def raises_keyboard_interrupt():
    raise KeyboardInterrupt("raised by the task")


@task
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task
def complex_return_value():
    return {1, 2, 3}  # a set: not JSON


@task
def returns_tuple():
    return (1, "two")


@task(takes_context=True)
def get_task_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return context.attempt


@task(takes_context=True, retries=2, retry_backoff=0.05, retry_jitter=False)
def fails_twice(context, label):
    """Record each attempt's context, fail the first two, return the third's."""
    client().rpush(f"test:context:{label}", context.attempt)
    if context.attempt < 3:
        raise ConnectionError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
async def async_with_context(context, x):
    return {"id": context.task_result.id, "attempt": context.attempt, "double": x * 2}


@task(retries=2, retry_backoff=0.5, retry_jitter=False, timeout=30)
def with_options():
    return None


if DJANGO_TASK_TAKES_OPTIONS:

    @django_task(retries=1, retry_backoff=0.05, retry_jitter=False)
    def django_with_options(label):
        """Made by Django's own decorator, with this app's retry options."""
        if client().incr(f"test:tries:{label}") == 1:
            raise ConnectionError("first try fails")
        return "second try worked"


@task
def report_title(report_id):
    from tests.support.models import Report

    return Report.objects.get(pk=report_id).title


# Signals: where each is sent, and with what. Only for the tasks named signalled_*.


@task
def signalled_ok(x):
    return x + 1


@task
def signalled_fail():
    raise ValueError("signalled failure")


def record_signal(sender, task_result, signal, **kwargs):
    if not task_result.task.name.startswith("signalled_"):
        return
    entry = {
        "signal": SIGNAL_NAMES[signal],
        "sender": sender.__name__,
        "pid": os.getpid(),
        "id": task_result.id,
        "status": str(task_result.status),
        "enqueued": task_result.enqueued_at is not None,
        "errors": [e.exception_class_path for e in task_result.errors],
    }
    if task_result.status == TaskResultStatus.SUCCESSFUL:
        entry["return_value"] = task_result.return_value
    client().rpush("test:signals", json.dumps(entry))


SIGNAL_NAMES = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}
for _signal in SIGNAL_NAMES:
    _signal.connect(record_signal)


# Redis error tests: the ledger lives on another Redis, out of reach of the errors the
# tests inject into the queue's Redis (a task writing there would fail with them).


def client_at(url: str) -> redis.Redis:
    """A client of the Redis at ``url``, made once per process."""
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, decode_responses=True)
    return _clients[url]


@task
def ledger_at(url, i, sleep_ms):
    """Run for ``sleep_ms`` and append ``i`` to the ledger on the Redis at ``url``."""
    time.sleep(sleep_ms / 1000)
    client_at(url).rpush("test:ledger", i)


@task(concurrency_limit=1, rate_limit="100/s")
def ledger_at_limited(url, i, sleep_ms):
    """``ledger_at``, one at a time: parked and unparked while Redis fails."""
    ledger_at.call(url, i, sleep_ms)


# Unique jobs and limits: tasks that leave their starts and overlaps in ledgers, for
# tests/test_unique.py and tests/test_limits.py.

LIMITED_RUNNING = "test:limited:running"  # how many limited jobs run now, by their own count
LIMITED_MOST = "test:limited:most"  # the most that ever ran at once
LIMITED_DONE = "test:limited:done"
FREE_DONE = "test:free:done"

# INCR the running count and keep the most seen, in one atomic step.
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
return now
"""


@task(concurrency_limit=2)
def limited_two(label, hold):
    """At most two at once: count itself in while it holds for ``hold`` seconds."""
    r = client()
    r.eval(_ENTER, 2, LIMITED_RUNNING, LIMITED_MOST)
    try:
        time.sleep(hold)  # the work: long enough for starts to overlap if they could
    finally:
        r.decr(LIMITED_RUNNING)
        r.rpush(LIMITED_DONE, label)
    return label


# Two tasks under one limit key, one limited to one at a time, one by a rate only: the
# one at a time never starts while any job of the key runs.
@task(concurrency_limit=1, limit_key="mixed")
def mixed_alone(label, hold):
    time.sleep(hold)
    client().rpush(LIMITED_DONE, label)
    return label


@task(rate_limit="1000/s", limit_key="mixed")
def mixed_rated(label, hold):
    time.sleep(hold)
    client().rpush(LIMITED_DONE, label)
    return label


@task
def free_job(label):
    client().rpush(FREE_DONE, label)
    return label


@task(rate_limit="10/s")
def rate_limited(label):
    client().rpush(LIMITED_DONE, label)
    return label


@task(unique=True)
def unique_report(day):
    return day


@task(unique="rebuild", unique_for=3600)
def rebuild_once_an_hour():
    return "rebuilt"


# Fan-out: group members, callbacks, chain steps and broadcasts that leave their trace
# in ledgers, for tests/test_fanout_faults.py.

FANOUT_MEMBERS = "test:fanout:members"
FANOUT_CALLBACKS = "test:fanout:callbacks"
FANOUT_STEPS = "test:fanout:steps"
FANOUT_BROADCASTS = "test:fanout:broadcasts"
FANOUT_BUSY = "test:fanout:busy"


@task
def fanout_member(i, sleep_ms):
    """Write ``i`` to the members' ledger as it starts, run for ``sleep_ms``, return ``i``."""
    client().rpush(FANOUT_MEMBERS, i)
    time.sleep(sleep_ms / 1000)
    return i


@task(takes_context=True)
def fanout_callback(context, results, label, sleep_ms=0):
    """A group's callback: write its attempt, its pid and the results it was given as it
    starts, then run for ``sleep_ms``."""
    entry = {"label": label, "attempt": context.attempt, "pid": os.getpid(), "results": results}
    client().rpush(FANOUT_CALLBACKS, json.dumps(entry))
    time.sleep(sleep_ms / 1000)
    return len(results)


@task(retries=1, retry_backoff=0.05, retry_jitter=False)
def fanout_fails_once(label):
    """Fail the first attempt (a retry follows), succeed on the second."""
    client().rpush(FANOUT_MEMBERS, label)
    if client().incr(f"test:tries:{label}") == 1:
        raise ConnectionError("the first attempt fails")
    return label


@task
def fanout_fails_until_fixed(label):
    """Fail, without retries, until the test sets ``test:fixed:<label>``."""
    client().rpush(FANOUT_MEMBERS, label)
    if not client().exists(f"test:fixed:{label}"):
        raise ValueError(f"{label} is broken")
    return label


@task
def fanout_step(chain, step, fail):
    """A chain's step: write ``<chain>:<step>`` to the steps' ledger; raise if ``fail``."""
    client().rpush(FANOUT_STEPS, f"{chain}:{step}")
    time.sleep(0.002)  # long enough for the other chains' steps to run in between
    if fail:
        raise ValueError(f"step {step} of chain {chain} fails")
    return step


@task
def fanout_gate(i, timeout):
    """Say ``started:<i>``, then run until the test pushes to ``test:gate:<i>``."""
    r = client()
    r.rpush(FANOUT_MEMBERS, f"started:{i}")
    return r.blpop(f"test:gate:{i}", timeout) is not None


@task(takes_context=True)
def fanout_busy(context, timeout):
    """Keep a worker busy: say ``<attempt>:<pid>``, run until ``test:busy:<attempt>``."""
    r = client()
    r.rpush(FANOUT_BUSY, f"{context.attempt}:{os.getpid()}")
    return r.blpop(f"test:busy:{context.attempt}", timeout) is not None


@task
def fanout_pid(label):
    """A broadcast: write ``<label>:<pid>`` to the broadcasts' ledger."""
    client().rpush(FANOUT_BROADCASTS, f"{label}:{os.getpid()}")


@task(takes_context=True)
def crash_once_traced(context):
    """On the first attempt, wait until its worker's heartbeat has stored the running
    attempt's trace record, then kill the worker: a recovery must link to that attempt."""
    if context.attempt == 1:
        result = context.task_result
        key = task_backends[result.backend].keys.job(result.id)
        deadline = time.monotonic() + 30
        while not client().hget(key, "trace") and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    return f"attempt {context.attempt}"


@task(takes_context=True)
def given_back_once(context):
    """The first run is stopped as a worker's second SIGTERM stops it: given back (its
    attempt is forgotten, so the runs are counted here)."""
    if client().incr(f"test:given_back:{context.task_result.id}") == 1:
        raise WorkerShutdown
    return context.attempt


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


@task
def raises_unprintable():
    raise Unprintable


@task(takes_context=True)
def reports_then_waits(context, steps, gate):
    """Reports progress ``steps`` times (the last: done, of ``steps``), then waits for
    a token on ``gate`` (at most 30 s), so a test can read its progress while it runs."""
    for done in range(1, steps + 1):
        context.set_progress(done, steps, note=f"row {done}")
    client().blpop([gate], timeout=30)
    return steps


@task(takes_context=True)
async def reports_then_waits_async(context, steps, gate):
    for done in range(1, steps + 1):
        context.set_progress(done, steps, note=f"row {done}")
    while not client().lpop(gate):
        await asyncio.sleep(0.01)
    return steps


@task(takes_context=True, retries=1, retry_backoff=0)
def reports_and_fails_once(context):
    """Reports 5 of 10 on its first attempt, then fails; its retry reports nothing."""
    if context.attempt == 1:
        context.set_progress(5, 10, "half way")
        raise ValueError("first attempt fails")
    return context.task_result.progress is None


@task(takes_context=True, retries=3, retry_backoff=0)
def runs_until_stopped(context, seconds):
    """Logs its start, then runs Python (sleeping a hundredth of a second at a time)
    for ``seconds``; retried if it raises, which a stop must not cause."""
    client().rpush(LOG, f"running:{context.attempt}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return "ran to the end"


@task(takes_context=True, retries=3, retry_backoff=0)
async def runs_until_stopped_async(context, seconds):
    client().rpush(LOG, f"running:{context.attempt}")
    await asyncio.sleep(seconds)
    return "ran to the end"


@task(takes_context=True, retries=3, retry_backoff=0)
def blocked_in_c(context, seconds):
    """Logs its start, then blocks in one call into C (a sleep) that no stop interrupts
    off the main thread."""
    client().rpush(LOG, f"running:{context.attempt}")
    time.sleep(seconds)
    return "ran to the end"
