"""Database connections of a worker that runs 32 jobs at once on PostgreSQL: each slot's
thread has its own connection, closed or kept as Django's request cycle would
(CONN_MAX_AGE), none used by two threads, none left open once the slots end."""

import json
import threading
from unittest.mock import patch

import pytest
from django.db import connections

from django_redisqueue.runtime.slots import SlotWorker
from tests.conftest import wait_until
from tests.support import slot_tasks

THREADS = 32
# Beside the 32 slots' connections: this test's own.
A_FEW = 1

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "postgresql"])


def open_connections() -> int:
    """The connections to the test database, this test's own among them."""
    with connections["postgresql"].cursor() as cursor:
        cursor.execute(slot_tasks.COUNT_OPEN)
        return cursor.fetchone()[1]


def jobs_run(r) -> list[dict]:
    return [json.loads(entry) for entry in r.lrange(slot_tasks.PG_JOBS, 0, -1)]


@pytest.mark.parametrize("max_age", [0, 60])
def test_thirty_two_slots_hold_at_most_thirty_two_connections_never_shared(r, backend, max_age):
    """32 jobs that meet while each holds its connection (all 32 open at once), then 64
    more: no more than 32 + a few open, one thread per server process at a time; with
    CONN_MAX_AGE=60 each thread keeps its connection for its next jobs; once the worker
    has ended, only this test's connection is left."""
    before = open_connections()
    meeting = [slot_tasks.pg_job.enqueue(f"m{i}", THREADS, 30) for i in range(THREADS)]
    after = [slot_tasks.pg_job.enqueue(f"a{i}", 0, 0) for i in range(2 * THREADS)]
    settings = connections["postgresql"].settings_dict
    # The slots' threads make their connections from these settings as they start.
    with patch.dict(settings, CONN_MAX_AGE=max_age):
        worker = SlotWorker(backend, threads=THREADS, burst=True)
        ran = threading.Thread(target=worker.run)
        ran.start()
        ran.join(timeout=120)
    assert not ran.is_alive()
    assert all(job.wait(timeout=5) is None for job in meeting + after)

    runs = jobs_run(r)
    assert len(runs) == 3 * THREADS
    assert max(run["open"] for run in runs) >= THREADS  # the meeting: all 32 at once
    assert max(run["open"] for run in runs) <= THREADS + A_FEW
    assert {run["users"] for run in runs} == {1}  # one thread per connection at a time
    assert all(run["same_pid"] and not run["sharing"] for run in runs)
    assert len({run["thread"] for run in runs}) == THREADS
    fresh = [run for run in runs if run["fresh"]]
    if max_age:  # each thread's connection kept for its next jobs
        assert len(fresh) == THREADS and len({run["pid"] for run in runs}) == THREADS
    else:  # a connection of each job's own, closed after it
        assert len(fresh) == len(runs)
    # The slots' threads have ended: their connections are closed, not left to linger.
    wait_until(lambda: open_connections() <= before, 10, "the slots' connections to close")
