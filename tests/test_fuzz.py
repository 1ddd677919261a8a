"""Property-based fuzzing of the jobs the app reads from Redis.

Whatever a payload, a job hash or a queue member holds: the worker fails the job with
a reason and goes on, imports nothing it was not given as a task, no Lua script raises
(they promise never to fail half-way), and the result API raises only its documented
errors. The records besides jobs and the dashboard's pages:
tests/test_fuzz_dashboard.py; the hostile values and the checks: tests/support/fuzzing.py.

Real Redis (the suite's private server, emptied before each example); the worker and
the scheduler run in this process, in burst mode. A Redis error raised by a script is
turned into an assertion, so that a worker or scheduler does not back off and retry it
for ever. The number of examples tried per property is printed under "figures".
"""

import json
import re
from contextlib import suppress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultDoesNotExist
from django_redisqueue.core.jobs import JOB_ID_RE
from django_redisqueue.exceptions import NotCancellable
from tests.conftest import run_worker_here
from tests.support import tasks
from tests.support.fuzzing import (
    FINAL,
    ID_CHARS,
    JOB_FIELDS,
    NUMERIC_TEXTS,
    OTHER_TYPES,
    PAYLOADS,
    REFUSALS,
    TRIED,
    a_good_job_runs,
    assert_failed,
    counted,
    encode,
    errors_of,
    fuzz,
    garbage,
    job_key,
    make_other_type,
    malformed_key,
    members,
    never_imported_canary,
    plausible_ids,
    read_result,
    reason,
    run_scheduler,
    scripts_never_fail,
    sets_holding,
    verdict,
)

pytestmark = pytest.mark.django_db


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
        # As every stored job has: a job of a task not known waits from then on.
        raw.hset(key, mapping={"status": "READY", "enqueued_at": backend.broker.clock_ms()})
        raw.zadd(queue, {b"hostile": score})

        with scripts_never_fail(backend.broker):
            run_worker_here(backend)  # (a) returns: a burst worker stops when out of work

        never_imported_canary(raw)  # (c)
        fields = raw.hgetall(key)
        expected = verdict(payload, registered)
        if fields.get(b"status") == b"READY":  # given back for a worker that knows it
            assert expected in ("wait", None), (payload, fields)
            assert sets_holding(raw, backend, b"hostile") == [keys.delayed("default").encode()]
            assert fields.get(b"attempts", b"0") == b"0", fields
            a_good_job_runs(backend)  # (d)
            return
        assert expected != "wait", (payload, fields)
        assert sets_holding(raw, backend, b"hostile") == []
        assert fields.get(b"status") in FINAL, fields
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
        {"v": 1, "task": "tests.support.tasks.add", "args": [1, 2], "kwargs": {},
         "queue": "default", "priority": 0, "backend": "default", "run_after": None}
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


# 4. The errors of a failed job, read by a job enqueued after it

DEPENDENCY = "django_redisqueue.exceptions.DependencyFailed"
# What an error may name as the job it ran after, or as its failure's origin: ids of
# every length about the longest (128), and anything else.
named = st.one_of(
    st.text(ID_CHARS, min_size=1, max_size=300),
    st.sampled_from(["x" * 128, "x" * 129, "x" * 5000, "failed"]),
    garbage.map(lambda value: encode(value).decode("utf-8", "replace")),
)


@st.composite
def dependency_errors(draw) -> bytes:
    """A job's ``errors`` as written by hand: mostly a list ending in a DependencyFailed
    worded as the scripts word it, naming anything; sometimes anything at all."""
    why = f"{DEPENDENCY}: job {draw(named)}, which this job runs after, ended FAILED"
    if draw(st.booleans()):
        why += f" without running: job {draw(named)} failed"
    last = {"exception_class_path": draw(st.sampled_from([DEPENDENCY, DEPENDENCY, "x.Y"]))}
    last["traceback"] = why + "\n"
    earlier = draw(st.lists(st.just({"exception_class_path": "builtins.ValueError"}), max_size=1))
    written = json.dumps([*earlier, last])
    return encode(draw(st.one_of(st.just(written), st.just(written), garbage)))


ORIGIN = re.compile(r"without running: job (.*) failed")


def test_a_job_after_a_failed_one_names_only_a_job_id_as_its_failure_s_origin(
    raw, backend, report
):
    """A job enqueued after a FAILED job fails at once, naming the job whose failure
    started it all: the origin the FAILED job's last error names when that is a job id
    (as a claim reads a queue member), else the FAILED job itself; never text of any
    length taken from an error written by hand."""

    @fuzz(200)
    @given(errors=dependency_errors())
    def check(errors):
        TRIED["origins of failures"] += 1
        raw.flushall()
        key = job_key(backend, b"failed")
        raw.hset(key, mapping=base_fields("failed", backend.broker.clock_ms()))
        raw.hset(key, "errors", errors)

        with scripts_never_fail(backend.broker):
            after = tasks.add.using(depends_on="failed").enqueue(1, 2)
            read_result(backend, after.id)

        fields = raw.hgetall(job_key(backend, after.id.encode()))
        assert fields[b"status"] == b"FAILED", fields
        last = errors_of(fields)[-1]
        assert last["exception_class_path"] == DEPENDENCY, last
        why = last["traceback"]
        assert "job failed, which this job runs after, ended FAILED" in why, why
        origin = ORIGIN.search(why)
        assert origin is None or JOB_ID_RE.fullmatch(origin.group(1)), why
        a_good_job_runs(backend)

    with counted("origins of failures", report):
        check()
