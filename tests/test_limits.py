"""Concurrency and rate limits: at most K of a limit key's jobs RUNNING at once, at most
N starts per period, enforced in the claim; a job over its limit is parked and the
jobs behind it run. Fake workers through the broker for exact steps, then real
``runworker`` processes that try to break the limit under load."""

import dataclasses
import itertools
import time

import pytest

from django_redisqueue import task
from django_redisqueue.core.fanout import group
from django_redisqueue.core.tasks import parse_rate_limit
from django_redisqueue.store.wire import Outcome
from tests.conftest import run_worker_here, wait_until
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS

QUEUES = ["high", "default", "low"]
KEY = "tests.support.tasks.limited_two"


@pytest.fixture
def broker(backend):
    return backend.broker


def claim(broker, worker="w1", queues=QUEUES):
    return broker.claim(queues, worker)[1]


def finish(broker, claimed, status="SUCCESSFUL"):
    assert broker.finish(Outcome(claimed.job_id, claimed.owner, status, result="1"))


def label(claimed) -> str:
    return claimed.fields["payload"].split('"args":[')[1].split(",")[0].strip('"')


def parked(r, key=KEY) -> list[str]:
    return r.zrange(DEFAULT_KEYS.limit(key, "parked"), 0, -1)


def test_a_job_over_its_limit_is_parked_and_the_jobs_behind_it_run(r, broker, backend):
    limited = [tasks.limited_two.enqueue(f"L{i}", 0).id for i in range(3)]
    free = tasks.free_job.enqueue("F").id

    first, second = claim(broker, "w1"), claim(broker, "w2")
    assert [first.job_id, second.job_id] == limited[:2]
    third = claim(broker, "w3")
    assert third.job_id == free  # L2 is over the limit: parked, and F behind it runs
    assert parked(r) == [limited[2]]
    assert r.hget(DEFAULT_KEYS.job(limited[2]), "parked") == KEY
    assert backend.get_result(limited[2]).status == "READY"
    assert r.zcard(DEFAULT_KEYS.queue("default")) == 0
    assert claim(broker, "w4") is None  # nothing else: L2 waits, no worker spins on it

    finish(broker, first)  # a slot frees: L2 goes back to its queue, at its place
    assert parked(r) == [] and r.hget(DEFAULT_KEYS.job(limited[2]), "parked") is None
    assert r.zrange(DEFAULT_KEYS.queue("default"), 0, -1) == [limited[2]]
    assert claim(broker, "w1").job_id == limited[2]
    assert r.smembers(DEFAULT_KEYS.limit(KEY, "running")) == {second.job_id, limited[2]}


def test_a_limited_job_at_the_head_of_a_strict_priority_queue_holds_back_nothing(r, broker):
    """docs/protocol.md, "Limits": a parked job leaves its queue, so the jobs behind
    it, in its queue and in the queues after it, run while it waits."""
    busy = [tasks.limited_two.using(queue_name="high").enqueue(f"B{i}", 0) for i in range(2)]
    held = [claim(broker, f"w{i}") for i in range(2)]
    assert [c.job_id for c in held] == [b.id for b in busy]
    head = tasks.limited_two.using(queue_name="high", priority=50).enqueue("head", 0).id
    behind = tasks.free_job.using(queue_name="high").enqueue("behind").id
    lower = tasks.free_job.using(queue_name="low").enqueue("lower").id

    assert claim(broker, "w3").job_id == behind
    assert claim(broker, "w4").job_id == lower
    assert parked(r) == [head]
    finish(broker, held[0], "FAILED")  # any end frees the slot
    assert claim(broker, "w3").job_id == head  # back at the head of its queue


def test_every_way_a_job_leaves_running_frees_its_slot(r, broker, backend):
    """RETRY, RELEASE, a recovered lease, a lease lost for good, and abandon each
    unpark one job: none strands a parked job."""
    ids = [tasks.limited_two.enqueue(f"L{i}", 0).id for i in range(6)]
    a, b = claim(broker, "w1"), claim(broker, "w2")
    assert claim(broker, "w3") is None and len(parked(r)) == 4

    broker.finish(Outcome(a.job_id, a.owner, "RETRY", error="{}", retry_in_ms=3_600_000))
    assert len(parked(r)) == 3  # L2 back on its queue
    c = claim(broker, "w1")
    broker.finish(Outcome(c.job_id, c.owner, "RELEASE"))
    assert len(parked(r)) == 2  # L3 back; L2 given back too
    c = claim(broker, "w1")
    r.zadd(DEFAULT_KEYS.running, {b.job_id: 0, c.job_id: 0})  # both leases pass
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert tick.recovered == 2 and parked(r) == []  # two slots: L4 and L5 unparked
    held = [claim(broker, "w5"), claim(broker, "w5")]
    assert claim(broker, "w6") is None and parked(r) == ids[3:]
    assert sorted(broker.abandon("w5")) == sorted(h.job_id for h in held)
    # Each give-back looks for room, not knowing that the jobs put back before it will
    # start: all go back, and the claims park those over the limit again.
    assert parked(r) == []
    assert [claim(broker, "w7"), claim(broker, "w8"), claim(broker, "w9")][2] is None
    assert parked(r) == ids[3:]
    assert r.scard(DEFAULT_KEYS.limit(KEY, "running")) == 2  # the two just claimed


def test_a_parked_job_can_be_cancelled(r, broker, backend):
    results = [tasks.limited_two.enqueue(f"L{i}", 0) for i in range(3)]
    claim(broker, "w1"), claim(broker, "w2"), claim(broker, "w3")
    results[2].cancel()
    assert results[2].status == "FAILED" and parked(r) == []
    assert r.hget(DEFAULT_KEYS.job(results[2].id), "parked") is None


def test_a_rate_limit_parks_until_its_window_frees_a_start(r, broker, backend):
    ids = [tasks.rate_limited.enqueue(f"R{i}").id for i in range(12)]
    started = [claim(broker, "w1") for _ in range(10)]
    assert [c.job_id for c in started] == ids[:10]
    assert claim(broker, "w1") is None  # 10 starts in this second: the rest park
    key = "tests.support.tasks.rate_limited"
    assert parked(r, key) == ids[10:]
    look = r.zscore(DEFAULT_KEYS.limits, key)
    first_start = int(r.hget(DEFAULT_KEYS.job(ids[0]), "last_attempted_at"))
    assert look == first_start + 1000  # when the first start leaves the window

    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert 0 <= tick.next_in <= 1.0  # the scheduler sleeps until that look
    assert parked(r, key) == ids[10:]  # not due yet: nothing moved

    # Time passes for the first start alone (its score moves back a second).
    starts = DEFAULT_KEYS.limit(key, "starts")
    oldest, second = r.zrange(starts, 0, 1, withscores=True)
    r.zadd(starts, {oldest[0]: oldest[1] - 1000})
    r.zadd(DEFAULT_KEYS.limits, {key: 0})
    broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    # One start left the window: one job back; the next look is when the next leaves.
    assert parked(r, key) == ids[11:] and r.zcard(DEFAULT_KEYS.queue("default")) == 1
    assert r.zscore(DEFAULT_KEYS.limits, key) == second[1] + 1000
    assert claim(broker).job_id == ids[10]


def test_spoilt_limit_keys_never_stop_a_claim(r, broker):
    tasks.limited_two.enqueue("L0", 0)
    tasks.rate_limited.enqueue("R0")
    for part in ("running", "parked"):
        r.set(DEFAULT_KEYS.limit(KEY, part), "garbage")
    r.set(DEFAULT_KEYS.limit("tests.support.tasks.rate_limited", "starts"), "garbage")
    r.set(DEFAULT_KEYS.limits, "garbage")
    assert claim(broker).job_id and claim(broker).job_id
    tasks.limited_two.enqueue("L1", 0)
    tasks.limited_two.enqueue("L2", 0)
    assert claim(broker).job_id and claim(broker) is None  # L2 parked: looked at again
    assert r.type(DEFAULT_KEYS.limits) == "zset" and r.zscore(DEFAULT_KEYS.limits, KEY)
    r.hset(
        DEFAULT_KEYS.job("x1"),
        mapping={
            "status": "READY",
            "queue": "default",
            "limit": "k",
            "max_running": "-3",
            "rate": "9/0",
        },
    )
    r.zadd(DEFAULT_KEYS.queue("default"), {"x1": 1})
    assert claim(broker).job_id == "x1"  # a garbage limit reads as at least one slot


def shared(**limits):
    """tasks.free_job counted under the key "shared" with these limits."""
    return dataclasses.replace(tasks.free_job, limit_key="shared", **limits)


def test_jobs_of_one_key_under_different_limits_never_strand_each_other(r, broker):
    """A job that cannot start (its rate is spent) is looked past: the next parked job
    of the key, which has room by its own limit, goes back when the slot frees."""
    spent = shared(rate_limit="1/h").enqueue("rate")
    finish(broker, claim(broker, "w1"))  # the hour's one start
    holder = shared(concurrency_limit=1).enqueue("slot")
    running = claim(broker, "w2")  # the slot
    assert running.job_id == holder.id
    rated = shared(rate_limit="1/h").enqueue("x")
    waits = shared(concurrency_limit=1).enqueue("w")
    assert claim(broker, "w3") is None
    assert parked(r, "shared") == [rated.id, waits.id]
    finish(broker, running)  # the slot frees: W has room, X has none till the hour
    assert parked(r, "shared") == [rated.id]
    assert claim(broker, "w3").job_id == waits.id
    # X is looked at again, at the latest when its start frees (sooner: W's lease look).
    look = r.zscore(DEFAULT_KEYS.limits, "shared")
    assert look <= int(r.hget(DEFAULT_KEYS.job(spent.id), "last_attempted_at")) + 3_600_000

    # Two maximums on one key (a deploy changed it): each job by its own.
    more = [shared(concurrency_limit=1).enqueue("k1"), shared(concurrency_limit=3).enqueue("k3")]
    assert claim(broker, "w4").job_id == more[1].id  # 1 running: K=1 parks, K=3 starts


def age_starts(r, key: str, ms: int) -> None:
    """Time passes for every start of ``key``: each moves ``ms`` into the past."""
    starts = DEFAULT_KEYS.limit(key, "starts")
    r.zadd(starts, {m: score - ms for m, score in r.zrange(starts, 0, -1, withscores=True)})


def test_rates_of_different_periods_on_one_key_each_hold(r, broker):
    """A 5/s job's start keeps the 3/4s jobs' history: they are held to 3 in 4 s."""
    slow = [shared(rate_limit="3/4s").enqueue(f"slow{i}") for i in range(4)]
    assert [claim(broker).job_id for _ in range(3)] == [job.id for job in slow[:3]]
    assert claim(broker) is None  # the fourth: 3 starts in 4 s
    age_starts(r, "shared", 2000)  # 2 s later: out of a 1 s period, inside a 4 s one
    fast = shared(rate_limit="5/s").enqueue("fast")
    assert claim(broker).job_id == fast.id  # no start in its last second
    again = shared(rate_limit="3/4s").enqueue("slow again")
    assert claim(broker) is None  # 4 starts in 4 s: both 3/4s jobs stay parked
    assert parked(r, "shared") == [slow[3].id, again.id]
    age_starts(r, "shared", 2001)  # the three slow starts leave the 4 s window
    r.zadd(DEFAULT_KEYS.limits, {"shared": 0})
    broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert claim(broker).job_id == slow[3].id  # the fast start is one of 3 in 4 s


@pytest.mark.parametrize("first", ["rate only", "concurrency only"])
def test_every_job_of_a_key_counts_against_every_limit_of_it(r, broker, first):
    """A rate-only job holds a slot of the concurrency-limited jobs of its key, and a
    concurrency-only job's start counts against the rated ones'."""
    one_at_a_time = shared(concurrency_limit=1)
    once_an_hour = shared(rate_limit="1/h")
    jobs = [once_an_hour, one_at_a_time] if first == "rate only" else [one_at_a_time, once_an_hour]
    started = jobs[0].enqueue("first")
    waiting = jobs[1].enqueue("second")
    assert claim(broker).job_id == started.id
    assert claim(broker) is None  # by its own limit it would start; by the key's, not
    assert parked(r, "shared") == [waiting.id]


def test_limits_changed_under_running_parked_and_recovered_jobs(r, broker):
    """A deploy lowers the key's concurrency from 3 to 1 and adds a rate: the old jobs
    running, parked or recovered still count against the new ones, and each job is
    held to its own limits."""
    old = [shared(concurrency_limit=3).enqueue(f"old{i}") for i in range(4)]
    running = [claim(broker, f"w{i}") for i in range(3)]
    assert claim(broker, "w4") is None and parked(r, "shared") == [old[3].id]
    new = shared(concurrency_limit=1, rate_limit="2/h").enqueue("new")
    assert claim(broker, "w4") is None  # 3 running, its limit is 1
    r.zadd(DEFAULT_KEYS.running, {running[0].job_id: 0})  # a worker is lost
    broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert claim(broker, "w5").job_id == old[0].id  # recovered; 2 running + it: 3
    finish(broker, running[1])
    finish(broker, running[2])
    # old[3] (3 allowed) went back when a slot freed; "new" (1 allowed) never: 2 run.
    assert claim(broker, "w6").job_id == old[3].id
    assert claim(broker, "w7") is None and parked(r, "shared") == [new.id]
    for job_id in r.zrange(DEFAULT_KEYS.running, 0, -1):
        owner = r.hget(DEFAULT_KEYS.job(job_id), "owner")
        assert broker.finish(Outcome(job_id, owner, "SUCCESSFUL", result="1"))
    # No job runs, but the key's two starts since the rated job came (old0's second,
    # old3's) spend its rate of 2 an hour: it stays parked.
    assert claim(broker, "w8") is None and parked(r, "shared") == [new.id]


def test_a_parked_job_with_room_behind_more_than_a_finish_looks_at_waits_no_lease(r, broker):
    """A finish looks at the first 20 parked jobs of its key; a job behind them that has
    room is looked at by the scheduler's next step, not a lease later."""
    holder = shared(concurrency_limit=2).enqueue("long")
    assert claim(broker, "w1").job_id == holder.id
    ones = [shared(concurrency_limit=1).enqueue(f"one{i}") for i in range(25)]
    twos = [shared(concurrency_limit=2).enqueue(f"two{i}") for i in range(2)]
    first = claim(broker, "w2")  # the 25 parked, the first "two" runs beside the holder
    assert first.job_id == twos[0].id
    assert claim(broker, "w3") is None and parked(r, "shared")[-1] == twos[1].id
    finish(broker, first)  # looks at the first 20: no room for them
    look = r.zscore(DEFAULT_KEYS.limits, "shared")
    assert look <= broker.clock_ms()  # the rest at once
    broker.tick("s1", QUEUES, batch=500, lost_limit=2, lost_error="{}")
    assert claim(broker, "w3").job_id == twos[1].id
    assert len(parked(r, "shared")) == len(ones)


def test_a_parked_job_of_a_paused_queue_takes_no_room(r, broker, backend):
    held = [tasks.limited_two.enqueue(f"H{i}", 0) for i in range(2)]
    running = [claim(broker, f"w{i}") for i in range(2)]
    paused = tasks.limited_two.using(queue_name="low").enqueue("paused", 0)
    other = tasks.limited_two.enqueue("other", 0)
    assert claim(broker, "w3") is None and parked(r) == [paused.id, other.id]
    broker.operate("pause", "low")
    finish(broker, running[0])
    # The paused queue's job went back too, but cannot start: the slot is the other's.
    assert parked(r) == [] and claim(broker, "w3").job_id == other.id
    assert [h.id for h in held] == [c.job_id for c in running]


def test_garbage_in_a_limit_never_reads_as_a_looser_or_stuck_limit(r, broker):
    for i, (running, rate) in enumerate([("1.5", None), (None, "0/1000"), ("x", "y/z")]):
        fields = {"status": "READY", "queue": "default", "limit": f"g{i}", "priority": 0}
        fields |= {"max_running": running} if running else {}
        fields |= {"rate": rate} if rate else {}
        for j in range(2):
            r.hset(DEFAULT_KEYS.job(f"g{i}-{j}"), mapping=fields)
            r.zadd(DEFAULT_KEYS.queue("default"), {f"g{i}-{j}": i * 10 + j})
    claimed = [c.job_id for c in iter(lambda: claim(broker), None)]
    # "1.5" is one slot; a rate of 0 starts or garbage is no rate limit.
    assert claimed == ["g0-0", "g1-0", "g1-1", "g2-0", "g2-1"]
    assert parked(r, "g0") == ["g0-1"]
    # A look at a key that names nothing, and parked jobs under an empty key: skipped.
    r.zadd(DEFAULT_KEYS.limits, {"": 0, "gone": 0})
    r.zadd(DEFAULT_KEYS.limit("", "parked"), {"no-such-job": 1})
    tick = broker.tick("s1", QUEUES, batch=10, lost_limit=2, lost_error="{}")
    assert tick.next_in is not None and r.zcard(DEFAULT_KEYS.limit("", "parked")) == 0


def test_a_groups_members_share_their_limit(r, backend):
    result = group([tasks.limited_two.job(f"G{i}", 0.02) for i in range(6)]).enqueue()
    run_worker_here(backend)
    assert result.wait(timeout=10) == [f"G{i}" for i in range(6)]
    assert int(r.get(tasks.LIMITED_MOST)) <= 2


@pytest.mark.parametrize(
    ("rate", "parsed"),
    [
        ("100/m", (100, 60_000)),
        ("10/s", (10, 1000)),
        ("5/10s", (5, 10_000)),
        ("1/d", (1, 86_400_000)),
    ],
)
def test_rate_limits_read_as_people_write_them(rate, parsed):
    assert parse_rate_limit(rate) == parsed


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "0/m"},
        {"rate_limit": "10/0s"},
        {"rate_limit": "10 per minute"},
        {"rate_limit": "5/000s"},
        {"rate_limit": "1/10000000d"},
        {"rate_limit": "1000001/s"},
        {"limit_key": "k\ud800", "concurrency_limit": 1},
        {"rate_limit": 10},
        {"concurrency_limit": 0},
        {"concurrency_limit": True},
        {"concurrency_limit": 1.5},
        {"limit_key": "k"},  # a key without a limit
        {"limit_key": "", "concurrency_limit": 1},
        {"limit_key": "k" * 201, "concurrency_limit": 1},
    ],
    # ascii: a lone surrogate in a test id cannot cross to pytest-xdist's controller.
    ids=ascii,
)
def test_a_wrong_limit_is_refused_where_it_is_written(options):
    with pytest.raises(ValueError):
        task(**options)(tasks.free_job.func)


def test_a_limit_key_given_per_call_limits_each_key_apart(r, broker):
    for customer in ("a", "b"):
        for i in range(2):
            tasks.limited_two.using(limit_key=f"customer:{customer}").enqueue(i, 0)
    # Two keys, two slots each: all four start.
    assert all(claim(broker, f"w{i}") for i in range(4))
    assert r.scard(DEFAULT_KEYS.limit("customer:a", "running")) == 2


# Real workers


def starts(r, results) -> list[int]:
    """Each job's last start (ms, Redis's clock)."""
    pipe = r.pipeline(transaction=False)
    for result in results:
        pipe.hget(DEFAULT_KEYS.job(result.id), "last_attempted_at")
    return [int(start) for start in pipe.execute()]


def first_start(r, results) -> int:
    return min(starts(r, results))


def last_start(r, results) -> int:
    return max(starts(r, results))


def drain_span(r, results) -> float:
    """Seconds from the first start to the last finish of ``results``, by Redis's clock."""
    pipe = r.pipeline(transaction=False)
    for result in results:
        pipe.hmget(DEFAULT_KEYS.job(result.id), "started_at", "finished_at")
    stamps = pipe.execute()
    return (max(int(f) for _, f in stamps) - min(int(s) for s, _ in stamps)) / 1000


def test_four_workers_of_four_processes_never_run_more_than_the_limit(r, procs, report):
    """4 x ``runworker --concurrency 4``: 400 free jobs alone, then 40 jobs limited to 2
    at once (50 ms each) queued ahead of 400 more free jobs. The limited jobs' own count
    of themselves, and a sampler of the RUNNING set, never see more than 2; the free
    jobs do not wait for them: they start while limited jobs still wait, by Redis's
    clock (their drain span is reported beside the first run's)."""
    workers = [procs.start("runworker", "--concurrency", "4") for _ in range(4)]
    wait_until(lambda: r.zcard(DEFAULT_KEYS.workers) == 16, timeout=60, message="16 workers")
    alone = [tasks.free_job.enqueue(f"A{i}") for i in range(400)]
    wait_until(lambda: r.llen(tasks.FREE_DONE) == len(alone), timeout=60, message="free jobs")

    # In one round trip each, so that sampling starts before the limited jobs drain.
    limited = tasks.limited_two.enqueue_many([((f"L{i}", 0.05), {}) for i in range(40)])
    free = tasks.free_job.enqueue_many([((f"F{i}",), {}) for i in range(400)])
    most_sampled, samples = 0, 0
    deadline = time.monotonic() + 60
    while r.llen(tasks.LIMITED_DONE) < len(limited) and time.monotonic() < deadline:
        running = r.zrange(DEFAULT_KEYS.running, 0, -1)
        if running:
            pipe = r.pipeline(transaction=False)
            for job_id in running:
                pipe.hget(DEFAULT_KEYS.job(job_id), "limit")
            most_sampled = max(most_sampled, sum(1 for k in pipe.execute() if k == KEY))
            samples += 1
    assert r.llen(tasks.LIMITED_DONE) == len(limited), "the limited jobs did not all run"
    wait_until(lambda: r.llen(tasks.FREE_DONE) == 800, message="the free jobs")
    most_counted = int(r.get(tasks.LIMITED_MOST))
    spans = drain_span(r, alone), drain_span(r, free), drain_span(r, limited)
    report(
        f"limits: 4 workers x 4 processes, 40 jobs limited to 2 ahead of 400 free: most "
        f"running {most_counted} (tasks' count), {most_sampled} (RUNNING set, {samples} "
        f"samples); 400 free jobs drained in {spans[0]:.2f} s alone, {spans[1]:.2f} s "
        f"behind the limited ones, which took {spans[2]:.2f} s"
    )
    assert most_counted == 2 and most_sampled <= 2
    # Not held back by the limited jobs queued ahead of them: the first free job started
    # before the last limited one (which waits for 19 pairs of 50 ms before it).
    assert first_start(r, free) < last_start(r, limited)
    assert sorted(r.lrange(tasks.LIMITED_DONE, 0, -1)) == sorted(f"L{i}" for i in range(40))
    for worker in workers:
        procs.stop(worker)


def test_a_one_at_a_time_job_never_starts_beside_a_rate_limited_job_of_its_key(r, procs, report):
    """``runworker --concurrency 4`` on 30 jobs limited to one at a time and 90 limited
    only by a rate, all under one key: the rated ones may run side by side, but no
    one-at-a-time job is claimed while another job of the key is RUNNING (by Redis's
    clock: its claim inside another's claim-to-finish)."""
    alone, results = set(), []
    for i in range(30):
        results.append(tasks.mixed_alone.enqueue(f"A{i}", 0.01))
        alone.add(results[-1].id)
        results += [tasks.mixed_rated.enqueue(f"R{i}.{j}", 0.01) for j in range(3)]
    procs.start("runscheduler")
    procs.start("runworker", "--concurrency", "4")

    def spans_once_all_ended() -> list[tuple[int, int]] | None:
        # A job's body reports it done before its worker stores its outcome.
        pipe = r.pipeline(transaction=False)
        for result in results:
            pipe.hmget(DEFAULT_KEYS.job(result.id), "last_attempted_at", "finished_at")
        read = pipe.execute()
        return None if any(end is None for _, end in read) else [(int(s), int(e)) for s, e in read]

    wait_until(lambda: spans_once_all_ended() is not None, timeout=60, message="all 120")
    spans = spans_once_all_ended()
    assert spans is not None
    starts_alone = [s for (s, _), result in zip(spans, results, strict=True) if result.id in alone]
    beside = [
        (start, other)
        for start in starts_alone
        for other in spans
        if other[0] < start < other[1]  # strictly: one ms may hold both, in either order
    ]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    report(
        f"limits of two kinds on one key: 30 one-at-a-time jobs among 90 rated ones on 4 "
        f"processes: {len(beside)} claimed beside another job of the key; most running {most}"
    )
    assert beside == []
    assert most > 1  # the rated ones did run side by side: the test could see overlaps


def test_a_rate_limit_holds_in_every_window_of_its_period(r, procs, backend, report):
    """35 jobs at "10/s" on 2 workers (and a scheduler for the parked ones): in no
    1-second window do more than 10 start, by Redis's clock, and all run."""
    results = [tasks.rate_limited.enqueue(f"R{i}") for i in range(35)]
    procs.start("runscheduler")
    workers = [procs.start("runworker", "--concurrency", "2") for _ in range(1)]
    wait_until(lambda: r.llen(tasks.LIMITED_DONE) == 35, timeout=30, message="all 35")
    starts = sorted(
        int(r.hget(DEFAULT_KEYS.job(result.id), "last_attempted_at")) for result in results
    )
    most = max(sum(1 for t in starts if start <= t < start + 1000) for start in starts)
    report(
        f"rate limit 10/s: 35 jobs started over {(starts[-1] - starts[0]) / 1000:.2f} s; "
        f"most starts in any 1 s window: {most}"
    )
    assert most <= 10
    assert starts[-1] - starts[0] >= 3000  # 35 starts need three windows past the first
    for worker in workers:
        procs.stop(worker)
    assert list(itertools.chain(r.keys(DEFAULT_KEYS.limit("*", "parked")))) == []
