"""How an enqueue is cut into script calls (``wire.enqueue_batches``): each call is
atomic, so a linked batch is cut only where no job is parted from the one it runs
after, unless a chain is longer than a call; the jobs stay in order, none lost."""

import itertools
import json
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.core.jobs import FAILED, to_json
from django_redisqueue.store import wire
from django_redisqueue.store.wire import NewJob, Outcome, chains_together, enqueue_batches

# Each job: the size of its payload, and which earlier job it runs after (a place back
# from it, 0 for none).
JOBS = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 4)), max_size=30)


def make(specs):
    jobs = []
    for i, (size, back) in enumerate(specs):
        after = jobs[i - back].job_id if 0 < back <= i else ""
        jobs.append(NewJob(f"j{i}", "default", 0, "x" * size, 0, after))
    return jobs


def ids_of(batch, linked):
    width = 7 if linked else 6
    return batch[::width]


@pytest.mark.pure
@given(specs=JOBS, most_jobs=st.integers(1, 6), most_bytes=st.integers(1, 100))
def test_a_linked_batch_keeps_each_job_with_the_one_it_runs_after(specs, most_jobs, most_bytes):
    jobs = make(specs)
    with (
        mock.patch.object(wire, "ENQUEUE_BATCH_JOBS", most_jobs),
        mock.patch.object(wire, "ENQUEUE_BATCH_BYTES", most_bytes),
    ):
        calls = [ids_of(batch, True) for batch in enqueue_batches(jobs, linked=True)]
    assert [job_id for call in calls for job_id in call] == [job.job_id for job in jobs]
    place = {job.job_id: i for i, job in enumerate(jobs)}

    def parts_none(cut):  # no job from ``cut`` on waits for one before it
        return all(place.get(job.after, cut) >= cut for job in jobs[cut:])

    start = 0
    for call in calls[:-1]:
        end = start + len(call)
        size = sum(len(job.payload) for job in jobs[start : end - 1])
        assert len(call) == 1 or (len(call) <= most_jobs and size < most_bytes)  # within
        if not parts_none(end):  # parted: no cut within the call's reach parts none
            full = len(call) == most_jobs or size + len(jobs[end - 1].payload) >= most_bytes
            assert full and not any(parts_none(cut) for cut in range(start + 1, end)), calls
        start = end


@pytest.mark.pure
def test_a_chain_is_kept_in_one_call_and_the_others_fill_around_it():
    jobs = make([(1, 0), (1, 0), (1, 1), (1, 0)])  # x, a, b after a, y
    with mock.patch.object(wire, "ENQUEUE_BATCH_JOBS", 2):
        calls = [ids_of(batch, True) for batch in enqueue_batches(jobs, linked=True)]
        plain = [ids_of(batch, False) for batch in enqueue_batches(jobs)]
    assert calls == [["j0"], ["j1", "j2"], ["j3"]]
    assert plain == [["j0", "j1"], ["j2", "j3"]]  # nothing to keep together


@pytest.mark.pure
def test_no_jobs_is_one_call_all_the_same():
    assert list(enqueue_batches([], linked=True)) == [[]]


@pytest.mark.pure
@given(specs=JOBS)
def test_chains_are_put_in_one_piece_in_the_order_of_their_first_jobs(specs):
    jobs = make(specs)
    order = chains_together(jobs)
    assert sorted(order) == list(range(len(jobs)))
    chain = {}  # a job's chain: the first job it is linked to, among these
    for job in jobs:
        chain[job.job_id] = chain.get(job.after, job.job_id)
    chains = [chain[jobs[i].job_id] for i in order]
    # One piece each, in the order of their first jobs, each job after its own.
    pieces = [c for n, c in enumerate(chains) if n == 0 or chains[n - 1] != c]
    assert len(pieces) == len(set(chains))
    assert pieces == sorted(pieces, key=lambda c: int(c[1:]))
    assert all(
        a < b
        for a, b in itertools.pairwise(order)
        if chain[jobs[a].job_id] == chain[jobs[b].job_id]
    )


def test_interleaved_chains_are_stored_a_chain_per_call(r, backend):
    """Three jobs, then the three that run after them: a call of three holds one
    chain whole, and each job's enqueue time is returned in its own place."""
    heads = [NewJob(f"h{n}", "default", 0, "{}") for n in range(3)]
    tails = [NewJob(f"t{n}", "default", 0, "{}", 0, f"h{n}") for n in range(3)]
    broker, sent = backend.broker, []
    run_many = broker._run_many

    def record(calls):
        sent.extend([args[6::7] for _, args in calls])
        return run_many(calls)

    with (
        mock.patch.object(wire, "ENQUEUE_BATCH_JOBS", 2),
        mock.patch.object(broker, "_run_many", record),
    ):
        enqueued = broker.enqueue_linked([*heads, *tails])
    assert sent == [["h0", "t0"], ["h1", "t1"], ["h2", "t2"]]
    assert all(at is not None for at in enqueued)
    assert r.zrange(broker.keys.queue("default"), 0, -1) == ["h0", "h1", "h2"]


def test_a_chain_cut_over_calls_names_the_origin_of_its_failure(r, backend):
    """A chain longer than a call, after a job that failed: the job past the cut, whose
    call finds the one it runs after FAILED already, names the same origin as the jobs
    before the cut do."""
    broker = backend.broker
    broker.enqueue([NewJob("origin", "default", 0, "{}")])
    claimed = broker.claim(["default"], "w")[1]
    assert claimed is not None
    broker.finish(Outcome("origin", claimed.owner, FAILED, error=to_json({"x": 1})))
    chain = [NewJob("c0", "default", 0, "{}", 0, "origin")]
    chain += [NewJob(f"c{n}", "default", 0, "{}", 0, f"c{n - 1}") for n in range(1, 4)]
    with mock.patch.object(wire, "ENQUEUE_BATCH_JOBS", 2):
        broker.enqueue_linked(chain)  # c0 and c1 in one call, c2 and c3 in the next
    for n in range(4):
        errors = json.loads(r.hget(broker.keys.job(f"c{n}"), "errors"))
        why = errors[-1]["traceback"]
        parent = "origin" if n == 0 else f"c{n - 1}"
        assert f"job {parent}, which this job runs after, ended FAILED" in why, why
        assert ("without running: job origin failed" in why) == (n > 0), why
