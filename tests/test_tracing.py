"""OpenTelemetry traces (docs/howto/tracing.md): the context crosses from the enqueue to
a real worker process through Redis; every attempt continues the enqueue's trace, linked
to the attempt before it (a retry, a recovery after SIGKILL, an operator's retry); a
group's callback links to its members. Spans are recorded by the SDK: in memory in
this process, and by the processes a test starts into a file (tests/support/traces.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import transaction
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from django_redisqueue import chain, group
from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.core import tracing
from django_redisqueue.core.fanout import broadcast
from django_redisqueue.core.jobs import Envelope, JobRecord
from django_redisqueue.exceptions import LeaseLost
from tests.conftest import ROOT, child_env, run_worker_here, wait_until
from tests.support import tasks
from tests.support.entries import as_hash
from tests.support.traces import read_spans, span_dict

pytestmark = pytest.mark.django_db(transaction=True)


class Spans:
    """The spans this process records (its enqueues, and the workers it runs itself)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[dict]:
        return [span_dict(span) for span in self.exporter.get_finished_spans()]


@pytest.fixture
def spans(monkeypatch) -> Spans:
    """This app's tracer records into memory for this test only (no global provider:
    the other tests' jobs stay untraced)."""
    recorded = Spans()
    monkeypatch.setattr(tracing, "_tracer", recorded.tracer)
    monkeypatch.setattr(tracing, "set_up", lambda: True)
    return recorded


@pytest.fixture
def worker_spans(tmp_path, monkeypatch) -> Path:
    """The file the worker processes this test starts write their spans to."""
    path = tmp_path / "spans.jsonl"
    monkeypatch.setenv("REDISQUEUE_TEST_SPANS", str(path))
    return path


def kind(span: dict) -> str:
    return span["kind"].removeprefix("SpanKind.")


def ids(span: dict) -> tuple[str, str]:
    return span["context"]["trace_id"], span["context"]["span_id"]


def linked(span: dict) -> list[tuple[str, str, dict]]:
    return [
        (link["context"]["trace_id"], link["context"]["span_id"], link["attributes"])
        for link in span["links"]
    ]


def attempts_of(spans: list[dict], job_id: str) -> list[dict]:
    """The consumer spans of a job's attempts, in their order."""
    found = [
        s
        for s in spans
        if kind(s) == "CONSUMER" and s["attributes"]["messaging.message.id"] == job_id
    ]
    return sorted(found, key=lambda s: s["attributes"]["redisqueue.job.attempt"])


def is_child_of(span: dict, parent: dict) -> bool:
    return (
        span["context"]["trace_id"] == parent["context"]["trace_id"]
        and span["parent_id"] == parent["context"]["span_id"]
    )


def links_to(span: dict, other: dict, outcome: str) -> bool:
    return any(
        (trace_id, span_id) == ids(other) and attributes["redisqueue.job.outcome"] == outcome
        for trace_id, span_id, attributes in linked(span)
    )


# Across a real worker process


def test_a_views_trace_goes_on_in_a_worker_process_through_retries_and_a_group(
    spans, worker_spans, procs
):
    with spans.tracer.start_as_current_span("view"):
        plain = tasks.add.enqueue(2, 3)
        retried = tasks.fails_twice.enqueue("traced")
        fanned = group(
            [tasks.add.job(i, i) for i in range(3)], callback=tasks.collect.job("traced")
        ).enqueue()
    procs.start("runworker")
    procs.start("runscheduler")
    assert retried.wait(timeout=60) == 3
    fanned.wait(timeout=60)
    callback_id = fanned.callback_id
    wait_until(lambda: len(attempts_of(read_spans(worker_spans), callback_id)) == 1, 30)
    procs.stop_all()
    here, there = spans.all(), read_spans(worker_spans)
    view = next(s for s in here if s["name"] == "view")
    producers = {s["attributes"].get("messaging.message.id"): s for s in here}

    # The plain job: the view, its enqueue (producer), the attempt (consumer).
    enqueue = producers[plain.id]
    assert kind(enqueue) == "PRODUCER" and enqueue["name"] == "send default"
    assert is_child_of(enqueue, view)
    assert enqueue["attributes"] == {
        "messaging.system": "django_redisqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "redisqueue.operation": "enqueue",
        "messaging.destination.name": "default",
        "messaging.message.id": plain.id,
    }
    (ran,) = attempts_of(there, plain.id)
    assert ran["name"] == "process default" and is_child_of(ran, enqueue)
    attributes = ran["attributes"]
    assert attributes["messaging.system"] == "django_redisqueue"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "default"
    assert attributes["redisqueue.task"] == "tests.support.tasks.add"
    assert attributes["redisqueue.job.attempt"] == 1
    assert attributes["redisqueue.job.outcome"] == "SUCCESSFUL"
    assert attributes["redisqueue.job.wait_ms"] >= 0
    assert attributes["messaging.client.id"].count(":") == 2  # the worker's id
    assert ran["status"]["status_code"] == "UNSET" and not ran["links"]

    # The retried job: three attempts, each a child of its enqueue (never of the attempt
    # before), each linked to the one before; the failures carry their exception.
    first, second, third = attempts_of(there, retried.id)
    assert all(is_child_of(s, producers[retried.id]) for s in (first, second, third))
    for failed in (first, second):
        assert failed["attributes"]["redisqueue.job.outcome"] == "RETRY"
        assert failed["status"]["status_code"] == "ERROR"
        assert failed["attributes"]["error.type"] == "builtins.ConnectionError"
        (event,) = failed["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.type"] == "ConnectionError"
    assert not first["links"]
    assert links_to(second, first, "RETRY") and links_to(third, second, "RETRY")
    assert [link[2]["redisqueue.job.attempt"] for link in linked(third)] == [2]
    assert third["attributes"]["redisqueue.job.outcome"] == "SUCCESSFUL"

    # The group: one producer span for its members and callback; the callback's
    # attempt links to each member's.
    (group_send,) = [
        s for s in here if s["attributes"].get("redisqueue.operation") == "enqueue_group"
    ]
    assert group_send["attributes"]["messaging.batch.message_count"] == 4
    members = [attempts_of(there, member_id)[0] for member_id in fanned.member_ids]
    (callback,) = attempts_of(there, callback_id)
    assert all(is_child_of(s, group_send) for s in [*members, callback])
    assert all(links_to(callback, member, "SUCCESSFUL") for member in members)
    assert len(callback["links"]) == 3


def test_after_a_sigkill_the_recovered_attempt_links_to_the_lost_one(
    spans, worker_spans, procs, r
):
    leased = task_backends["leased"]
    with spans.tracer.start_as_current_span("view"):
        job = tasks.crash_once_traced.using(backend="leased").enqueue()
    (enqueue,) = [s for s in spans.all() if kind(s) == "PRODUCER"]
    # The task kills its worker once the heartbeat (a third of the 1 s lease) stored
    # the running attempt's trace record.
    first = procs.start("runworker", "--backend", "leased")
    assert first.wait(timeout=60) == -signal.SIGKILL
    procs.running.remove(first)
    record = r.hget(leased.keys.job(job.id), "trace")
    assert record is not None and record.split(" ")[:2] == ["1", "RUNNING"]
    assert attempts_of(read_spans(worker_spans), job.id) == []  # it never ended

    procs.start("runscheduler", "--backend", "leased")
    procs.start("runworker", "--backend", "leased")
    assert leased.get_result(job.id).wait(timeout=60) == "attempt 2"
    procs.stop_all()

    (recovered,) = attempts_of(read_spans(worker_spans), job.id)
    assert is_child_of(recovered, enqueue)  # not of the lost attempt's span
    assert recovered["attributes"]["redisqueue.job.attempt"] == 2
    assert recovered["attributes"]["redisqueue.job.recoveries"] == 1
    ((trace_id, span_id, attributes),) = linked(recovered)
    assert trace_id == enqueue["context"]["trace_id"]
    assert span_id == "0x" + record.split(" ")[2].split("-")[2]
    assert attributes == {"redisqueue.job.attempt": 1, "redisqueue.job.outcome": "LOST"}


# In this process: where tracing meets the rest


def test_a_job_enqueued_on_commit_is_sent_by_its_span_at_the_commit(spans, backend):
    with transaction.atomic():
        later = backend.enqueue_on_commit(tasks.add, (2, 2), {})
    run_worker_here(backend)
    recorded = spans.all()
    (created,) = [s for s in recorded if s["attributes"].get("messaging.message.id") == later.id
                  and kind(s) == "PRODUCER"]  # fmt: skip
    assert created["name"] == "send default"
    assert created["attributes"]["redisqueue.at_commit"] is True
    (ran,) = attempts_of(recorded, later.id)
    assert is_child_of(ran, created)
    assert backend.get_result(later.id).status == TaskResultStatus.SUCCESSFUL


def test_a_job_through_the_outbox_keeps_the_context_of_its_enqueue(spans):
    outboxed = task_backends["outbox-default"]
    with spans.tracer.start_as_current_span("view"), transaction.atomic():
        job = tasks.add.using(backend="outbox-default").enqueue(3, 4)
    run_worker_here(outboxed)
    recorded = spans.all()
    (created,) = [s for s in recorded if kind(s) == "PRODUCER"]
    assert created["name"] == "send default"
    assert created["attributes"]["redisqueue.at_commit"] is True
    (ran,) = attempts_of(recorded, job.id)
    assert is_child_of(ran, created)


def test_an_operators_retry_links_to_the_failed_attempt(spans, backend):
    with spans.tracer.start_as_current_span("view"):
        job = tasks.fail.enqueue("once")
    run_worker_here(backend)
    assert backend.broker.operate("retry_failed", "default", [job.id]) == 1
    run_worker_here(backend)
    failed, again = attempts_of(spans.all(), job.id)
    assert failed["attributes"]["redisqueue.job.outcome"] == "FAILED"
    assert failed["attributes"]["error.type"] == "builtins.ValueError"
    assert links_to(again, failed, "FAILED")
    (enqueue,) = [s for s in spans.all() if kind(s) == "PRODUCER"]
    assert is_child_of(again, enqueue)


def test_a_job_given_back_links_its_next_attempt_to_the_one_stopped(spans, backend):
    job = tasks.given_back_once.enqueue()
    run_worker_here(backend)
    stopped, again = attempts_of(spans.all(), job.id)
    assert stopped["attributes"]["redisqueue.job.outcome"] == "RELEASE"
    assert stopped["status"]["status_code"] == "UNSET"  # not the job's failure
    assert links_to(again, stopped, "RELEASE")
    assert not is_child_of(again, stopped)


def test_a_broadcast_and_a_chain_have_their_producer_spans(spans, backend):
    with spans.tracer.start_as_current_span("view"):
        broadcast(tasks.record.job("everyone"), queue="high")
        steps = chain(tasks.add.job(1, 1), tasks.urgent.job("then")).enqueue()
    by_operation = {s["attributes"]["redisqueue.operation"]: s for s in spans.all()
                    if kind(s) == "PRODUCER"}  # fmt: skip
    sent = by_operation["broadcast"]
    assert sent["name"] == "send high"
    assert sent["attributes"]["messaging.destination.name"] == "high"
    chained = by_operation["enqueue_chain"]
    assert chained["name"] == "send"  # its jobs go to two queues
    assert "messaging.destination.name" not in chained["attributes"]
    assert chained["attributes"]["messaging.batch.message_count"] == len(steps) == 2


def test_a_unique_job_sent_at_the_commit_names_no_job_before_it_is_stored(spans, backend):
    with transaction.atomic():
        backend.enqueue_on_commit(tasks.unique_report, ("tuesday",), {})
    (sent,) = [s for s in spans.all() if kind(s) == "PRODUCER"]
    assert "messaging.message.id" not in sent["attributes"]


def test_a_chains_later_step_has_no_wait_of_its_own(spans, backend):
    """It waited for the step before, not in its queue: no wait is made up for it."""
    first, second = chain(tasks.add.job(1, 1), tasks.add.job(2, 2)).enqueue()
    run_worker_here(backend)
    recorded = spans.all()
    assert "redisqueue.job.wait_ms" in attempts_of(recorded, first.id)[0]["attributes"]
    assert "redisqueue.job.wait_ms" not in attempts_of(recorded, second.id)[0]["attributes"]


def test_an_attempt_stopped_by_a_lost_lease_ends_lost(spans):
    job = JobRecord.parse(
        "j", {"payload": '{"v":1,"task":"t"}', "queue": "q", "attempts": "1"}, 1000
    )
    with pytest.raises(LeaseLost), tracing.attempt(job, "w"):
        raise LeaseLost("the lease of job j was lost")
    (span,) = spans.all()
    assert span["attributes"]["redisqueue.job.outcome"] == "LOST"
    assert span["status"]["status_code"] == "ERROR"
    assert span["attributes"]["error.type"] == "django_redisqueue.exceptions.LeaseLost"


def test_a_stopping_worker_waits_for_an_exporter_that_hangs_a_bounded_time(monkeypatch):
    never = threading.Event()

    class Hanging:
        def force_flush(self, timeout_millis):
            never.wait()  # an exporter that ignores its timeout (a collector down)

    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: Hanging())
    monkeypatch.setattr(tracing, "set_up", lambda: True)
    monkeypatch.setattr(tracing, "FLUSH_TIMEOUT_MS", 50)
    flushing = threading.Thread(target=tracing.flush, daemon=True)
    flushing.start()
    flushing.join(30)
    assert not flushing.is_alive()
    never.set()


def test_an_sdk_turned_off_is_no_sdk(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", TracerProvider)
    monkeypatch.setattr(tracing, "_provider_set", False)
    monkeypatch.setattr(tracing, "_tracer", None)
    assert tracing.set_up() is False and tracing.carrier() is None


def test_a_payload_that_cannot_be_read_fails_its_span(spans, backend, r):
    r.hset(backend.keys.job("unreadable"), mapping={"payload": "{", "queue": "default"})
    r.zadd(backend.keys.queue("default"), {"unreadable": 1})
    run_worker_here(backend)
    (ran,) = attempts_of(spans.all(), "unreadable")
    assert ran["status"]["status_code"] == "ERROR"
    assert ran["attributes"]["error.type"].endswith("InvalidPayload")
    assert "redisqueue.task" not in ran["attributes"]


def test_a_unique_jobs_enqueue_names_the_job_that_holds_the_key(spans, backend):
    first = tasks.unique_report.enqueue("monday")
    again = tasks.unique_report.enqueue("monday")
    assert again.id == first.id
    sent = [s["attributes"]["messaging.message.id"] for s in spans.all() if kind(s) == "PRODUCER"]
    assert sent == [first.id, first.id]  # no span names a job that was never stored


def test_an_exception_that_cannot_be_printed_fails_its_job_not_the_worker(spans, backend):
    job = tasks.raises_unprintable.enqueue()
    run_worker_here(backend)
    assert backend.get_result(job.id).status == TaskResultStatus.FAILED
    (ran,) = attempts_of(spans.all(), job.id)
    assert ran["status"]["status_code"] == "ERROR"
    assert ran["attributes"]["error.type"] == "tests.support.tasks.Unprintable"
    assert [event["name"] for event in ran["events"]] == ["exception"]


GARBAGE_RECORDS = [
    "\u00b2 RETRY 00-" + "1" * 32 + "-" + "2" * 16 + "-01",  # a digit, but not ASCII
    "1 RETRY",
    "\x00",
    "9" * 40 + " RUNNING 00-" + "1" * 32 + "-" + "2" * 16 + "-01",
]


@pytest.mark.parametrize("record", GARBAGE_RECORDS)
def test_a_job_whose_trace_record_is_garbage_runs_traced(spans, backend, r, record):
    job = tasks.add.enqueue(1, 2)
    r.hset(as_hash(r, backend.keys, job.id), "trace", record)
    run_worker_here(backend)
    assert backend.get_result(job.id).return_value == 3
    (ran,) = attempts_of(spans.all(), job.id)
    assert ran["links"] == []


@pytest.mark.parametrize(("state", "carried"), [("a=1", True), ("a=" + "x" * 600, False)])
def test_a_job_carries_its_trace_not_the_requests_baggage(spans, backend, r, state, carried):
    """A request's baggage, and a tracestate over W3C's 512 characters, come from whoever
    calls the site: not carried."""
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState.from_header([state]))  # fmt: skip
    token = otel_context.attach(
        baggage.set_baggage("user", "x" * 4000, set_span_in_context(NonRecordingSpan(remote)))
    )
    try:
        job = tasks.add.enqueue(1, 1)
    finally:
        otel_context.detach(token)
    envelope = json.loads(backend.queries.get_job(job.id)["payload"])
    assert sorted(envelope["trace"]) == (
        ["traceparent", "tracestate"] if carried else ["traceparent"]
    )
    assert envelope["trace"]["traceparent"].startswith("00-" + f"{0x1234:032x}")


def test_without_an_sdk_no_job_carries_a_context_even_inside_a_remote_one(backend, r):
    """No SDK set up, in a context a request brought (a remote span): groups, chains
    and single jobs alike carry nothing."""
    remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
    token = otel_context.attach(set_span_in_context(NonRecordingSpan(remote)))
    try:
        single = tasks.add.enqueue(1, 1)
        grouped = group([tasks.add.job(2, 2)]).enqueue()
        chained = chain(tasks.add.job(3, 3), tasks.add.job(4, 4)).enqueue()
    finally:
        otel_context.detach(token)
    for job_id in [single.id, *grouped.member_ids, *(step.id for step in chained)]:
        assert "trace" not in json.loads(backend.queries.get_job(job_id)["payload"])


def test_without_a_recording_span_nothing_is_carried_nor_stored(backend, r):
    """No SDK set up (this process's default): no context in the envelope, no trace
    record in Redis, so a waiting job costs what it costs untraced."""
    job = tasks.add.enqueue(1, 1)
    payload = backend.queries.get_job(job.id)["payload"]
    assert "trace" not in json.loads(payload)
    run_worker_here(backend)
    assert r.hget(backend.keys.job(job.id), "trace") is None
    assert tracing.carrier() is None


def test_without_opentelemetry_nothing_imports_it_and_jobs_run(tmp_path):
    """The [otel] extra not installed: no import of it, jobs run as ever."""
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if not installed: any import of it fails
import django
django.setup()
from django_redisqueue.core import tracing
from django_redisqueue.compat import task_backends
from tests.support import tasks
from tests.conftest import run_worker_here
assert tracing.ON is False
backend = task_backends["default"]
job = tasks.add.enqueue(20, 22)
run_worker_here(backend)
assert backend.get_result(job.id).return_value == 42
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry."))
assert not loaded, loaded
print("ran untraced")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=child_env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ran untraced" in result.stdout


# Whatever Redis or a payload holds: a trace context never stops a job.

HEADERS = st.dictionaries(st.text(max_size=70), st.text(max_size=100), max_size=10)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(trace=JSON | HEADERS)
def test_an_envelopes_trace_is_read_leniently(trace):
    payload = json.dumps(
        {"v": 1, "task": "tests.support.tasks.add", "args": [1, 2], "trace": trace}
    )
    envelope = Envelope.loads(payload, 10_000, "default")  # never refused for its trace
    assert envelope.args == [1, 2]
    if envelope.trace is not None:
        assert isinstance(envelope.trace, dict) and 0 < len(envelope.trace) <= 8
        assert all(isinstance(v, str) for v in envelope.trace.values())
        assert Envelope.loads(envelope.dumps(), 10_000, "default").trace == envelope.trace


TRACEPARENT = st.from_regex(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]", fullmatch=True)
RECORD = st.builds(
    lambda n, how, tp: f"{n} {how} {tp}",
    st.integers(0, 12),
    st.sampled_from(["RETRY", "RUNNING", "FAILED", "RELEASE", "x"]),
    TRACEPARENT,
) | st.text(max_size=80)


@settings(max_examples=200, deadline=None)
@given(
    record=RECORD,
    headers=st.none() | HEADERS,
    attempts=st.text(max_size=5) | st.integers(0, 12).map(str),
)
def test_an_attempt_traces_whatever_its_hash_holds(record, headers, attempts):
    recorded = Spans()
    payload = json.dumps(
        {"v": 1, "task": "tests.support.tasks.add", **({"trace": headers} if headers else {})}
    )
    fields = {"payload": payload, "queue": "default", "trace": record, "attempts": attempts}
    job = JobRecord.parse("job", fields, 10_000)
    original, tracing._tracer = tracing._tracer, recorded.tracer
    try:
        with tracing.Attempt(job, "w") as attempt:
            stored = attempt.ended("SUCCESSFUL", None)
    finally:
        tracing._tracer = original
    (span,) = recorded.all()
    assert stored.split(" ")[1] == "SUCCESSFUL"
    for trace_id, span_id, attributes in linked(span):
        assert f"{int(trace_id, 16):032x}-{int(span_id, 16):016x}" in record
        assert attributes["redisqueue.job.outcome"] in ("RETRY", "LOST", "FAILED", "RELEASE")
        # Only the attempt just before (the same number after a give-back).
        this = int(span["attributes"]["redisqueue.job.attempt"])
        linked_number = attributes["redisqueue.job.attempt"]
        assert linked_number == (this if "RELEASE" in record else this - 1)
