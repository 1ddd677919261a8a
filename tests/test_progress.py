"""JobProgress: a task that takes a context reports how far it is (``set_progress``); any
process reads it from the job's result while it runs, and after; reports are written a
few times a second however often they come, the last one always; a late write is
refused; a retry starts with none; bad amounts are refused at the call."""

import math
import signal
import threading
import time
from decimal import Decimal
from fractions import Fraction
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue import group
from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.core.jobs import JobRecord, error_info, to_json
from django_redisqueue.core.progress import (
    MAX_NOTE_CHARS,
    WRITE_INTERVAL,
    JobProgress,
    read_progress,
    summed,
)
from django_redisqueue.runtime.progress import ProgressWriter
from django_redisqueue.store.wire import Outcome
from django_redisqueue.testing import run_jobs
from tests.conftest import run_worker_here, start_manage, wait_until
from tests.support import tasks
from tests.support.entries import as_hash
from tests.test_admin import BASE


@pytest.mark.parametrize(
    "task", [tasks.reports_then_waits, tasks.reports_then_waits_async], ids=["sync", "async"]
)
def test_another_process_reads_a_running_jobs_progress_and_its_last_after(r, task):
    gate = f"test:gate:{task.name}"
    worker = start_manage("runworker")
    try:
        result = task.enqueue(1000, gate)

        def reported() -> bool:
            result.refresh()
            return result.progress is not None

        wait_until(reported, 30, "the job's progress")
        assert result.status == TaskResultStatus.RUNNING
        # The last of the 1,000 reports: written within an interval, as the task waits.
        wait_until(lambda: (result.refresh(), result.progress)[1].done == 1000, 10, "the last")
        assert result.progress == JobProgress(1000, 1000, "row 1000")
        assert result.progress.percent == 100
        r.rpush(gate, 1)
        assert result.wait(timeout=30) == 1000
        assert result.progress == JobProgress(1000, 1000, "row 1000")  # kept once it ended
        assert task.get_backend().get_result(result.id).progress == result.progress
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def test_a_thousand_reports_make_a_few_writes_and_the_last_is_stored(r, backend):
    writes = []
    real = ProgressWriter._write

    def counted(self, pending):
        writes.append(dict(pending))
        real(self, pending)

    r.rpush("test:gate:counted", 1)  # the task does not wait
    result = tasks.reports_then_waits.enqueue(1000, "test:gate:counted")
    began = time.monotonic()
    with patch.object(ProgressWriter, "_write", counted):
        run_worker_here(backend)
    took = time.monotonic() - began
    # The writer's thread writes at most once per interval, plus the attempt's last.
    assert 1 <= len(writes) <= 2 + took / WRITE_INTERVAL, (len(writes), took)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.progress == JobProgress(1000, 1000, "row 1000")


def test_a_write_after_the_job_ended_or_by_another_owner_is_refused(r, backend):
    r.rpush("test:gate:late", 1)
    result = tasks.reports_then_waits.enqueue(3, "test:gate:late")
    run_worker_here(backend)
    job = backend.keys.job(result.id)
    owner = r.hget(job, "owner")
    stored = r.hget(job, "progress")
    broker = backend.broker
    record = JobProgress(1, 3).record(1)
    assert broker.report_progress([(result.id, owner, record)]) == [False]  # it has ended
    assert broker.report_progress([(result.id, "someone/1", record)]) == [False]
    assert broker.report_progress([("0" * 32, owner, record)]) == [False]  # no such job
    assert r.hget(job, "progress") == stored


def test_a_retry_starts_without_the_progress_of_the_attempt_before(r, backend):
    result = tasks.reports_and_fails_once.enqueue()
    first, second = run_jobs(backend)
    assert first.progress == JobProgress(5, 10, "half way")
    assert second.status == TaskResultStatus.SUCCESSFUL
    assert second.return_value is True  # its context's result had none
    result.refresh()
    assert result.progress is None  # the field holds attempt 1's: not this attempt's
    assert r.hget(backend.keys.job(result.id), "progress")


def test_a_job_given_back_forgets_the_progress_of_its_attempt(r, backend):
    result = tasks.reports_then_waits.enqueue(4, "test:gate:given-back")
    broker = backend.broker
    _, claimed = broker.claim(["default"], "w1", None, broadcasts=False)
    assert claimed.job_id == result.id
    assert broker.report_progress([(result.id, claimed.owner, JobProgress(2, 4).record(1))])
    result.refresh()
    assert result.progress == JobProgress(2, 4)
    broker.abandon("w1")  # a lost reply: given back, its attempt forgotten
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.progress is None
    assert r.hget(backend.keys.job(result.id), "progress") is None


def test_the_immediate_backend_keeps_progress_on_the_result(r, settings):
    settings.TASKS = {"default": {"BACKEND": "django_redisqueue.immediate.ImmediateBackend"}}
    r.rpush("test:gate:immediate", 1)  # the task does not wait
    result = tasks.reports_then_waits.enqueue(3, "test:gate:immediate")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.progress == JobProgress(3, 3, "row 3")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("1",), TypeError),
        ((True,), TypeError),
        ((None,), TypeError),
        ((-1,), ValueError),
        ((math.nan,), ValueError),
        ((math.inf,), ValueError),
        ((1, "10"), TypeError),
        ((1, -10), ValueError),
        ((1, 10, 3), TypeError),
    ],
)
def test_amounts_that_are_not_numbers_of_zero_or_more_are_refused(args, error):
    with pytest.raises(error):
        JobProgress.checked(*args)


def test_a_long_note_is_cut_and_amounts_read_as_a_fraction():
    assert JobProgress.checked(1, 2, "x" * 1000).note == "x" * MAX_NOTE_CHARS
    assert JobProgress(1, 4).fraction == 0.25
    assert JobProgress(9, 4).fraction == 1.0  # more done than the total: full
    assert JobProgress(0, 0).fraction == 1.0  # nothing to do: done
    assert JobProgress(3).fraction is None and JobProgress(3).percent is None
    assert summed([JobProgress(1, 4), None, JobProgress(2, 4)]) == JobProgress(3, 8)
    assert summed([JobProgress(1, 4), JobProgress(2)]) == JobProgress(3, None)
    assert summed([None]) is None


@given(st.text() | st.from_regex(r'\{"attempt":1,"done":.*\}', fullmatch=True))
def test_a_progress_field_holding_anything_reads_as_none_or_a_progress(text):
    progress = read_progress(text, 1)
    assert progress is None or isinstance(progress, JobProgress)
    record = JobRecord.parse("a" * 32, {"progress": text, "attempts": "1"}, 1000)
    assert record.progress == progress


@given(
    done=st.integers(0, 10**12) | st.floats(0, 1e12),
    total=st.none() | st.integers(0, 10**12),
    note=st.text(max_size=300),
    attempt=st.integers(0, 100),
)
def test_a_record_reads_back_as_written_for_its_attempt_only(done, total, note, attempt):
    progress = JobProgress.checked(done, total, note)
    assert read_progress(progress.record(attempt), attempt) == progress
    assert read_progress(progress.record(attempt), attempt + 1) is None


def test_reports_from_many_threads_at_once_each_keep_their_last(r, backend):
    """The writer's thread and the attempts' flushes share the pending reports: the
    value stored for each job is its last, whatever order the threads ran in."""
    broker = backend.broker
    results = [tasks.reports_then_waits.enqueue(1, f"test:gate:t{n}") for n in range(8)]
    claims = [broker.claim(["default"], f"w{n}", None, broadcasts=False)[1] for n in range(8)]
    writer = ProgressWriter(broker)

    def report_many(claimed) -> None:
        report = writer.reporter(claimed.job_id, claimed.owner, 1)
        for done in range(1, 301):
            report(JobProgress(done, 300))
        writer.flush(claimed.job_id, claimed.owner)

    threads = [threading.Thread(target=report_many, args=(c,)) for c in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        result.refresh()
        assert result.progress == JobProgress(300, 300)


@pytest.mark.django_db
def test_the_job_page_the_running_list_and_the_group_page_show_progress(manager, backend):
    result = group([tasks.add.job(1, 1), tasks.add.job(2, 2), tasks.add.job(3, 3)]).enqueue()
    broker = backend.broker
    claims = [broker.claim(["default"], f"w{n}", None, broadcasts=False)[1] for n in range(2)]
    first, second = claims
    assert broker.report_progress(
        [
            (first.job_id, first.owner, JobProgress(1, 4, "<b>rows</b>").record(1)),
            (second.job_id, second.owner, JobProgress(2, 4).record(1)),
        ]
    ) == [True, True]
    job_page = manager.get(BASE + f"job/{first.job_id}/").text
    assert '<progress max="100" value="25">' in job_page
    assert "1 of 4 (25%): &lt;b&gt;rows&lt;/b&gt;" in job_page  # a note is text
    running = manager.get(BASE + "running/").text
    assert "1 of 4 (25%)" in running and "2 of 4 (50%)" in running
    group_page = manager.get(BASE + f"group/{result.id}/").text
    assert "3 of 8 (37%)" in group_page  # the members that reported, summed


HUGE = '{"attempt":1,"done":1' + "0" * 400 + "}"  # an int past a float's range
DEEP = "[" * 100_000  # nested past the recursion limit


@pytest.mark.django_db
@pytest.mark.parametrize("junk", [HUGE, DEEP], ids=["huge int", "deep"])
def test_a_junk_progress_field_breaks_neither_get_result_nor_the_dashboard(
    r, backend, manager, junk
):
    assert read_progress(junk, 1) is None
    result = tasks.add.enqueue(1, 2)
    r.hset(as_hash(r, backend.keys, result.id), mapping={"progress": junk, "attempts": 1})
    result.refresh()
    assert result.progress is None
    assert manager.get(BASE + f"job/{result.id}/").status_code == 200


@pytest.mark.django_db
def test_a_note_with_a_lone_surrogate_shows_on_the_dashboard(r, backend, manager):
    """As ``os.listdir()`` gives an undecodable file name."""
    result = tasks.add.enqueue(1, 2)
    _, claimed = backend.broker.claim(["default"], "w1", None, broadcasts=False)
    record = JobProgress.checked(1, 2, "reading log-\udcff.txt").record(1)
    assert backend.broker.report_progress([(claimed.job_id, claimed.owner, record)]) == [True]
    assert manager.get(BASE + f"job/{result.id}/").status_code == 200
    assert manager.get(BASE + "running/").status_code == 200


@pytest.mark.parametrize("amount", [Decimal("2.5"), Fraction(5, 2)], ids=["Decimal", "Fraction"])
def test_real_numbers_of_other_types_are_amounts(amount):
    assert JobProgress.checked(amount, 10).fraction == 0.25
    with pytest.raises(ValueError):
        JobProgress.checked(10**400)  # past a float's range: not finite


def test_the_end_of_an_attempt_that_never_reported_waits_for_no_other_write(backend):
    writer = ProgressWriter(backend.broker)
    writing = threading.Event()

    def slow_write(self, pending):  # Redis slow to answer another job's progress
        writing.set()
        time.sleep(1.0)

    with patch.object(ProgressWriter, "_write", slow_write):
        writer.reporter("a" * 26, "w/1", 1)(JobProgress(1, 2))
        assert writing.wait(5)
        began = time.monotonic()
        writer.flush("b" * 26, "w/1")
        took = time.monotonic() - began
    assert took < 0.5, f"the attempt's end waited {took:.2f} s for another job's write"


def test_a_stale_attempts_report_does_not_replace_the_running_attempts_last(backend):
    """Two attempts of one job in one process: a slot whose lease was lost, still running."""
    result = tasks.add.enqueue(1, 2)
    _, claimed = backend.broker.claim(["default"], "w2", None, broadcasts=False)
    writer = ProgressWriter(backend.broker)
    with patch.object(ProgressWriter, "_run", lambda self: None):  # only the flush writes
        writer.reporter(claimed.job_id, claimed.owner, 1)(JobProgress(5, 10, "last"))
        writer.reporter(claimed.job_id, "w1/1", 1)(JobProgress(3, 10, "stale"))
        writer.flush(claimed.job_id, claimed.owner)
    result.refresh()
    assert result.progress == JobProgress(5, 10, "last")


def test_set_progress_under_djangos_own_immediate_backend(r, settings):
    """A plain TaskResult (another backend's runner) takes no progress, and fails nothing."""
    from django_redisqueue.compat import ImmediateBackend

    path = f"{ImmediateBackend.__module__}.{ImmediateBackend.__qualname__}"
    settings.TASKS = {"default": {"BACKEND": path}}
    r.rpush("test:gate:django-immediate", 1)
    result = tasks.reports_then_waits.enqueue(3, "test:gate:django-immediate")
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors


def test_a_give_back_keeps_the_progress_of_the_attempt_it_returns_to(backend):
    broker = backend.broker
    result = tasks.add.enqueue(1, 2)
    _, first = broker.claim(["default"], "w1", None, broadcasts=False)
    assert broker.report_progress([(first.job_id, first.owner, JobProgress(5, 10).record(1))])
    error = to_json(error_info(ValueError("boom")))
    assert broker.finish(Outcome(first.job_id, first.owner, "FAILED", error=error))
    assert broker.operate("retry_failed", "default", [result.id]) == 1
    _, second = broker.claim(["default"], "w2", None, broadcasts=False)
    broker.abandon("w2")  # attempt 2 given back, uncounted, unrun: attempt 1 is the latest
    result.refresh()
    assert result.attempts == 1 and second.owner == "w2/2"
    assert result.progress == JobProgress(5, 10)
