"""Fair queues: a queue of FAIR_QUEUES serves its jobs' fairness keys in turn, one job
of each key with jobs waiting per round, first in first out within a key, priorities
and the other queues' order kept (docs/howto/tasks.md, "Share a queue fairly")."""

from __future__ import annotations

import dataclasses
import os
import random
import signal

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.test import override_settings

from django_redisqueue.compat import InvalidTask, task_backends
from django_redisqueue.core.conf import validate
from django_redisqueue.core.jobs import SUCCESSFUL
from django_redisqueue.store.wire import Outcome
from tests.conftest import private_redis, run_worker_here, wait_until
from tests.support import tasks

WORKER = "fair-test-worker"


@pytest.fixture
def fair():
    return task_backends["fair"]


def on_imports(key: str | None, priority: int = 0):
    """``tasks.record`` as a job of the fair backend's fair queue, of ``key``'s turn."""
    return tasks.record.using(
        backend="fair", queue_name="imports", fair_key=key, priority=priority
    )


def enqueue(key: str | None, *labels: str, priority: int = 0) -> list[str]:
    """Enqueue one job per label under ``key``, in one call; return their ids."""
    results = on_imports(key, priority).enqueue_many([((label,), {}) for label in labels])
    return [result.id for result in results]


def done(claimed) -> Outcome:
    return Outcome(claimed.job_id, claimed.owner, SUCCESSFUL, result="null")


def claims(backend, count: int, queues=("high", "imports", "default")) -> list[str]:
    """The ids of the next ``count`` jobs claims take (each finishing the one before)."""
    taken, finished = [], None
    for _ in range(count):
        _, claimed = backend.broker.claim(list(queues), WORKER, finished)
        if claimed is None:
            break
        taken.append(claimed.job_id)
        finished = done(claimed)
    if finished is not None:
        backend.broker.claim([], WORKER, finished)
    return taken


def test_keys_take_turns_first_in_first_out_within_each(fair):
    a = enqueue("a", "a1", "a2", "a3")
    b = enqueue("b", "b1", "b2")
    c = enqueue("c", "c1")
    assert claims(fair, 7) == [a[0], b[0], c[0], a[1], b[1], a[2]]


def test_one_key_with_ten_thousand_jobs_does_not_hold_back_fifty_with_one_each(fair):
    """The issue's promise: each of 50 keys with one job starts within ~100 claims of
    a key with 10,000 jobs enqueued before them."""
    big = enqueue("big", *[f"big{n}" for n in range(10_000)])
    small = [enqueue(f"customer-{n}", f"small{n}")[0] for n in range(50)]
    first = claims(fair, 100)
    assert set(small) <= set(first)
    assert max(first.index(job) for job in small) <= 51
    # The big key kept its order, and every one of its turns came round.
    taken_big = [job for job in first if job in set(big)]
    assert taken_big == big[: len(taken_big)] and len(taken_big) == 50


def test_a_key_that_arrives_late_waits_at_most_one_round(fair):
    a = enqueue("a", *[f"a{n}" for n in range(20)])
    b = enqueue("b", *[f"b{n}" for n in range(20)])
    assert claims(fair, 4) == [a[0], b[0], a[1], b[1]]
    c = enqueue("c", "c0")
    # a and b each have their turn of this round at most, then c.
    assert claims(fair, 3) == [a[2], b[2], c[0]]


def test_priority_comes_before_turns_and_other_queues_keep_their_order(fair):
    low = enqueue("a", "a1", "a2")
    urgent = enqueue("b", "b1", priority=10)
    high = tasks.record.using(backend="fair", queue_name="high").enqueue("h").id
    plain = tasks.record.using(backend="fair").enqueue("d").id
    assert claims(fair, 5) == [high, urgent[0], low[0], low[1], plain]


def test_jobs_that_name_no_key_share_one_turn(fair):
    anonymous = enqueue(None, "n1", "n2")
    a = enqueue("a", "a1")
    assert claims(fair, 3) == [anonymous[0], a[0], anonymous[1]]


def test_a_queue_that_is_not_fair_keeps_no_turns(fair, r):
    tasks.record.using(backend="fair").enqueue("d")
    assert r.keys("*fair:*") == []
    assert all("fair" not in r.hgetall(key) for key in r.keys("*:job:*"))


def test_a_cancelled_job_gives_its_turn_to_its_keys_next_job(fair):
    a = enqueue("a", "a1", "a2", "a3")
    b = enqueue("b", "b1")
    fair.cancel(a[0])
    assert claims(fair, 4) == [a[1], b[0], a[2]]


def test_a_job_given_back_takes_its_turn_again(fair):
    a = enqueue("a", "a1", "a2")
    b = enqueue("b", "b1")
    _, claimed = fair.broker.claim(["imports"], WORKER)
    assert claimed.job_id == a[0]
    assert fair.broker.abandon(WORKER) == [a[0]]
    assert claims(fair, 4) == [a[0], b[0], a[1]]


def test_a_job_put_there_before_the_queue_was_fair_is_served_in_its_order(fair):
    """A deploy that makes a queue fair: jobs older processes enqueued carry no key,
    and are served at their place in the queue."""
    old = fair.prepare_valid(on_imports(None), ("o1",), {})
    object.__setattr__(old, "_options", "")  # as a process without FAIR_QUEUES sends it
    fair.push([old])
    a = enqueue("a", "a1", "a2")
    b = enqueue("b", "b1")
    assert claims(fair, 4) == [old.id, a[0], b[0], a[1]]


def _tasks():
    from django.conf import settings

    return settings.TASKS


def test_a_worker_runs_a_fair_queue_in_turns(fair, r):
    enqueue("a", "a1", "a2", "a3")
    enqueue("b", "b1")
    run_worker_here(fair, queues=["imports"])
    assert r.lrange(tasks.LOG, 0, -1) == ["a1", "b1", "a2", "a3"]


def test_a_fair_key_for_a_queue_that_is_not_fair_is_refused():
    with pytest.raises(InvalidTask, match="FAIR_QUEUES"):
        tasks.record.using(backend="fair", queue_name="default", fair_key="acme")
    with pytest.raises(ValueError, match="fair_key"):
        on_imports("x" * 201)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("fair_queues", "wrong"),
    [("imports", "a list"), (["nope"], "'nope'"), ([1], "[1]"), (["imports"], None)],
)
def test_fair_queues_must_name_queues_of_queues(fair_queues, wrong):
    problems = validate(
        "x", {"QUEUES": ["imports", "default"], "OPTIONS": {"FAIR_QUEUES": fair_queues}}
    )
    if wrong is None:
        assert problems == []
    else:
        assert [p.code for p in problems] == ["E006"] and wrong in str(problems[0])


@pytest.mark.django_db  # from Django 6.1 the checks ask the databases named
def test_the_system_check_reports_fair_queues_that_are_not_queues():
    broken = {**_tasks()["fair"], "OPTIONS": {"FAIR_QUEUES": ["elsewhere"]}}
    with (
        override_settings(TASKS={**_tasks(), "fair": broken}),
        pytest.raises(SystemCheckError, match="FAIR_QUEUES"),
    ):
        call_command("check", databases=["default"])


def test_kill_chaos_loses_nothing_and_keeps_the_turns(procs, report):
    """Workers of a fair queue killed while one key's backlog runs and new keys keep
    arriving: no job lost, and each newcomer starts within a few jobs of its arrival
    (one turn of each key waiting, the jobs in hand, and jobs recovered from the killed
    workers, which take their turn again), not behind the backlog."""
    leased = ("--backend", "fair-leased")
    with private_redis() as server:
        rr = redis.Redis.from_url(server.url, decode_responses=True)
        backlog = tasks.ledger.using(backend="fair-leased", fair_key="big")
        ids = [r.id for r in backlog.enqueue_many([((n, 15), {}) for n in range(900)])]
        procs.start("runscheduler", *leased)
        workers = [procs.start("runworker", *leased) for _ in range(3)]
        rng = random.Random(11)
        arrivals: dict[str, int] = {}  # a newcomer's label: jobs run before it arrived
        kills = 0
        for wave in range(8):
            target = rr.llen("test:ledger") + 60
            wait_until(lambda t=target: rr.llen("test:ledger") >= t, 120, f"{target} jobs run")
            victim = rng.randrange(len(workers))
            procs.kill(workers[victim])
            kills += 1
            workers[victim] = procs.start("runworker", *leased)
            for n in range(5):
                label = f"new-{wave}-{n}"
                newcomer = tasks.ledger.using(backend="fair-leased", fair_key=label)
                arrivals[label] = rr.llen("test:ledger")
                ids.append(newcomer.enqueue(label, 15).id)
        backend = task_backends["fair-leased"]
        wait_until(
            lambda: all(backend.get_result(i).status == "SUCCESSFUL" for i in ids),
            180,
            "every job to finish",
        )
        ran = rr.lrange("test:ledger", 0, -1)
        recovered = sum(backend.get_result(i).attempts > 1 for i in ids)
    lost = len(ids) - len(set(ran))
    waits = [ran.index(label) - before for label, before in arrivals.items()]
    report(
        f"fair kill chaos: jobs={len(ids)} kills={kills} recovered={recovered} lost={lost} "
        f"duplicates={len(ran) - len(set(ran))} newcomers' waits in jobs run: "
        f"max {max(waits)}, of a backlog of up to 900"
    )
    assert lost == 0
    # Five newcomers and the backlog take turns (6 jobs), 3 run in hand, and a
    # killed worker's job comes back ahead of its key's turn; the backlog left is
    # hundreds of jobs.
    assert max(waits) <= 20, waits


def test_a_fair_job_whose_worker_froze_runs_again_and_its_key_keeps_its_turns(procs, report):
    """A worker frozen (SIGSTOP) while it runs a fair job, past the lease: the job comes
    back at its place in its key's turn and runs elsewhere; the thawed worker's late
    outcome is refused; no job is lost and no turn is left behind."""
    leased = ("--backend", "fair-leased")
    with private_redis() as server:
        rr = redis.Redis.from_url(server.url, decode_responses=True)
        backend = task_backends["fair-leased"]
        slow = tasks.ledger.using(backend="fair-leased", fair_key="a").enqueue("a1", 2000)
        frozen = procs.start("runworker", *leased)
        wait_until(lambda: backend.get_result(slow.id).status == "RUNNING", 30, "a1 to start")
        os.killpg(frozen.pid, signal.SIGSTOP)
        others = [
            tasks.ledger.using(backend="fair-leased", fair_key=key).enqueue(label, 0)
            for key, label in [("a", "a2"), ("b", "b1"), ("b", "b2")]
        ]
        procs.start("runscheduler", *leased)
        procs.start("runworker", *leased)
        jobs = [slow, *others]
        wait_until(
            lambda: all(backend.get_result(j.id).status == "SUCCESSFUL" for j in jobs),
            60,
            "every job to run",
        )
        os.killpg(frozen.pid, signal.SIGCONT)
        # Its late outcome refused, or its attempt stopped first by its heartbeat.
        procs.expect(frozen, "lease", 30)
        ran = rr.lrange("test:ledger", 0, -1)
        turns = rr.keys(backend.keys.fair("default") + "*")
        stored = backend.get_result(slow.id)
    report(f"fair job of a frozen worker: attempts={stored.attempts} ledger={ran}")
    # a1 ran again; the frozen attempt may have written its entry too, late.
    assert sorted(set(ran)) == ["a1", "a2", "b1", "b2"] and len(ran) in (4, 5)
    assert stored.attempts == 2 and not turns


@pytest.mark.django_db(transaction=True)
def test_jobs_relayed_from_the_outbox_keep_their_turns(settings, r):
    """A fair queue with an outbox: the jobs a transaction wrote reach Redis with their
    keys, and take turns."""
    base = settings.TASKS["fair"]
    settings.TASKS = {
        **settings.TASKS,
        "fair": {**base, "OPTIONS": {**base["OPTIONS"], "OUTBOX": "default"}},
    }
    fair = task_backends["fair"]
    with transaction.atomic():
        a = enqueue("a", "a1", "a2")
        b = enqueue("b", "b1")
        assert r.zcard(fair.keys.queue("imports")) == 0  # in the outbox until the commit
    assert fair.outbox.relay_left(settle=0) == 0
    assert claims(fair, 3) == [a[0], b[0], a[1]]


def test_a_unique_job_of_a_key_is_refused_while_its_holder_waits_its_turn(fair):
    a = enqueue("a", "a1", "a2")
    first = tasks.record.using(
        backend="fair", queue_name="imports", fair_key="b", unique_key="once"
    ).enqueue("b1")
    again = tasks.record.using(
        backend="fair", queue_name="imports", fair_key="c", unique_key="once"
    ).enqueue("c1")
    assert again.id == first.id
    assert claims(fair, 4) == [a[0], first.id, a[1]]


# Where fair queues meet give-backs, limits, cancels, operators and older processes.


def test_jobs_of_one_key_given_back_together_keep_their_order(fair):
    a = enqueue("a", "a1", "a2", "a3")
    _, first = fair.broker.claim(["imports"], WORKER)
    _, second = fair.broker.claim(["imports"], WORKER)
    assert [first.job_id, second.job_id] == a[:2]
    assert sorted(fair.broker.abandon(WORKER)) == sorted(a[:2])
    assert claims(fair, 3) == a


def test_parked_jobs_of_one_key_go_back_in_their_order(fair):
    two = dataclasses.replace(tasks.record, concurrency_limit=2, limit_key="two")
    a = [
        result.id
        for result in two.using(backend="fair", queue_name="imports", fair_key="a").enqueue_many(
            [((f"a{n}",), {}) for n in range(5)]
        )
    ]
    _, one = fair.broker.claim(["imports"], "w1")
    _, other = fair.broker.claim(["imports"], "w2")
    assert [one.job_id, other.job_id] == a[:2]
    assert fair.broker.claim(["imports"], "w3")[1] is None  # a2..a4 parked
    for held in (one, other):  # each end unparks: a2, a3 back at their places
        fair.broker.claim([], held.owner.split("/")[0], done(held))
    assert claims(fair, 3) == a[2:]


def test_a_key_whose_job_was_cancelled_joins_behind_the_keys_waiting(fair):
    gone = enqueue("a", "a0")
    fair.cancel(gone[0])
    b = enqueue("b", "b1", "b2")
    c = enqueue("c", "c1")
    a = enqueue("a", "a1")
    assert claims(fair, 4) == [b[0], c[0], a[0], b[1]]


def test_an_emptied_backlog_does_not_hold_back_a_newcomer(fair, r):
    gone = enqueue("gone", *[f"g{n}" for n in range(2000)])
    assert fair.broker.operate("empty", "imports", limit=5000) == len(gone)
    assert r.exists(fair.keys.fair_turn("imports", "0:gone")) == 0
    b = enqueue("b", *[f"b{n}" for n in range(100)])
    c = enqueue("c", "c1")
    assert claims(fair, 2) == [b[0], c[0]]


def test_a_fair_job_that_lost_its_entry_is_not_starved(fair, r):
    """As one put back by a process older than fair queues (a scheduler's promotion, a
    give-back): its entry is made again when it comes first in the queue."""
    late = enqueue("late", "late")[0]
    r.delete(fair.keys.fair_turn("imports", "0:late"))
    r.zrem(fair.keys.fair("imports"), "0:late")
    b = enqueue("b", *[f"b{n}" for n in range(30)])
    c = enqueue("c", *[f"c{n}" for n in range(30)])
    assert claims(fair, 3) == [late, b[0], c[0]]


def test_a_claim_looks_through_a_bounded_number_of_stale_entries(fair, r):
    """Entries whose jobs older processes claimed by their place: one claim drops at
    most a hundred, parking or not, then takes the queue's first job."""
    one = dataclasses.replace(tasks.record, concurrency_limit=1, limit_key="one")
    limited = one.using(backend="fair", queue_name="imports", fair_key="l")
    limited.enqueue("l0")
    fair.broker.claim(["imports"], "holder")  # holds the one slot
    enqueue("gone", *[f"g{n}" for n in range(1000)])
    r.zpopmin(fair.keys.queue("imports"), 1000)  # claimed by processes older than fairness
    limited.enqueue_many([((f"l{n}",), {}) for n in range(1, 151)])
    stale = fair.keys.fair_turn("imports", "0:gone")
    assert r.zcard(stale) == 1000
    fair.broker.claim(["imports"], "w")
    assert r.zcard(stale) >= 900


def test_an_entry_left_ahead_of_its_turns_first_job_is_dropped_at_its_go(fair, r):
    a = enqueue("a", "a1", "a2")
    entries = fair.keys.fair_turn("imports", "0:a")
    r.zadd(entries, {"0" * 26: 1})  # its job claimed by its place by an older process
    assert claims(fair, 1) == [a[0]]
    assert r.zrange(entries, 0, -1) == [a[1]]


def test_a_job_whose_entry_holds_another_score_still_runs_first_of_its_key(fair, r):
    a = enqueue("a", "a1", "a2")
    r.zadd(fair.keys.fair_turn("imports", "0:a"), {a[0]: 5})  # spoilt by hand
    assert claims(fair, 2) == a
    assert r.exists(fair.keys.fair("imports")) == 0


@pytest.mark.parametrize(
    "key", ["a:b", "with space", "new\nline", "😀 ünï", "x" * 200, "{tag}", "0:1", "-5:x"]
)
def test_any_text_is_a_fairness_key(fair, key):
    mine = enqueue(key, "k1", "k2")
    other = enqueue("other", "o1")
    assert claims(fair, 3) == [mine[0], other[0], mine[1]]
    enqueue(key, "k3")
    _, turns = fair.queries.fair_turns("imports", 10)
    assert [turn.key for turn in turns] == [key]


def test_turns_spoilt_by_hand_fail_no_script_and_lose_no_job(fair, r):
    a = enqueue("a", "a1", "a2")
    turns, entries = fair.keys.fair("imports"), fair.keys.fair_turn("imports", "0:a")
    r.zadd(entries, {"abc def": 1, "nosuchjob": 2, "9" * 300: 3, "": 4})
    r.zadd(turns, {"garbage": -1e300, "999999999999:z": -5, "-:q": 0, "0:str": -2})
    r.set(fair.keys.fair_turn("imports", "0:str"), "a string")
    r.zadd(fair.keys.fair_turn("imports", "garbage"), {"nosuchjob": 1})
    r.hset(fair.keys.job(a[0]), "score", "-1e300")
    b = enqueue("b", "b1")
    fair.broker.claim(["imports"], "w")
    fair.broker.abandon("w")  # back at its spoilt score
    assert sorted(claims(fair, 10)) == sorted(a + b)
    r.set(turns, "oops")
    c = enqueue("c", "c1", "c2")
    assert claims(fair, 3) == c
