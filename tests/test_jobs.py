"""The envelope and the job record: everything read from Redis is checked in jobs.py."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import TaskError, TaskResultStatus
from django_redisqueue.core.jobs import Envelope, JobRecord, cut_traceback
from django_redisqueue.core.registry import registry
from django_redisqueue.core.results import make_result
from django_redisqueue.core.tasks import RedisTaskResult
from django_redisqueue.exceptions import InvalidPayload, TaskFailed

pytestmark = pytest.mark.pure

GOOD = {
    "v": 1,
    "task": "tests.support.tasks.add",
    "args": [1, 2],
    "kwargs": {},
    "queue": "default",
}


def payload(**changes):
    return json.dumps({**GOOD, **changes})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (payload(enqueued_at=1).replace("1}", "Infinity}"), "not valid JSON"),
        (payload(run_after=1).replace('"run_after": 1', '"run_after": NaN'), "not valid JSON"),
        (payload(run_after=1).replace("1}", "1e400}"), "not valid JSON"),
        (payload(run_after=1e20), "'run_after' is not a time"),
        (payload(run_after=-1), "'run_after' is not a time"),
        (payload(run_after="soon"), "'run_after' is not a time"),
        (payload(queue=[1]), "'queue' is a list, not a str"),
        (payload(queue="../other"), "invalid queue"),
        (payload(priority=1000), "outside -100..100"),
        (payload(priority=True), "not a whole number"),
        (payload(priority=1.5), "not a whole number"),
        (payload(args={"a": 1}), "'args' is a dict, not a list"),
        (payload(kwargs=[]), "'kwargs' is a list, not a dict"),
        (payload(task=None), "'task' is a NoneType, not a str"),
        (payload(v=True), "version True is not supported"),
        (json.dumps({"v": 1}), "has no 'task'"),
    ],
)
def test_every_envelope_field_is_checked(text, reason):
    with pytest.raises(InvalidPayload, match=reason):
        Envelope.loads(text, 1_000_000)


def test_a_legacy_enqueued_at_of_any_value_is_ignored():
    assert (
        Envelope.loads(payload(enqueued_at=1e20), 1_000_000).task_path == "tests.support.tasks.add"
    )


def test_a_job_record_reads_any_fields_without_raising():
    garbage = {
        "payload": "\x00",
        "status": "EXPLODED",
        "attempts": "-3",
        "lost": "NaN",
        "priority": "9" * 400,
        "enqueued_at": "1e400",
        "started_at": "-1",
        "finished_at": "99999999999999999999",
        "errors": '[{"traceback": 1}, "x", 3]',
        "result": "{",
        "workers": "",
    }
    record = JobRecord.parse("j", garbage, 100)
    assert (record.status, record.attempts, record.lost, record.priority) == ("READY", 0, 0, 100)
    assert (record.enqueued_at, record.started_at, record.finished_at) == (None, None, None)
    assert record.errors == [{"exception_class_path": "", "traceback": "1"}]
    assert record.return_value == (False, None)
    assert record.envelope is None and "not valid JSON" in record.problem


def test_long_tracebacks_keep_their_head_and_tail():
    text = "head\n" + "x" * 100_000 + "\nValueError: the end"
    cut = cut_traceback(text, 1000)
    assert len(cut) < 1100 and cut.startswith("head") and cut.endswith("ValueError: the end")


@pytest.mark.parametrize(
    ("errors", "reason"),
    [
        ([], "no error recorded"),
        (
            [{"exception_class_path": "builtins.ValueError", "traceback": ""}],
            "builtins.ValueError",
        ),
        ([{"exception_class_path": "", "traceback": " \n "}], "no error recorded"),
        (
            [{"exception_class_path": "x", "traceback": "Trace\nValueError: boom\n"}],
            "ValueError: boom",
        ),
    ],
)
def test_task_failed_says_why_whatever_error_is_stored(errors, reason):
    result = SimpleNamespace(
        errors=[SimpleNamespace(**error) for error in errors],
        task=SimpleNamespace(module_path="tests.support.tasks.fail"),
        id="j1",
    )
    assert str(TaskFailed(result)) == f"Task tests.support.tasks.fail (j1) failed: {reason}"


# Arguments as callers pass them: JSON values, with tuples where JSON has lists.
call_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    args=st.lists(call_values, max_size=4).map(tuple),
    kwargs=st.dictionaries(st.text(max_size=4), call_values, max_size=3),
    fields=st.sampled_from(
        [
            {},
            {"status": "RUNNING", "started_at": "1700000000000", "attempts": "1"},
            {"status": "SUCCESSFUL", "result": "[1, 2]", "finished_at": "1700000000001"},
            {"status": "FAILED", "errors": '[{"exception_class_path": "x.Y", "traceback": "t"}]'},
        ]
    ),
)
def test_a_result_built_field_by_field_is_what_djangos_dataclass_makes(args, kwargs, fields):
    """make_result sets a result's fields one by one, skipping the dataclass's __init__
    and its copy of the arguments where none is a container: the result must be the
    one that __init__ makes, field for field, JSON's lists for the caller's tuples."""
    task = registry.get("tests.support.tasks.noop_any")
    envelope = Envelope("tests.support.tasks.noop_any", list(args), dict(kwargs), "default")
    record = JobRecord("j", fields, envelope)
    made = make_result("default", task, record)
    expected = RedisTaskResult(
        task=task,
        id="j",
        status=TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_attempted_at=record.last_attempted_at,
        args=list(args),
        kwargs=dict(kwargs),
        backend="default",
        errors=[TaskError(**error) for error in record.errors],
        worker_ids=record.worker_ids,
    )
    if record.status == "SUCCESSFUL":
        object.__setattr__(expected, "_return_value", record.return_value[1])
    for field in dataclasses.fields(expected):
        assert getattr(made, field.name) == getattr(expected, field.name), field.name
        assert type(getattr(made, field.name)) is type(getattr(expected, field.name)), field.name
