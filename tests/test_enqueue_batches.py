"""How an enqueue is cut into script calls (``wire.enqueue_batches``): each call is
atomic, so a linked batch is cut only where no job is parted from the one it runs
after, unless a chain is longer than a call; the jobs stay in order, none lost."""

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.store import wire
from django_redisqueue.store.wire import NewJob, enqueue_batches

pytestmark = pytest.mark.pure

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


def test_a_chain_is_kept_in_one_call_and_the_others_fill_around_it():
    jobs = make([(1, 0), (1, 0), (1, 1), (1, 0)])  # x, a, b after a, y
    with mock.patch.object(wire, "ENQUEUE_BATCH_JOBS", 2):
        calls = [ids_of(batch, True) for batch in enqueue_batches(jobs, linked=True)]
        plain = [ids_of(batch, False) for batch in enqueue_batches(jobs)]
    assert calls == [["j0"], ["j1", "j2"], ["j3"]]
    assert plain == [["j0", "j1"], ["j2", "j3"]]  # nothing to keep together


def test_no_jobs_is_one_call_all_the_same():
    assert list(enqueue_batches([], linked=True)) == [[]]
