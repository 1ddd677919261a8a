"""Kill chaos with ``runworker --threads 8``: processes that run eight jobs at once,
SIGKILLed mid-jobs and started again, lose none, and run a job again only when its
worker died running it (bench/chaos.py --threads gives the figures at 1,000 jobs)."""

import pytest
import redis

from django_redisqueue.compat import TaskResultStatus, task_backends
from tests.conftest import private_redis, wait_until
from tests.support import slot_tasks

LEASED = ("--backend", "leased")  # 1 s leases, MAX_RECOVERIES 2: two kills are safe
THREADS = ("--threads", "8")


@pytest.fixture
def rr():
    with private_redis() as server:
        yield redis.Redis.from_url(server.url, decode_responses=True)


def runs(rr) -> list[tuple[str, int, int, int]]:
    """The ledger: (start or end, job number, worker pid, attempt), in order."""
    entries = (entry.split() for entry in rr.lrange(slot_tasks.SLOT_RUNS, 0, -1))
    return [(what, int(number), int(pid), int(a)) for what, number, pid, a in entries]


def in_flight(rr, pid: int) -> set[tuple[int, int]]:
    """The runs (number, attempt) the worker ``pid`` started and has not ended."""
    started = {(n, a) for what, n, p, a in runs(rr) if p == pid and what == "start"}
    return started - {(n, a) for what, n, p, a in runs(rr) if p == pid and what == "end"}


def ended(rr) -> int:
    return sum(what == "end" for what, *_ in runs(rr))


def test_kill_chaos_with_eight_threads_loses_nothing_and_runs_nothing_twice(rr, procs, report):
    """Each kill lands while the jobs that start hold their slots (SLOT_HOLD), so that
    the victim surely dies mid-jobs however slowly this test reads the ledger; between
    the kills the jobs flow."""
    leased = slot_tasks.slot_run.using(backend="leased")
    ids: list[str] = []

    def enqueue(numbers):
        rr.set(slot_tasks.SLOT_HOLD, 1)
        ids.extend(result.id for result in leased.enqueue_many([((i, 50), {}) for i in numbers]))

    enqueue(range(80))
    procs.start("runscheduler", *LEASED)
    workers = [procs.start("runworker", *THREADS, *LEASED) for _ in range(2)]
    killed, interrupted = set(), set()
    for turn in range(2):
        victim = workers[turn]
        wait_until(lambda v=victim: in_flight(rr, v.pid), 60, "a job in the victim's hands")
        procs.kill(victim)
        killed.add(victim.pid)
        interrupted |= in_flight(rr, victim.pid)  # what it died running
        workers[turn] = procs.start("runworker", *THREADS, *LEASED)
        rr.delete(slot_tasks.SLOT_HOLD)
        if turn == 0:
            wait_until(lambda: ended(rr) >= 40, 120, "40 jobs to end")
            enqueue(range(80, 160))  # held: some for the next victim
    jobs = len(ids)

    backend = task_backends["leased"]
    wait_until(
        lambda: all(backend.get_result(i).status == TaskResultStatus.SUCCESSFUL for i in ids),
        120,
        "every job to succeed",
    )
    by_job: dict[int, list[tuple[int, int]]] = {}
    for what, number, pid, attempt in runs(rr):
        if what == "start":
            by_job.setdefault(number, []).append((pid, attempt))
    twice_while_alive = {
        number: started
        for number, started in by_job.items()
        if any(pid not in killed for pid, _ in started[:-1])  # an earlier run's worker lived
    }
    reused_attempts = {n: s for n, s in by_job.items() if len({a for _, a in s}) < len(s)}
    rerun = sum(len(started) > 1 for started in by_job.values())
    report(
        f"kill chaos, 2 x runworker --threads 8: jobs={jobs} kills={len(killed)} "
        f"killed mid-job={len(interrupted)} run again={rerun} lost={jobs - len(by_job)} "
        f"twice while their worker lived={len(twice_while_alive)}"
    )
    assert sorted(by_job) == list(range(jobs))  # none lost
    assert twice_while_alive == {}
    assert reused_attempts == {}  # each run an attempt of its own
    assert interrupted  # the kills did land mid-job...
    assert all(len(by_job[n]) > 1 for n, _ in interrupted)  # ...and those jobs ran again
