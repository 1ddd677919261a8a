"""What the property-based fuzzing of everything the app reads from Redis shares
(tests/test_fuzz.py: payloads, job hashes, queue members; tests/test_fuzz_dashboard.py:
worker, scheduler and stats records, and the dashboard's pages): hostile values, the
strategies that aim them at each field, and the checks every property makes."""

import hashlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus
from django_redisqueue.exceptions import ResultTimeout, TaskFailed
from django_redisqueue.runtime.scheduler import Scheduler
from tests.conftest import run_worker_here
from tests.support import tasks

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
            "tests.support.canary.boom", "tests.support.canary", "os.system",
            "tests.support.tasks", "tests.support.tasks.client", "tests.support.tasks.add ",
            "x" * 200, "\x00", "default\n",
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
    f"tests.support.tasks.{name}"
    for name in (
        "add", "noop", "noop_any", "fail", "meaning_of_life", "returns_tuple",
        "returns_object", "noop_async", "get_task_id", "raises_value_error",
    )
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
    "task": '"tests.support.tasks.add"',
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
    assert "tests.support.canary" not in sys.modules
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
    registered task), "wait" (a valid job of a task not registered: given back for a
    worker that knows it), "refuse", or None where the rules leave it open."""
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
    if not isinstance(data.get("task"), str):
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
    # A valid job of a task this worker does not know waits for one that does.
    return "run" if data["task"] in registered else "wait"


def depth(value: object) -> int:
    """How deep lists and objects nest in a JSON value (without recursion)."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, at = level.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, at)
            level += [(v, at + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def make_other_type(raw, key: bytes, kind: str, content: bytes) -> None:
    """Write ``content`` at ``key`` as a Redis value of type ``kind``."""
    if kind == "string":
        raw.set(key, content)
    elif kind == "list":
        raw.rpush(key, content)
    elif kind == "set":
        raw.sadd(key, content)
    else:
        raw.zadd(key, {content: 1})
