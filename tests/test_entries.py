"""Jobs kept as entries (docs/protocol.md, "A waiting job kept as an entry"): a fresh
job (no option, due now) lives in a bucket of entries, not in a hash of its own; every
other job keeps its hash, as a process older than entries stored every job. Every
reader of a waiting job reads both forms, so such processes run side by side: jobs of
both forms in one queue run in order, each once, with its arguments; get_result(), the
dashboard, cancel, stop, watch, depends_on, the operator's empty and a relay see a job
kept as an entry as the job it is; an id an entry holds is taken; an entry that does
not parse loses no other job."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.exceptions import NotStoppable
from django_redisqueue.store.wire import NewJob, entry_fields
from tests.conftest import run_worker_here
from tests.support import tasks
from tests.support.entries import entry_text, keep_as_hash
from tests.support.keys import DEFAULT_KEYS as K

pytestmark = pytest.mark.django_db
BASE = "/admin/django_redisqueue/dashboard/default/"


def is_entry(r, job_id: str) -> bool:
    """Kept as an entry, not as a hash (never both)."""
    entry = r.hexists(K.entries(job_id), job_id)
    assert not (entry and r.exists(K.job(job_id))), "an entry beside its hash"
    return entry


def test_a_fresh_job_is_kept_as_an_entry_and_any_other_as_a_hash(r, backend):
    """Fresh: no option, due now. A delay, a unique key, a limit or a fairness key keep
    the job's hash. The entry takes the odd place of its pair in the queue, the hash the
    even one: the claim reads the form its score names first."""
    fresh = tasks.noop.using(priority=3).enqueue()
    hashes = [
        tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(),
        tasks.unique_report.enqueue("2026-11-29"),
        tasks.limited_two.enqueue("limited", 0),
    ]
    assert is_entry(r, fresh.id)
    assert r.hget(K.entries(fresh.id), fresh.id).split("|")[1:3] == ["3", "default"]
    assert int(r.zscore(K.queue("default"), fresh.id)) % 2 == 1
    for result in hashes:
        assert not is_entry(r, result.id) and r.exists(K.job(result.id)), result.task
    plain = NewJob("hash-job", "default", 0, fresh._payload, options='{"limit": "k"}')
    backend.broker.enqueue([plain])
    assert int(r.zscore(K.queue("default"), "hash-job")) % 2 == 0


def test_jobs_of_both_forms_in_one_queue_run_in_order_each_once(r, backend):
    """A deploy with processes that write either form: the worker runs every job in the
    order of its queue (priority, then arrival), with its own arguments, and leaves
    neither an entry nor a job waiting behind. A hash at an entry's odd place (stored so
    by an older process, or given back) is read all the same."""
    results = [
        tasks.record.using(priority=p).enqueue(f"job {i}") for i, p in enumerate([0, 0, 5, 0, 5])
    ]
    for result in results[1::2]:
        assert keep_as_hash(r, K, result.id)
    assert [is_entry(r, result.id) for result in results] == [True, False] * 2 + [True]
    run_worker_here(backend, queues=["default"])
    assert r.lrange(tasks.LOG, 0, -1) == ["job 2", "job 4", "job 0", "job 1", "job 3"]
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.args == [f"job {results.index(result)}"]
    assert not r.keys(K.entries_prefix + "*") and r.zcard(K.queue("default")) == 0


def test_an_enqueue_sent_again_stores_nothing_over_an_entry(r, backend):
    """A call repeated after a lost reply sends the ids it stored: the entry's write
    refuses a fresh one, the look at both forms any other."""
    result = tasks.noop.enqueue()
    payload = r.hget(K.entries(result.id), result.id).split("|", 3)[3]
    before = r.hget(K.entries(result.id), result.id)
    again = [
        NewJob(result.id, "default", 0, payload),
        NewJob(result.id, "other", 0, payload, due_ms=2**42),
        NewJob(result.id, "default", 0, payload, options='{"limit": "k"}'),
    ]
    assert backend.broker.enqueue(again) == [None, None, None]
    assert r.hget(K.entries(result.id), result.id) == before
    assert not r.exists(K.job(result.id)) and r.zcard(K.queue("default")) == 1
    assert not r.exists(K.delayed("other"))


def test_an_entrys_job_reads_as_its_job(r, backend, viewer):
    result = tasks.add.using(priority=-7).enqueue(2, 3)
    assert is_entry(r, result.id)
    found = backend.get_result(result.id)
    assert found.status == TaskResultStatus.READY
    assert (found.args, found.task.priority) == ([2, 3], -7)
    page = viewer.get(BASE + f"job/{result.id}/")
    assert (
        page.status_code == 200 and "READY" in page.text and "tests.support.tasks.add" in page.text
    )
    assert result.id[:10] in viewer.get(BASE + "queue/default/").text
    assert r.hexists(K.entries(result.id), result.id), "a read leaves the entry as it was"


def test_a_job_made_its_hash_while_it_is_read_is_read_all_the_same(r, backend, monkeypatch):
    """A pipeline's reads may interleave with scripts: a script that makes the entry its
    job's hash between the two reads of jobs() leaves a job to read, not a gone one."""
    result = tasks.noop.enqueue()
    assert is_entry(r, result.id)
    queries, execute = backend.queries, backend.queries._execute

    def with_a_script_between(pipe, raise_on_error=True):
        first, rest = pipe.command_stack[:1], pipe.command_stack[1:]
        pipe.command_stack = first
        replies = execute(pipe, raise_on_error)
        assert backend.broker.watch(result.id) == "READY"  # is_job: now a hash
        pipe.command_stack = rest
        return replies + execute(pipe, raise_on_error)

    monkeypatch.setattr(queries, "_execute", with_a_script_between)
    assert queries.jobs([result.id], "status") == [{"status": "READY"}]
    assert r.exists(K.job(result.id)) and not r.hexists(K.entries(result.id), result.id)


def test_python_reads_only_the_entries_the_scripts_read():
    """Digits other than ASCII's (Lua's %d refuses them) make no entry in Python either."""
    assert entry_fields("\u0661\u0667|0|default|{}") is None
    assert entry_fields("17|\uff15|default|{}") is None
    assert entry_fields("17|5|default|{}") is not None


def test_a_job_kept_as_an_entry_is_cancelled(r, backend):
    result = tasks.noop.enqueue()
    assert is_entry(r, result.id)
    result.cancel()
    assert backend.get_result(result.id).status == TaskResultStatus.FAILED
    assert r.zcard(K.queue("default")) == 0 and not r.hexists(K.entries(result.id), result.id)


def test_watch_stop_and_depends_on_find_a_job_kept_as_an_entry(r, backend):
    first = tasks.record.enqueue("first")
    assert is_entry(r, first.id)
    with pytest.raises(NotStoppable):
        first.stop()
    assert backend.broker.watch(first.id) == "READY"
    then = tasks.record.using(depends_on=first.id).enqueue("then")
    assert then.status == TaskResultStatus.READY
    run_worker_here(backend, queues=["default"])
    assert r.lrange(tasks.LOG, 0, -1) == ["first", "then"]
    assert not r.keys(K.entries_prefix + "*")


def test_an_operators_empty_takes_the_entries_with_it(r, backend):
    results = [tasks.noop.enqueue() for _ in range(3)]
    assert keep_as_hash(r, K, results[1].id)
    assert backend.broker.operate("empty", "default") == 3
    assert not r.keys(K.entries_prefix + "*") and not r.keys(K.job_prefix + "*")


def test_an_id_kept_as_an_entry_is_taken_for_a_relay(r, backend):
    """A relay sent again by an older process stores nothing over the entry a newer one
    relayed (its record forgotten: the id alone tells)."""
    result = tasks.noop.enqueue()
    assert is_entry(r, result.id)
    again = NewJob(
        result.id, "default", 0, r.hget(K.entries(result.id), result.id).split("|", 3)[3]
    )
    assert backend.broker.enqueue([again], relayed=True) == [None]
    assert r.zcard(K.queue("default")) == 1 and not r.exists(K.job(result.id))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entry=st.one_of(
        st.text(max_size=40),
        st.builds(
            lambda at, p, q, rest: f"{at}|{p}|{q}|{rest}",
            st.integers(-5, 10**13),
            st.integers(-200, 200),
            st.text(max_size=8),
            st.text(max_size=20),
        ),
    )
)
def test_an_entry_that_does_not_parse_loses_no_other_job(r, backend, entry):
    """An entry spoilt by hand (or by a bug): the claim drops it, and the job behind it in
    the queue runs all the same; Python reads what the scripts read."""
    r.flushdb()
    spoilt = tasks.record.enqueue("spoilt")
    tasks.record.enqueue("good")
    r.delete(K.job(spoilt.id))
    r.hset(K.entries(spoilt.id), spoilt.id, entry)
    parsed = entry_fields(entry)
    run_worker_here(backend, queues=["default"])
    assert "good" in r.lrange(tasks.LOG, 0, -1)
    assert not r.keys(K.entries_prefix + "*")
    if parsed is None:
        assert not r.exists(K.job(spoilt.id)) or r.hget(K.job(spoilt.id), "status") != "SUCCESSFUL"
    else:
        assert r.hget(K.job(spoilt.id), "queue") == parsed["queue"]


def test_entry_text_is_what_the_scripts_read():
    fields = {
        "payload": '{"v":1,"task":"a.b","args":["x|y"]}',
        "queue": "q-1.x",
        "enqueued_at": "1764355200123",
        "status": "READY",
        "priority": "-100",
    }
    assert entry_fields(entry_text(fields)) == fields
    assert "priority" not in entry_fields(entry_text({**fields, "priority": "0"}))
    assert json.loads(entry_fields(entry_text(fields))["payload"])["args"] == ["x|y"]


def test_a_bucket_of_another_type_gives_way_to_the_entry(r, backend):
    """A bucket key spoilt by hand holds no entry: the enqueue replaces it, and stores
    the whole batch, not the jobs before it only."""
    payload = tasks.noop.enqueue()._payload
    r.flushdb()
    r.set(K.entries("bad-1"), "spoilt")
    jobs = [NewJob("ok-1", "default", 0, payload), NewJob("bad-1", "default", 0, payload)]
    assert None not in backend.broker.enqueue(jobs)
    assert is_entry(r, "ok-1") and is_entry(r, "bad-1")
    assert r.zcard(K.queue("default")) == 2
    run_worker_here(backend, queues=["default"])
    assert backend.get_result("bad-1").status == TaskResultStatus.SUCCESSFUL


def test_a_linked_enqueue_refuses_an_id_an_entry_holds(r, backend):
    result = tasks.noop.enqueue()
    again = NewJob(result.id, "default", 0, result._payload)
    assert backend.broker.enqueue_linked([again]) == [None]
    assert is_entry(r, result.id) and r.zcard(K.queue("default")) == 1


@pytest.mark.parametrize("meets_it", ["claim", "empty"])
def test_a_job_key_of_another_type_beside_an_entry_gives_way(r, backend, meets_it):
    """A key of another type where the job's hash would go (written by hand) is no job:
    the claim that takes the entry, or the operator's empty, replaces it, and raises
    nothing."""
    result = tasks.record.enqueue("kept")
    r.set(K.job(result.id), "spoilt")
    if meets_it == "claim":
        run_worker_here(backend, queues=["default"])
        assert r.lrange(tasks.LOG, 0, -1) == ["kept"]
        assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    else:
        assert backend.broker.operate("empty", "default") == 1
        assert not r.exists(K.job(result.id))
    assert not r.keys(K.entries_prefix + "*") and r.zcard(K.queue("default")) == 0
