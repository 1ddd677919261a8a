"""Property-based fuzzing of everything the app reads from Redis.

Whatever a payload, a job hash, a queue member, a worker, scheduler or stats record
holds: the worker fails the job with a reason and goes on, imports nothing it was not
given as a task, no Lua script raises (they promise never to fail half-way), the
result API raises only its documented errors, and every dashboard page answers
without a server error, escaping what it shows.

Real Redis (the suite's private server, emptied before each example); the worker and
the scheduler run in this process, in burst mode. A Redis error raised by a script is
turned into an assertion, so that a worker or scheduler does not back off and retry it
for ever. The number of examples tried per property is printed under "figures".
"""

import hashlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from unittest.mock import patch
from urllib.parse import quote

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.urls import NoReverseMatch, reverse
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus
from django_redisqueue.core.registry import registry
from django_redisqueue.exceptions import NotCancellable, ResultTimeout, TaskFailed
from django_redisqueue.runtime.scheduler import Scheduler
from tests import tasks
from tests.conftest import run_worker_here

pytestmark = pytest.mark.django_db

TRIED: Counter[str] = Counter()


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        # No "explain" phase: it traces every line of every failing example again.
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


@contextmanager
def counted(name: str, report) -> Iterator[None]:
    """Report how many examples the property tried, even when it fails."""
    TRIED[name] = 0
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        report(f"fuzz {name}: {TRIED[name]} examples in {elapsed:.1f} s")


# Hostile values

MARK = "<script>drq()"  # inside hostile strings; must never reach a page unescaped
LATEST = 253402300799  # 9999-12-31 23:59:59 UTC, in seconds: the latest run_after


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# JSON texts, most of which Python's json module would never write.
NUMBERS = [
    "NaN", "Infinity", "-Infinity", "1e20", "1e400", "-1e400", "1e-400", "-1", "-0", "0",
    "1", "1.0", "1.5", "2", "-100", "100", "-101", "101", str(LATEST), str(LATEST + 1),
    "1e308", "-1e308", "9" * 25, "-" + "9" * 25, "9" * 4301, "1e99999",
]  # fmt: skip
STRINGS = [
    *(
        json.dumps(s)
        for s in [
            "", "default", "high", "low", "nope", "a b", "a/b", "{x}", "é€😀", MARK,
            "tests.canary.boom", "tests.canary", "os.system", "tests.tasks",
            "tests.tasks.client", "tests.tasks.add ", "x" * 200, "\x00", "default\n",
        ]
    ),
    json.dumps("é€😀" + MARK, ensure_ascii=False),
    '"\\ud800"', '"\\udfff"', '"a\\ud83d"', '"\\ud800\\udc00"', '"' + MARK + '\\udc00"',
]  # fmt: skip
STRUCTURES = [
    "[1]", "[]", "{}", '{"a": 1}', "[[[]]]", "true", "false", "null", "[NaN]",
    '{"x": Infinity}', '["\\ud800"]', '{"\\ud800": 1}', '["\\udfff", "\\ud800"]',
    "[1e400]", '{"": 1}', '{"context": 1}', '{"a": "' + MARK + '"}',
    *(nested(n) for n in (100, 300, 480, 600, 900, 990, 5000)),
    '{"a":' * 600 + "1" + "}" * 600,
]  # fmt: skip
FRAGMENTS = NUMBERS + STRINGS + STRUCTURES

# Tasks a fuzzed job may name: registered, quick, harmless whatever their arguments.
SAFE_TASKS = [
    "tests.tasks.add", "tests.tasks.noop", "tests.tasks.noop_any", "tests.tasks.fail",
    "tests.tasks.meaning_of_life", "tests.tasks.returns_tuple", "tests.tasks.returns_object",
    "tests.tasks.noop_async", "tests.tasks.get_task_id", "tests.tasks.raises_value_error",
]  # fmt: skip

characters = st.one_of(st.characters(), st.characters(categories=["Cs"]))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(characters, max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(characters, max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
fragments = st.one_of(st.sampled_from(FRAGMENTS), json_values.map(json.dumps))

GOOD_ENVELOPE = {
    "v": "1",
    "task": '"tests.tasks.add"',
    "args": "[1, 2]",
    "kwargs": "{}",
    "queue": '"default"',
    "priority": "0",
    "backend": '"default"',
    "run_after": "null",
}
ENVELOPE_FIELDS = (*GOOD_ENVELOPE, "enqueued_at")  # enqueued_at: a field of version 0


# Times out of the range of a datetime, or not times at all.
TIMES = [
    str(LATEST + 1), "1e20", "1e308", "9" * 25, "-1", "-1e20", "1e400", "NaN", "Infinity",
    "-Infinity", '"1"', "[1]", "true", "{}", "0", "0.5", str(LATEST),
]  # fmt: skip
# Values aimed at each field, besides any fragment.
AIMED = {
    "args": [
        '["\\ud800"]', '["' + MARK + '\\udfff"]', '[{"\\ud800": 1}]', "[" + nested(600) + "]",
        "[" + nested(480) + "]", "[[1], [2]]", "[1e400]", '["a", "b", "c"]', nested(1),
    ],
    "kwargs": [
        '{"\\ud800": 1}', '{"a\\udfff": 1}', '{"a": ' + nested(600) + "}", '{"a": 1, "b": 2}',
        '{"b": 1}', '{"context": 1}', '{"x": Infinity}', '{"a": 1e400}', "[]",
    ],
    "queue": ['"default"', '"high"', '"nope"', '"default\\n"', '""', "[1]", '"a b"'],
    "run_after": TIMES,
    "enqueued_at": TIMES,
}  # fmt: skip


ARGUMENTS = ("args", "kwargs")
METADATA = tuple(name for name in ENVELOPE_FIELDS if name not in ARGUMENTS)


@st.composite
def envelopes(draw, fuzzed: tuple[str, ...]) -> str:
    """A JSON envelope of a harmless registered task, up to three of whose ``fuzzed``
    fields are replaced by hostile values or left out (one at a time, mostly: a field
    checked first would hide what is wrong with the others)."""
    fields = dict(GOOD_ENVELOPE)
    fields["task"] = json.dumps(draw(st.sampled_from(SAFE_TASKS)))
    fields["args"] = draw(st.sampled_from(["[1, 2]", "[]", '["a", "b"]', '["x"]']))
    changes = draw(st.integers(0, 3))
    for name in draw(st.lists(st.sampled_from(fuzzed), min_size=min(changes, len(fuzzed)),
                              max_size=changes, unique=True)):  # fmt: skip
        if draw(st.integers(0, 3)):
            fields[name] = draw(st.one_of(st.sampled_from(AIMED.get(name, NUMBERS)), fragments))
        else:
            fields.pop(name, None)
    return "{" + ", ".join(f'"{name}": {value}' for name, value in fields.items()) + "}"


@st.composite
def arguments(draw) -> str:
    """A JSON envelope of a harmless registered task with hostile arguments."""
    args = draw(
        st.one_of(
            st.sampled_from(AIMED["args"]),
            st.lists(json_values, max_size=3).map(json.dumps),
            st.sampled_from(['["\\ud800"]', "[1, 2]", "[]"]),
        )
    )
    kwargs = draw(
        st.one_of(
            st.sampled_from(AIMED["kwargs"]),
            st.dictionaries(st.text(characters, max_size=6), json_values, max_size=3).map(
                json.dumps
            ),
            st.just("{}"),
        )
    )
    task = json.dumps(draw(st.sampled_from(SAFE_TASKS)))
    return f'{{"v": 1, "task": {task}, "args": {args}, "kwargs": {kwargs}}}'


def encode(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


PAYLOADS = {
    # Bytes, JSON texts, and envelopes with hostile metadata (task, version, queue...).
    "payloads": st.one_of(
        envelopes(METADATA),
        envelopes(METADATA),
        envelopes(ENVELOPE_FIELDS),
        st.binary(max_size=200),
        fragments,
    ).map(encode),
    # Envelopes of registered tasks with hostile arguments: these jobs run.
    "arguments": arguments().map(encode),
}
payloads = st.one_of(*PAYLOADS.values())

# Strings as Redis holds them, for the fields of hashes: numbers Lua and Redis read
# differently, words the code compares with, anything.
NUMERIC_TEXTS = [
    " 5", "5 ", "\t5", "5\n", "+5", ".5", "5.", "0x10", "1_0", "1e-400", "1e400", "-1e400",
    "inf", "-inf", "nan", "NaN", "1e20", "-1", "-0", "0", "1", "2", "3", "9" * 30, "9" * 5000,
    "1.5", "-1.5", "", "1e308", "4.9e-324", "100", "-100", "101", str(2**63), str(-(2**63) - 1),
]  # fmt: skip
WORDS = [
    "READY", "RUNNING", "SUCCESSFUL", "FAILED", "CANCELLED", "default", "high", "low", "nope",
    "a b", "x/y", MARK, "[", "[]", "[1]", "{}", "null", "[1e400]", nested(5000),
    '[{"exception_class_path": 1}]', '[{"traceback": "' + MARK + '"}, 7]', "w/1",
    "ghost/1", ",", ",,", "é", b"\xed\xa0\x80", b"\xff\xfe",
]  # fmt: skip
garbage = st.one_of(
    st.sampled_from(NUMERIC_TEXTS + WORDS),
    st.binary(max_size=30),
    st.text(max_size=30),
    st.integers().map(str),
    st.floats().map(str),
)

# Job ids and queue members: plausible ids, and what no id should be.
ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-"
SPECIAL_IDS = [
    b"", b" ", b"a b", b"a/b", b"/", b"{", b"}", b"{drq:default}", b"x" * 128, b"x" * 129,
    b"y" * 5000, b"..", b".", b"-", b"a:b", b"\x00", b"\xff\xfe", MARK.encode(), b"job\n",
    "é".encode(), b"*", b"?", b"[a]", b"%2F", b"a%2Fb", b"\\", b"a\tb",
]  # fmt: skip
plausible_ids = st.text(ID_CHARS, min_size=1, max_size=40).map(str.encode)
members = st.one_of(
    st.sampled_from(SPECIAL_IDS),
    plausible_ids,
    st.binary(max_size=200),
    st.text(max_size=40).map(encode),
)

JOB_FIELDS = (
    "attempts", "lost", "workers", "owner", "priority", "score", "queue", "status",
    "enqueued_at", "started_at", "last_attempted_at", "finished_at", "errors", "result",
    "waiters", "cancelled", "payload",
)  # fmt: skip
OTHER_TYPES = ("string", "list", "set", "zset")
FINAL = (b"SUCCESSFUL", b"FAILED")
REFUSALS = ("InvalidPayload", "UnknownTask")


# Fixtures and helpers


@pytest.fixture
def raw(redis_server) -> redis.Redis:
    """A client that reads and writes bytes, as hostile data may be any."""
    return redis.Redis.from_url(redis_server.url)


class ScriptFailed(AssertionError):
    """A Lua script raised: Redis kept the writes it made before the error."""


@contextmanager
def scripts_never_fail(broker) -> Iterator[None]:
    """Turn a Redis error raised by a script into an assertion: the worker and the
    scheduler would otherwise back off and send the same call again for ever."""
    original = broker._run

    def run(script: str, *args, **options):
        try:
            return original(script, *args, **options)
        except redis.ResponseError as exc:
            shown = ", ".join(repr(a)[:120] for a in args)
            raise ScriptFailed(f"{script}.lua raised {exc} (ARGV: {shown})") from exc

    with patch.object(broker, "_run", run):
        yield


def job_key(backend, job_id: bytes) -> bytes:
    return backend.keys.job_prefix.encode() + job_id


def malformed_key(backend, member: bytes) -> bytes:
    return job_key(backend, b"malformed-" + hashlib.sha1(member).hexdigest().encode())


def run_scheduler(backend) -> None:
    # What a step survives is the point here, not when it recovers a lease: no grace
    # (a fuzzed lease that ran out is recovered by the second step, at once).
    Scheduler(backend, burst=True, grace=0.0).run()


def errors_of(fields: dict[bytes, bytes]) -> list[dict]:
    return json.loads(fields.get(b"errors", b"[]"))


def reason(error: dict) -> str:
    """What follows 'Class: ' at the end of an error's traceback ('' if nothing)."""
    path, text = error["exception_class_path"], error["traceback"]
    for name in (path, path.rpartition(".")[2]):
        at = text.rfind(f"{name}: ")
        if name and at >= 0:
            return text[at + len(name) + 2 :].strip()
    return ""


def assert_failed(fields: dict[bytes, bytes], what: object, *, says_why: bool = True) -> dict:
    """FAILED, with an error; ``says_why``: one with a message (the app's own errors
    always have one; a task may raise an exception without)."""
    assert fields.get(b"status") == b"FAILED", (what, fields)
    errors = errors_of(fields)
    assert errors, (what, fields)
    last = errors[-1]
    assert last["exception_class_path"] and last["traceback"].strip(), (what, last)
    if says_why:
        assert reason(last), (what, last)
    return last


def read_result(backend, job_id: str) -> None:
    """Read a job through the result API; only its documented errors may come out."""
    try:
        result = backend.get_result(job_id)
    except TaskResultDoesNotExist:
        result = None
    else:
        assert result.status in TaskResultStatus.values
        for error in result.errors:
            assert isinstance(error.traceback, str)
        assert isinstance(result.worker_ids, list)
        if result.status == TaskResultStatus.SUCCESSFUL:
            result.return_value  # noqa: B018
    try:
        if result is None:
            backend.wait(job_id, timeout=0)
        else:
            result.wait(timeout=0)
    except (ResultTimeout, TaskFailed, TaskResultDoesNotExist):
        pass


def a_good_job_runs(backend) -> None:
    good = tasks.add.enqueue(2, 3)
    with scripts_never_fail(backend.broker):
        run_worker_here(backend)
    result = backend.get_result(good.id)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 5


def never_imported_canary(raw) -> None:
    assert "tests.canary" not in sys.modules
    assert raw.get("test:canary") is None


def sets_holding(raw, backend, job_id: bytes) -> list[bytes]:
    """The queues, delayed sets and running set that hold ``job_id``."""
    prefix = backend.keys.prefix
    keys = [backend.keys.running.encode()]
    for pattern in (f"{prefix}:queue:*", f"{prefix}:delayed:*"):
        keys += raw.scan_iter(match=re.sub(r"([{}\[\]])", r"\\\1", pattern))
    return [key for key in keys if raw.zscore(key, job_id) is not None]


def verdict(payload: bytes, registered: frozenset[str]) -> str | None:
    """What the envelope's rules (jobs.py) say of a payload: "run" (a job of a
    registered task), "refuse", or None where the rules leave it open."""
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return None  # read with replacement characters: may become valid

    def no_constant(name: str):
        raise ValueError(name)

    def finite(text: str) -> float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ValueError(text)
        return value

    try:
        data = json.loads(text, parse_constant=no_constant, parse_float=finite)
    except (ValueError, RecursionError):
        return "refuse"
    if not isinstance(data, dict):
        return "refuse"
    version = data.get("v")
    if isinstance(version, bool) or version != 1:
        return "refuse"
    if not isinstance(data.get("task"), str) or data["task"] not in registered:
        return "refuse"
    priority = data.get("priority", 0)
    run_after = data.get("run_after")
    queue = data.get("queue", "default")  # the hash's queue ("default") when absent
    if not (
        isinstance(data.get("args", []), list)
        and isinstance(data.get("kwargs", {}), dict)
        and type(priority) is int
        and -100 <= priority <= 100
        and (run_after is None or (type(run_after) in (int, float) and 0 <= run_after <= LATEST))
        and isinstance(queue, str)
    ):
        return "refuse"
    if queue and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", queue):
        return "refuse"
    if type(version) is not int or not queue or depth(data) > 50 or "\\ud" in text.lower():
        return None  # 1.0, no queue name, deep nesting, lone surrogates: open questions
    return "run"


def depth(value: object) -> int:
    """How deep lists and objects nest in a JSON value (without recursion)."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, at = level.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, at)
            level += [(v, at + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


@pytest.fixture
def registered() -> frozenset[str]:
    for path in SAFE_TASKS:
        assert registry.get(path) is not None, path
    return frozenset(registry.paths())


# 1. Payloads


@pytest.mark.parametrize("kind", PAYLOADS)
def test_any_payload_fails_with_a_reason_or_runs_and_the_worker_goes_on(
    kind, raw, backend, registered, report
):
    keys = backend.keys
    queue = keys.queue("default").encode()

    @fuzz(400)
    @given(
        payload=PAYLOADS[kind],
        score=st.one_of(st.just(0.0), st.floats(allow_nan=False)),
    )
    def check(payload, score):
        TRIED[kind] += 1
        raw.flushall()
        key = job_key(backend, b"hostile")
        raw.hset(key, mapping={"payload": payload, "queue": "default", "priority": 0})
        raw.hset(key, "status", "READY")
        raw.zadd(queue, {b"hostile": score})

        with scripts_never_fail(backend.broker):
            run_worker_here(backend)  # (a) returns: a burst worker stops when out of work

        never_imported_canary(raw)  # (c)
        assert sets_holding(raw, backend, b"hostile") == []
        fields = raw.hgetall(key)
        assert fields.get(b"status") in FINAL, fields
        expected = verdict(payload, registered)
        if fields[b"status"] == b"FAILED":  # (b)
            last = assert_failed(fields, payload, says_why=False)
            refused = last["exception_class_path"].endswith(REFUSALS)
            assert reason(last) or not refused, (payload, last)
            assert raw.zscore(keys.failed("default"), b"hostile") is not None
        else:
            refused = False
        if expected == "refuse":
            assert refused, (payload, fields)
        elif expected == "run":
            assert not refused, (payload, fields)
            assert fields[b"attempts"] == b"1"
        read_result(backend, "hostile")
        a_good_job_runs(backend)  # (d)

    with counted(kind, report):
        check()


# 2. Job-hash fields, and job keys of another type


STATES = ("queued", "delayed-due", "delayed-later", "running-lost", "running-held", "failed")
# Fields Lua reads as numbers: Lua's tonumber() and Redis's own parsing disagree on some.
NUMERIC_FIELDS = {
    "attempts", "lost", "priority", "score", "enqueued_at", "started_at", "last_attempted_at",
    "finished_at", "waiters", "cancelled",
}  # fmt: skip


@st.composite
def fuzzed_fields(draw) -> tuple[dict[str, object], set[str]]:
    """Some fields of a job hash replaced by garbage, a few others removed."""
    names = draw(st.sets(st.sampled_from(JOB_FIELDS), min_size=1, max_size=6))
    replaced = {
        name: draw(
            st.one_of(st.sampled_from(NUMERIC_TEXTS), garbage)
            if name in NUMERIC_FIELDS
            else garbage
        )
        for name in sorted(names)
    }
    removed = draw(st.sets(st.sampled_from(JOB_FIELDS), max_size=2)) - names
    return replaced, removed


def place(raw, backend, job_id: bytes, state: str, scores: dict, now: int) -> None:
    keys = backend.keys

    def score(name: str) -> float:
        value = scores[name]
        return {"past": now - 1000, "later": now + 10**7}.get(value, value)

    target, at = {
        "queued": (keys.queue("default"), scores["queued"]),
        "delayed-due": (keys.delayed("default"), score("past")),
        "delayed-later": (keys.delayed("default"), score("later")),
        "running-lost": (keys.running, score("past")),
        "running-held": (keys.running, score("later")),
        "failed": (keys.failed("default"), now),
    }[state]
    raw.zadd(target, {job_id: at})


scores = st.fixed_dictionaries(
    {
        "queued": st.floats(allow_nan=False),
        "past": st.sampled_from([0.0, float("-inf"), "past", 1.0]),
        "later": st.sampled_from([float("inf"), "later", 1e300]),
    }
)


def base_fields(state: str, now: int) -> dict[str, object]:
    payload = json.dumps(
        {"v": 1, "task": "tests.tasks.add", "args": [1, 2], "kwargs": {}, "queue": "default",
         "priority": 0, "backend": "default", "run_after": None}
    )  # fmt: skip
    fields: dict[str, object] = {
        "payload": payload,
        "queue": "default",
        "priority": 0,
        "score": 1759218604441601,
        "status": "READY",
        "enqueued_at": now - 5000,
    }
    if state.startswith("running"):
        fields.update(
            status="RUNNING",
            owner="ghost/1",
            attempts=1,
            workers="ghost",
            started_at=now - 2000,
            last_attempted_at=now - 2000,
        )
    if state == "failed":
        error = {"exception_class_path": "builtins.ValueError", "traceback": "ValueError: x\n"}
        fields.update(status="FAILED", attempts=1, finished_at=now, errors=json.dumps([error]))
    return fields


def exercise(raw, backend, job_ids: list[str], cancelled: list[str]) -> None:
    """The result API (and cancel), a scheduler step, the worker, another step, the
    result API again."""
    with scripts_never_fail(backend.broker):
        for job_id in job_ids:
            read_result(backend, job_id)
        for job_id in cancelled:
            with suppress(NotCancellable, TaskResultDoesNotExist):
                backend.cancel(job_id)
        run_scheduler(backend)
        run_worker_here(backend)
        for name in backend.queue_names:  # the worker took everything it serves
            assert raw.zcard(backend.keys.queue(name)) == 0, name
        run_scheduler(backend)
        for job_id in job_ids:
            read_result(backend, job_id)


def test_any_job_field_is_survived_by_the_worker_scheduler_and_result_api(raw, backend, report):
    """The same fuzzed fields on a job in each state: queued, delayed (due or not),
    running (lease passed or not), failed."""

    @fuzz(250)
    @given(fields=fuzzed_fields(), at=scores, cancelled=st.sets(st.sampled_from(STATES)))
    def check(fields, at, cancelled):
        TRIED["job fields"] += 1
        raw.flushall()
        now = backend.broker.clock_ms()
        replaced, removed = fields
        written = {}
        for state in STATES:
            key = job_key(backend, state.encode())
            raw.hset(key, mapping=base_fields(state, now))
            if removed:
                raw.hdel(key, *removed)
            raw.hset(key, mapping=replaced)
            place(raw, backend, state.encode(), state, at, now)
            written[state] = raw.hget(key, "status")
        good = tasks.add.enqueue(2, 3)

        exercise(raw, backend, list(STATES), sorted(cancelled))

        never_imported_canary(raw)
        assert backend.get_result(good.id).return_value == 5
        # Not lost: a job the code marked READY waits in a queue or a delayed set, one it
        # marked RUNNING is in the running set (a status the fuzz wrote may lie).
        running = backend.keys.running.encode()
        for state in STATES:
            status = raw.hget(job_key(backend, state.encode()), "status")
            if status == written[state] and "status" in replaced.keys() | removed:
                continue
            holders = sets_holding(raw, backend, state.encode())
            if status == b"READY":
                assert holders and running not in holders, (state, status, holders)
            elif status == b"RUNNING":
                assert running in holders, (state, status, holders)

    with counted("job fields", report):
        check()


def make_other_type(raw, key: bytes, kind: str, content: bytes) -> None:
    if kind == "string":
        raw.set(key, content)
    elif kind == "list":
        raw.rpush(key, content)
    elif kind == "set":
        raw.sadd(key, content)
    else:
        raw.zadd(key, {content: 1})


def test_a_job_key_of_another_type_is_recorded_or_skipped_never_wrongtype(raw, backend, report):
    @fuzz(80)
    @given(
        job_id=st.one_of(plausible_ids, members),
        kind=st.sampled_from(OTHER_TYPES),
        state=st.sampled_from(["queued", "delayed-due", "running-lost"]),
        content=st.binary(max_size=20),
        cancel=st.booleans(),
    )
    def check(job_id, kind, state, content, cancel):
        TRIED["job keys of another type"] += 1
        raw.flushall()
        now = backend.broker.clock_ms()
        key = job_key(backend, job_id)
        make_other_type(raw, key, kind, content)
        place(raw, backend, job_id, state, {"queued": 0, "past": "past", "later": "later"}, now)

        text = job_id.decode("utf-8", "replace")
        with scripts_never_fail(backend.broker):
            with pytest.raises(TaskResultDoesNotExist):
                backend.get_result(text)
            with pytest.raises(TaskResultDoesNotExist):
                backend.wait(text, timeout=0)
            if cancel:
                with pytest.raises(TaskResultDoesNotExist):
                    backend.cancel(text)
        exercise(raw, backend, [text], [])

        assert sets_holding(raw, backend, job_id) == []
        assert raw.type(key).decode() == kind  # left alone
        record = raw.hgetall(malformed_key(backend, job_id))
        if state != "running-lost" or record:  # a lost "job" may just be dropped
            assert_failed(record, job_id)
        a_good_job_runs(backend)

    with counted("job keys of another type", report):
        check()


# 3. Queue members


def test_any_queue_member_is_recorded_as_failed_and_the_worker_goes_on(raw, backend, report):
    @fuzz(120)
    @given(
        placed=st.lists(
            st.tuples(members, st.sampled_from(["high", "default", "low"]), st.floats(-1e6, 1e6)),
            min_size=1,
            max_size=8,
            unique_by=lambda t: t[0],
        )
    )
    def check(placed):
        TRIED["queue members"] += 1
        raw.flushall()
        for member, queue, score in placed:
            raw.zadd(backend.keys.queue(queue), {member: score})

        with scripts_never_fail(backend.broker):
            run_worker_here(backend)

        never_imported_canary(raw)
        for member, queue, _ in placed:
            assert raw.zcard(backend.keys.queue(queue)) == 0, queue
            # Recorded under its own id (a plausible id with no job), or as malformed.
            record = raw.hgetall(job_key(backend, member))
            if record.get(b"status") != b"FAILED":
                record = raw.hgetall(malformed_key(backend, member))
            assert_failed(record, member)
        a_good_job_runs(backend)

    with counted("queue members", report):
        check()


# 4. Worker, scheduler and stats records; 5. the dashboard's pages

BASE = "/admin/django_redisqueue/dashboard/default/"
QUEUES = ("high", "default", "low")

RECORD_TEXTS = [
    "", " ", MARK, "a/b", "x" * 300, "é", "1e400", "nan", "-1", "9" * 5000, "default,high",
    ",", "{}", "[]", b"\xff\xfe", b"\xed\xa0\x80",
]  # fmt: skip
record_texts = st.one_of(
    st.sampled_from(RECORD_TEXTS),
    st.text(max_size=30),
    st.binary(max_size=30),
)
seen_scores = st.one_of(
    st.sampled_from(["now", "old", "later", float("inf"), float("-inf"), 0.0, 1e300, -1e300]),
    st.floats(allow_nan=False),
)
WORKER_FIELDS = ["queues", "pid", "host", "started_at", "jobs_done"]


def seen_at(value, now: int) -> float:
    return {"now": now, "old": now - 10**6, "later": now + 10**6}.get(value, value)


@pytest.fixture
def superuser() -> Client:
    account = User.objects.create_user("root", password="pw", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(account)
    return client


def get_page(client: Client, url: str, expected: int = 200) -> str:
    """GET a page: it must answer ``expected`` (a view that raises fails here) and
    show no raw markup from Redis."""
    response = client.get(url)
    assert response.status_code == expected, (url, response.status_code)
    text = response.content.decode("utf-8", "replace")
    assert MARK not in text, url
    return text


def delayed_urls(client: Client) -> tuple[dict[str, str], str]:
    """The delayed page of each queue, if this version has one per queue and it answers
    200 on an empty Redis (the page is being changed); else none."""
    try:
        urls = {q: reverse("admin:redisqueue_delayed", args=["default", q]) for q in QUEUES}
    except NoReverseMatch:
        return {}, "delayed pages skipped: no per-queue delayed page in this version"
    probe = Client(raise_request_exception=False)
    probe.cookies = client.cookies
    status = probe.get(urls["default"]).status_code
    if status != 200:
        return {}, f"delayed pages skipped: {urls['default']} answers {status} when empty"
    return urls, "delayed pages included"


@st.composite
def liveness_records(draw):
    workers = draw(
        st.lists(
            st.tuples(
                record_texts,
                seen_scores,
                st.one_of(
                    st.dictionaries(
                        st.one_of(st.sampled_from(WORKER_FIELDS), record_texts),
                        record_texts,
                        max_size=5,
                    ),
                    st.sampled_from(OTHER_TYPES),
                ),
                st.booleans(),  # runs a job
            ),
            max_size=4,
            unique_by=lambda worker: encode(worker[0]),
        )
    )
    schedulers = draw(st.lists(st.tuples(record_texts, seen_scores), max_size=3))
    stats = draw(
        st.dictionaries(
            st.integers(-62, 1),
            st.one_of(
                st.dictionaries(
                    st.one_of(
                        st.sampled_from(["ok:default", "failed:default", "ok:high", "failed:low"]),
                        record_texts,
                    ),
                    st.one_of(garbage, st.integers().map(str)),
                    max_size=4,
                ),
                st.sampled_from(OTHER_TYPES),
            ),
            max_size=4,
        )
    )
    return workers, schedulers, stats


def test_the_overview_renders_whatever_the_worker_scheduler_and_stats_records_hold(
    raw, backend, superuser, report
):
    keys = backend.keys

    @fuzz(100)
    @given(records=liveness_records(), job_ids=st.lists(members, min_size=4, max_size=4))
    def check(records, job_ids):
        TRIED["liveness records"] += 1
        raw.flushall()
        now = backend.broker.clock_ms()
        workers, schedulers, stats = records
        for (worker_id, seen, info, busy), job_id in zip(workers, job_ids, strict=False):
            worker_id = encode(worker_id)
            raw.zadd(keys.workers, {worker_id: seen_at(seen, now)})
            record = keys.worker("").encode() + worker_id
            if isinstance(info, str):
                make_other_type(raw, record, info, b"x")
            elif info:
                raw.hset(record, mapping={encode(k): encode(v) for k, v in info.items()})
            if busy:
                raw.hset(
                    job_key(backend, job_id),
                    mapping={"payload": "{", "queue": "default", "status": "RUNNING",
                             "owner": worker_id + b"/1"},
                )  # fmt: skip
                raw.zadd(keys.running, {job_id: now + 10**6})
        for scheduler_id, seen in schedulers:
            raw.zadd(keys.schedulers, {encode(scheduler_id): seen_at(seen, now)})
        for offset, counts in stats.items():
            key = keys.stats(now // 60_000 + offset)
            if isinstance(counts, str):
                make_other_type(raw, key.encode(), counts, b"1")
            elif counts:
                raw.hset(key, mapping={encode(k): encode(v) for k, v in counts.items()})

        get_page(superuser, BASE)
        get_page(superuser, BASE + "?partial=1")

    with counted("liveness records", report):
        check()


def test_garbage_in_this_minutes_stats_does_not_stop_a_job_from_finishing(raw, backend, report):
    @fuzz(20)
    @given(
        field=st.sampled_from(["ok:default", "failed:default"]),
        value=st.one_of(
            st.sampled_from(["x", "1.5", " 1", "9" * 30, str(2**63 - 1), "", "1e3"]), garbage
        ),
    )
    def check(field, value):
        TRIED["stats values"] += 1
        raw.flushall()
        minute = backend.broker.clock_ms() // 60_000
        for key in (backend.keys.stats(minute), backend.keys.stats(minute + 1)):
            raw.hset(key, field, value)
        failing = tasks.fail.enqueue("expected")
        a_good_job_runs(backend)
        assert backend.get_result(failing.id).status == TaskResultStatus.FAILED

    with counted("stats values", report):
        check()


PLACES = ("queue", "delayed", "running", "failed")
# Valid envelopes whose every shown string carries the mark.
MARKED = json.dumps(MARK)
MARKED_PAYLOADS = [
    f'{{"v": 1, "task": {MARKED}, "args": [{MARKED}], "kwargs": {{{MARKED}: {MARKED}}}}}',
    f'{{"v": 1, "task": "tests.tasks.add", "args": [[{MARKED}]], "kwargs": {{}}}}',
    f'{{"v": 1, "task": "tests.tasks.add", "args": [], "kwargs": {{"a": {{{MARKED}: 1}}}}}}',
]
marked_fields = st.dictionaries(
    st.sampled_from(JOB_FIELDS[:-1]),
    st.one_of(
        st.sampled_from(
            [MARK, json.dumps([{"exception_class_path": MARK, "traceback": MARK}]), f"{MARK}/1"]
        ),
        garbage,
    ),
    max_size=4,
)


@st.composite
def hostile_jobs(draw) -> list[tuple]:
    """Jobs with hostile ids, payloads and fields (or keys of another type), in a
    queue, a delayed set, the running set or a failed index."""
    return draw(
        st.lists(
            st.tuples(
                st.one_of(members, st.just(MARK.encode())),
                st.sampled_from(PLACES),
                st.sampled_from(QUEUES),
                st.one_of(
                    payloads,
                    st.sampled_from(MARKED_PAYLOADS).map(encode),
                    st.sampled_from(OTHER_TYPES),
                ),
                marked_fields,
                st.floats(allow_nan=False),
            ),
            min_size=1,
            max_size=6,
            unique_by=lambda job: job[0],
        )
    )


def test_every_dashboard_page_answers_and_escapes_whatever_the_jobs_hold(
    raw, backend, superuser, report
):
    keys = backend.keys
    delayed, note = delayed_urls(superuser)
    report(f"fuzz dashboard pages: {note}")

    @fuzz(80)
    @given(jobs=hostile_jobs(), partial=st.integers(0, 9))
    def check(jobs, partial):
        TRIED["dashboard pages"] += 1
        raw.flushall()
        pages = {BASE, BASE + "?partial=1"}
        for job_id, where, queue, payload, fields, score in jobs:
            key = job_key(backend, job_id)
            if payload in OTHER_TYPES:
                make_other_type(raw, key, payload, MARK.encode())
            else:
                raw.hset(key, mapping={"payload": payload, "queue": queue, **fields})
            target, page = {
                "queue": (keys.queue(queue), BASE + f"queue/{queue}/"),
                "delayed": (keys.delayed(queue), delayed.get(queue)),
                "running": (keys.running, BASE + "running/"),
                "failed": (keys.failed(queue), BASE + f"failed/{queue}/"),
            }[where]
            raw.zadd(target, {job_id: score})
            if page:
                pages.add(page)

        ordered = sorted(pages)
        for url in ordered:
            get_page(superuser, url)
        get_page(superuser, ordered[partial % len(ordered)] + "?partial=1")
        get_page(superuser, BASE + "job/no-such-job/", 404)
        for job_id, _, _, payload, _, _ in jobs:
            try:
                text = job_id.decode()
            except UnicodeDecodeError:
                continue
            if not text or "/" in text:
                continue  # cannot be one segment of a URL
            expected = 404 if payload in OTHER_TYPES else 200
            get_page(superuser, BASE + f"job/{quote(text, safe='')}/", expected)

    with counted("dashboard pages", report):
        check()
