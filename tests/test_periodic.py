"""Periodic jobs: occurrences (cron with DST, intervals), each enqueued exactly once
however many schedulers run, catch-up, pause and resume, run now, schedules removed
from settings, and spoilt Redis state.

The tests in this process build a backend with ``override_settings``; those that run
real ``runscheduler`` processes pass the schedules in REDISQUEUE_TEST_PERIODIC (read
by tests/support/settings.py for the ``periodic`` backend).
"""

import json
import logging
import re
import threading
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import task_backends
from django_redisqueue.core.schedules import BATCH, MAX_BACKLOG, Schedule
from django_redisqueue.dashboard.reads import Dashboard
from django_redisqueue.runtime.periodic import PeriodicStep, job_id, run_now, schedules_of
from django_redisqueue.runtime.scheduler import Scheduler
from tests.conftest import manage, wait_until
from tests.support import tasks
from tests.support.fuzzing import TRIED, counted, fuzz
from tests.support.keys import PERIODIC_KEYS

QUEUE = PERIODIC_KEYS.queue("default")
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
EVERY_SECOND = {"task": "tests.support.tasks.noop", "every": 1}


def state(name: str) -> str:
    return PERIODIC_KEYS.periodic_schedule(name)


@contextmanager
def periodic(schedules: dict, time_zone: str = "UTC"):
    """The ``periodic`` backend with these schedules, in this process."""
    conf = dict(settings.TASKS["periodic"])
    conf["OPTIONS"] = {**conf["OPTIONS"], "PERIODIC": schedules}
    with override_settings(TASKS={**settings.TASKS, "periodic": conf}, TIME_ZONE=time_zone):
        yield task_backends["periodic"]


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def local(at_ms: int, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(at_ms / 1000, tz).strftime("%Y-%m-%d %H:%M%z")


def occurrences_in(r, name: str) -> list[int]:
    """The occurrences whose jobs Redis holds (from the deterministic job ids)."""
    ids = r.zrange(QUEUE, 0, -1)
    return sorted(int(i.rsplit(":", 1)[1]) for i in ids if i.startswith(f"periodic:{name}:"))


def stepper(backend) -> PeriodicStep:
    step = PeriodicStep(backend)
    step.sync(backend.broker.clock_ms(), 0.0)
    return step


# Occurrences, without Redis


def test_interval_occurrences_are_whole_multiples_of_the_interval():
    schedule = Schedule("s", "t", every_ms=30_000)
    assert schedule.scan(10_000, 100_000, 10) == [30_000, 60_000, 90_000]
    assert schedule.next_after(30_000) == 60_000
    assert schedule.count(10_000, 100_000) == 3
    assert schedule.tail(10_000, 100_000, 2) == [60_000, 90_000]
    assert Schedule.parse("s", {"task": "t", "every": timedelta(minutes=5)}).every_ms == 300_000


@pytest.mark.parametrize(
    ("tz", "spring", "fall"),
    [
        (
            BERLIN,
            ["2024-03-30 02:30+0100", "2024-03-31 03:00+0200", "2024-04-01 02:30+0200"],
            ["2024-10-26 02:30+0200", "2024-10-27 02:30+0200", "2024-10-28 02:30+0100"],
        ),
        (
            NEW_YORK,
            ["2024-03-09 02:30-0500", "2024-03-10 03:00-0400", "2024-03-11 02:30-0400"],
            ["2024-11-02 02:30-0400", "2024-11-03 02:30-0500", "2024-11-04 02:30-0500"],
        ),
    ],
)
def test_a_daily_cron_runs_when_the_clocks_resume_and_once_when_they_repeat(tz, spring, fall):
    """Debian cron's rules: a fixed time the clocks skip runs when they resume; one the
    clocks repeat runs once. (New York repeats 01:00-02:00: 02:30 is not repeated.)"""
    schedule = Schedule("s", "t", cron="30 2 * * *")
    for expected in (spring, fall):
        start = ms(datetime.fromisoformat(expected[0][:10] + "T00:00").replace(tzinfo=tz))
        found = schedule.scan(start, start + 3 * 86_400_000, 10, tz)
        assert [local(at, tz) for at in found] == expected


def test_a_cron_in_the_repeated_hour_runs_in_both_and_times_only_go_up():
    schedule = Schedule("s", "t", cron="*/30 * * * *")
    start = ms(datetime(2024, 10, 27, 1, 45, tzinfo=BERLIN))
    found = schedule.scan(start, start + 3 * 3_600_000, 20, BERLIN)
    assert found == sorted(set(found))
    assert [local(at, BERLIN)[11:] for at in found[:5]] == [
        "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100", "03:00+0100",
    ]  # fmt: skip
    # Starting inside the repeated hour (the second time round) goes on from there.
    second = ms(datetime(2024, 10, 27, 2, 15, tzinfo=BERLIN, fold=1))
    assert local(schedule.next_after(second, BERLIN), BERLIN)[11:] == "02:30+0100"
    daily = Schedule("s", "t", cron="30 2 * * *")
    assert local(daily.next_after(second, BERLIN), BERLIN) == "2024-10-28 02:30+0100"


def test_catch_up_latest_is_one_occurrence_and_all_is_batches_with_a_bound():
    latest = Schedule("s", "t", every_ms=1000)
    due = latest.due(0, 10_500)
    assert (due.occurrences, due.skipped, due.next_ms) == ([10_000], 9, 11_000)
    every = Schedule("s", "t", every_ms=1000, catch_up="all")
    due = every.due(0, 10_500)
    assert (due.occurrences, due.skipped, due.next_ms) == (
        list(range(1000, 10_001, 1000)),
        0,
        11_000,
    )
    due = every.due(0, 1000 * (BATCH + 5))
    assert len(due.occurrences) == BATCH and due.next_ms == (BATCH + 1) * 1000
    far = every.due(0, 1000 * (MAX_BACKLOG + 500))
    assert far.occurrences[0] == 501_000 and far.skipped == 500
    minutely = Schedule("s", "t", cron="* * * * *", catch_up="all")
    far = minutely.due(0, 60_000 * (MAX_BACKLOG + 500))
    assert far.occurrences[0] == 60_000 * 501 and far.skipped == 500
    cron = Schedule("s", "t", cron="0 * * * *", catch_up="latest")
    year = 365 * 86_400_000
    due = cron.due(0, year + 1_800_000)
    assert due.occurrences == [year] and due.skipped > 8000


# The script: exactly once


def test_many_callers_on_the_same_occurrence_enqueue_it_once(r):
    with periodic({"beat": EVERY_SECOND}) as backend:
        broker = backend.broker
        timetable = schedules_of(backend)[0].timetable()
        [last], _, _ = broker.periodic_sync([("beat", "{}", timetable, 0)])
        now = broker.clock_ms()
        payload = backend.prepare(tasks.noop, (), {})._payload
        occurrence = last // 1000 * 1000 - 1000
        r.hset(state("beat"), "last", occurrence - 1000)
        replies, barrier = [], threading.Barrier(16)

        def call():
            barrier.wait()
            replies.append(
                broker.periodic_run(
                    "beat",
                    timetable=timetable,
                    expected_last=occurrence - 1000,
                    now_ms=now,
                    next_ms=now + 1000,
                    skipped=0,
                    queue="default",
                    priority=0,
                    payload=payload,
                    jobs=[(occurrence, job_id("beat", occurrence))],
                )
            )

        threads = [threading.Thread(target=call) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert Counter(reply.status for reply in replies) == {"ok": 1, "stale": 15}
    assert sum(reply.enqueued for reply in replies) == 1
    assert r.zrange(QUEUE, 0, -1) == [job_id("beat", occurrence)]
    assert int(r.hget(state("beat"), "last")) == occurrence


def test_concurrent_steppers_enqueue_each_occurrence_once(r):
    with periodic({"beat": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
        steppers = [stepper(backend) for _ in range(6)]
        last = int(r.hget(state("beat"), "last"))
        r.hset(state("beat"), "last", last - 250_000)  # down for 250 s
        now = backend.broker.clock_ms()
        barrier = threading.Barrier(len(steppers))

        def run(step):
            barrier.wait()
            while step.step(now) == 0:
                pass

        threads = [threading.Thread(target=run, args=(s,)) for s in steppers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    found = occurrences_in(r, "beat")
    assert found == list(range(found[0], now // 1000 * 1000 + 1, 1000))
    assert len(found) >= 250
    assert int(r.get(PERIODIC_KEYS.seq)) == 2 * len(found)  # one store (2 steps) each


def test_a_job_id_taken_is_never_overwritten(r):
    with periodic({"beat": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
        step = stepper(backend)
        last = int(r.hget(state("beat"), "last")) // 1000 * 1000
        taken = job_id("beat", last)
        r.hset(PERIODIC_KEYS.job(taken), mapping={"status": "SUCCESSFUL", "payload": "mine"})
        r.hset(state("beat"), "last", last - 2000)  # set back (a clock, a hand)
        step.last.clear()
        step.step(backend.broker.clock_ms())
    assert r.hget(PERIODIC_KEYS.job(taken), "payload") == "mine"
    assert job_id("beat", last - 1000) in r.zrange(QUEUE, 0, -1)
    assert taken not in r.zrange(QUEUE, 0, -1)


def test_a_new_schedule_starts_now_and_replays_nothing(r):
    with periodic({"beat": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
        clock = backend.broker.clock_ms()
        step = stepper(backend)
        assert int(r.hget(state("beat"), "last")) >= clock
        assert step.step(clock) > 0
    assert r.zcard(QUEUE) == 0
    assert r.smembers(PERIODIC_KEYS.periodic) == {"beat"}
    assert json.loads(r.hget(state("beat"), "spec"))["task"] == "tests.support.tasks.noop"


def test_dst_through_redis(r):
    """A daily 02:30 in Berlin across both changes of 2024, stepped every 10 minutes."""
    with periodic(
        {"night": {"task": "tests.support.tasks.noop", "cron": "30 2 * * *"}}, "Europe/Berlin"
    ) as backend:
        for day in (datetime(2024, 3, 29, 12), datetime(2024, 10, 25, 12)):
            start = ms(day.replace(tzinfo=BERLIN))
            step = stepper(backend)
            r.hset(state("night"), "last", start)
            step.last.clear()
            for now in range(start, start + 4 * 86_400_000, 600_000):
                step.step(now)
    assert [local(at, BERLIN) for at in occurrences_in(r, "night")] == [
        "2024-03-30 02:30+0100", "2024-03-31 03:00+0200", "2024-04-01 02:30+0200",
        "2024-04-02 02:30+0200",
        "2024-10-26 02:30+0200", "2024-10-27 02:30+0200", "2024-10-28 02:30+0100",
        "2024-10-29 02:30+0100",
    ]  # fmt: skip


# Catch-up, pause, resume, run now, removal


def test_catch_up_after_the_scheduler_was_stopped(r, monkeypatch):
    """A scheduler registers two schedules and stops; 3 occurrences later another one
    runs: "latest" gets one job (the others counted as skipped), "all" one each."""
    monkeypatch.setenv(
        "REDISQUEUE_TEST_PERIODIC",
        json.dumps(
            {
                "latest": {"task": "tests.support.tasks.noop", "every": 1},
                "all": {"task": "tests.support.tasks.noop", "every": 1, "catch_up": "all"},
            }
        ),
    )
    burst = ("runscheduler", "--burst", "--backend", "periodic")
    assert manage(*burst).returncode == 0
    start = int(r.hget(state("all"), "last"))
    assert r.zcard(QUEUE) == 0
    wait_until(lambda: r.time()[0] * 1000 >= start + 3500, 10, "three occurrences to pass")
    out = manage(*burst)
    assert out.returncode == 0, out.stderr
    latest, every = occurrences_in(r, "latest"), occurrences_in(r, "all")
    assert len(latest) == 1
    assert int(r.hget(state("latest"), "skipped")) == len(every) - 1 >= 2
    assert every == list(range(start // 1000 * 1000 + 1000, latest[0] + 1, 1000))
    assert latest[0] == every[-1]


def test_a_paused_schedule_enqueues_nothing_and_resumes_without_replay(r):
    with periodic({"beat": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
        broker, step = backend.broker, stepper(backend)
        broker.periodic_pause("beat")
        last = int(r.hget(state("beat"), "last"))
        r.hset(state("beat"), "last", last - 5000)
        step.last.clear()
        now = broker.clock_ms()
        step.step(now)
        assert r.zcard(QUEUE) == 0
        assert int(r.hget(state("beat"), "last")) == now  # the occurrences passed
        r.hset(state("beat"), "last", now - 5000)  # as if paused 5 s more
        broker.periodic_pause("beat", paused=False)
        resumed = int(r.hget(state("beat"), "last"))
        assert resumed >= now and r.hget(state("beat"), "paused") is None
        step.next.clear()
        step.step(broker.clock_ms())
        assert r.zcard(QUEUE) == 0  # the 5 s paused are not replayed
        clock = wait_until(
            lambda: (t := broker.clock_ms()) >= resumed // 1000 * 1000 + 1000 and t, 5, "a tick"
        )
        step.step(clock)
    assert occurrences_in(r, "beat") == [resumed // 1000 * 1000 + 1000]


def test_run_now_enqueues_a_job_and_records_it_without_moving_last(r):
    with periodic(
        {"beat": {"task": "tests.support.tasks.record", "every": 3600, "args": ["x"]}}
    ) as backend:
        stepper(backend)
        last = r.hget(state("beat"), "last")
        job = run_now(backend, schedules_of(backend)[0])
        assert backend.get_result(job).args == ["x"]
    assert r.zrange(QUEUE, 0, -1) == [job]
    assert r.hget(state("beat"), "last_job") == job
    assert r.hget(state("beat"), "last") == last


def test_removed_schedules_stop_and_their_state_is_deleted(r, caplog):
    with periodic({"kept": EVERY_SECOND, "gone": EVERY_SECOND}) as backend:
        stepper(backend)
    assert r.smembers(PERIODIC_KEYS.periodic) == {"kept", "gone"}
    with periodic({"kept": EVERY_SECOND}) as backend, caplog.at_level(logging.INFO):
        step = stepper(backend)
        r.hset(state("kept"), "last", int(r.hget(state("kept"), "last")) - 3000)
        step.last.clear()
        step.step(backend.broker.clock_ms())
    assert r.smembers(PERIODIC_KEYS.periodic) == {"kept"}
    assert not r.exists(state("gone"))
    assert occurrences_in(r, "gone") == [] and len(occurrences_in(r, "kept")) == 1
    assert "'gone' is no longer in settings" in caplog.text
    with periodic({}) as backend:
        Scheduler(backend, burst=True).run()  # no schedule left: its sync still cleans up
    assert not r.exists(PERIODIC_KEYS.periodic) and not r.exists(state("kept"))


@pytest.mark.parametrize(
    "path", ["tests.support.tasks.nope", "tests.support.module_that_raises.f"]
)
def test_a_task_that_cannot_be_imported_is_logged_and_others_run(r, caplog, path):
    schedules = {"broken": {"task": path, "every": 1}, "fine": EVERY_SECOND}
    with periodic(schedules) as backend, caplog.at_level(logging.ERROR):
        step = stepper(backend)
        for name in schedules:
            r.hset(state(name), "last", int(r.hget(state(name), "last")) - 2000)
        step.last.clear()
        assert step.step(backend.broker.clock_ms()) is not None
    assert f"{path}' cannot be imported" in caplog.text
    assert len(occurrences_in(r, "fine")) == 1 and occurrences_in(r, "broken") == []
    with periodic(schedules):
        from django_redisqueue.checks import check_periodic_tasks

        assert [w.id for w in check_periodic_tasks()] == ["django_redisqueue.W003"]


def test_a_run_due_when_the_state_was_lost_is_not_dropped(r):
    """The state deleted (a Redis without persistence, a scheduler with older settings):
    the scheduler goes on from the last run it knew, and the run due is enqueued."""
    with periodic({"beat": EVERY_SECOND}) as backend:
        step = stepper(backend)
        step.last["beat"] = int(r.hget(state("beat"), "last")) - 3000
        r.delete(state("beat"))
        step.step(backend.broker.clock_ms())
        assert len(occurrences_in(r, "beat")) == 1  # catch-up "latest": the latest run
        assert r.hget(state("beat"), "last_job")


# Edits


def clock_ms(r) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def test_an_edited_schedule_replays_nothing_from_before_the_edit(r, monkeypatch):
    """Every 30 s, edited to every second with catch-up "all" 10 s after its last run,
    the schedulers restarted: no job for an instant before the sync that brought the
    edit; the first is the new timetable's first occurrence after it, then each one."""
    burst = ("runscheduler", "--burst", "--backend", "periodic")
    every_30 = {"beat": {"task": "tests.support.tasks.noop", "every": 30}}
    monkeypatch.setenv("REDISQUEUE_TEST_PERIODIC", json.dumps(every_30))
    assert manage(*burst).returncode == 0
    r.hset(state("beat"), "last", clock_ms(r) // 1000 * 1000 - 10_000)  # its run 10 s ago
    every_second = {"beat": {**EVERY_SECOND, "catch_up": "all"}}
    monkeypatch.setenv("REDISQUEUE_TEST_PERIODIC", json.dumps(every_second))
    before_edit = clock_ms(r)
    out = manage(*burst)
    assert out.returncode == 0, out.stderr
    assert occurrences_in(r, "beat") == []
    edited = int(r.hget(state("beat"), "last"))
    assert edited >= before_edit
    assert "'beat' runs at other times than Redis held" in out.stderr
    first = edited // 1000 * 1000 + 1000
    wait_until(lambda: clock_ms(r) >= first + 1000, 10, "two occurrences after the edit")
    out = manage(*burst)
    assert out.returncode == 0, out.stderr
    found = occurrences_in(r, "beat")
    assert found[0] == first and found == list(range(first, found[-1] + 1, 1000))
    assert "runs at other times" not in out.stderr  # the same timetable: no edit again


def test_schedulers_with_old_and_new_settings_take_turns_and_replay_nothing(r, caplog):
    """A rolling deploy: one scheduler with the old timetable, one with the new, both
    syncing and stepping. The timetable of the latest sync is in force from that
    sync; the other scheduler enqueues nothing (and says so) until its own sync."""
    old = {"beat": {"task": "tests.support.tasks.noop", "every": 30}}
    new = {"beat": {**EVERY_SECOND, "catch_up": "all"}}
    with periodic(old) as old_backend:
        old_step = stepper(old_backend)
        stale = clock_ms(r) - 10_000
        r.hset(state("beat"), "last", stale)
        old_step.last["beat"] = stale  # what it knew: it computes its own runs from there
        with periodic(new) as new_backend, caplog.at_level(logging.INFO):
            before_edit = clock_ms(r)
            new_step = stepper(new_backend)  # the edit
            edited = int(r.hget(state("beat"), "last"))
            clock = wait_until(lambda: (t := clock_ms(r)) >= edited // 1000 * 1000 + 2000 and t)
            old_step.step(clock)
            assert occurrences_in(r, "beat") == []
            new_step.step(clock)
            taken = occurrences_in(r, "beat")
            assert taken and taken[0] > before_edit
            assert taken == list(
                range(edited // 1000 * 1000 + 1000, clock // 1000 * 1000 + 1, 1000)
            )
            assert "Redis holds another timetable for it" in caplog.text
            old_step.sync(clock_ms(r), 0.0)  # the old timetable again, from now
            flipped = int(r.hget(state("beat"), "last"))
            clock = wait_until(lambda: (t := clock_ms(r)) >= flipped // 1000 * 1000 + 2000 and t)
            new_step.next.clear()
            new_step.step(clock)
            assert occurrences_in(r, "beat") == taken  # refused: not the timetable in force
            new_step.sync(clock_ms(r), 0.0)  # the new one again, from now
            again = int(r.hget(state("beat"), "last"))
            clock = wait_until(lambda: (t := clock_ms(r)) >= again // 1000 * 1000 + 1000 and t)
            new_step.step(clock)
    after = occurrences_in(r, "beat")[len(taken) :]
    assert after and after[0] == again // 1000 * 1000 + 1000  # none of (flipped, again]


def test_an_edit_while_other_schedulers_enqueue_replays_nothing(r):
    """Three schedulers with the old timetable step without pause through a backlog
    while a fourth syncs the edit: the jobs stored after the edit (by their
    ``enqueued_at``) are all of the new timetable and after the edit, each of its
    runs once; those stored before it are runs from before it."""
    old = {"beat": {**EVERY_SECOND, "catch_up": "all"}}
    new = {"beat": {"task": "tests.support.tasks.noop", "every": 2, "catch_up": "all"}}
    stop = threading.Event()

    def run(step):
        while not stop.is_set():
            step.next.clear()
            step.step(clock_ms(r))

    with periodic(old) as old_backend:
        steppers = [stepper(old_backend) for _ in range(3)]
        r.hset(state("beat"), "last", clock_ms(r) // 1000 * 1000 - 300_000)
        threads = [threading.Thread(target=run, args=(step,)) for step in steppers]
        for thread in threads:
            thread.start()
        try:
            with periodic(new) as new_backend:
                wait_until(lambda: len(occurrences_in(r, "beat")) > 20, 10, "a backlog")
                new_step = stepper(new_backend)
                edited = int(r.hget(state("beat"), "last"))
                clock = wait_until(lambda: (t := clock_ms(r)) >= edited + 4100 and t)
                new_step.step(clock)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    found = occurrences_in(r, "beat")
    for at in found:
        stored = int(r.hget(PERIODIC_KEYS.job(job_id("beat", at)), "enqueued_at"))
        # Stored after the edit: a run after it; before it (or in its ms): one before.
        assert at > edited if stored > edited else at <= edited, (at, stored, edited)
    first = edited // 2000 * 2000 + 2000
    assert [at for at in found if at > edited] == list(range(first, clock + 1, 2000))
    assert int(r.get(PERIODIC_KEYS.seq)) == 2 * len(found)


@pytest.mark.parametrize(
    ("edited_at", "first"),
    [
        # The first 02:30 of the night clocks go back is still ahead: it runs.
        (datetime(2024, 10, 27, 2, 15, tzinfo=BERLIN), "2024-10-27 02:30+0200"),
        # In the repeated hour's second pass, 02:30 does not run again: the next night.
        (datetime(2024, 10, 27, 2, 15, tzinfo=BERLIN, fold=1), "2024-10-28 02:30+0100"),
        # Before clocks go forward: the skipped 02:30 runs when they resume, at 03:00.
        (datetime(2024, 3, 31, 1, 50, tzinfo=BERLIN), "2024-03-31 03:00+0200"),
        # After it: that 03:00 was before the edit, so the next night.
        (datetime(2024, 3, 31, 3, 10, tzinfo=BERLIN), "2024-04-01 02:30+0200"),
    ],
)
def test_a_cron_edited_across_a_dst_change_starts_after_the_edit(r, edited_at, first):
    """Edited to ``30 2 * * *`` in Berlin on a night the clocks change (the edit's
    moment set by hand, as the sync stamps Redis's clock): the first job is the first
    run after the edit, by Debian cron's rules."""
    with periodic(
        {"night": {"task": "tests.support.tasks.noop", "cron": "0 12 * * *"}}, "Europe/Berlin"
    ) as backend:
        stepper(backend)
    with periodic(
        {"night": {"task": "tests.support.tasks.noop", "cron": "30 2 * * *"}}, "Europe/Berlin"
    ) as backend:
        step = stepper(backend)  # the edit
        edit = ms(edited_at)
        r.hset(state("night"), "last", edit)
        step.last["night"] = edit
        for now in range(edit, edit + 2 * 86_400_000, 600_000):
            step.step(now)
    assert local(occurrences_in(r, "night")[0], BERLIN) == first


def test_new_arguments_or_catch_up_keep_the_runs_due(r):
    """No edit: its task, arguments or catch-up changed, the runs due under the same
    timetable stay due, and are enqueued as settings say now."""
    with periodic({"beat": {**EVERY_SECOND, "args": ["a"]}}) as backend:
        stepper(backend)
        r.hset(state("beat"), "last", int(r.hget(state("beat"), "last")) // 1000 * 1000 - 3000)
    with periodic({"beat": {**EVERY_SECOND, "args": ["b"], "catch_up": "all"}}) as backend:
        step = stepper(backend)
        last = int(r.hget(state("beat"), "last"))
        step.step(backend.broker.clock_ms())
        found = occurrences_in(r, "beat")
        assert found[:3] == [last + 1000, last + 2000, last + 3000]
        assert backend.get_result(job_id("beat", found[0])).args == ["b"]


def test_a_state_of_an_older_version_keeps_its_runs_due_if_its_settings_are_the_same(r):
    """A state without ``timetable`` (an older version wrote it), 3 runs missed: the
    first sync keeps its ``last`` if the spec is the one it holds, else starts now."""
    schedules = {"same": {**EVERY_SECOND, "catch_up": "all"}, "other": EVERY_SECOND}
    with periodic(schedules) as backend:
        stepper(backend)
        for name in schedules:
            r.hdel(state(name), "timetable")
            r.hset(state(name), "last", int(r.hget(state(name), "last")) // 1000 * 1000 - 3000)
        r.hset(state("other"), "spec", '{"task":"tests.support.tasks.noop","every":2.0}')
        missed = int(r.hget(state("same"), "last"))
        step = stepper(backend)
        assert int(r.hget(state("same"), "last")) == missed
        assert int(r.hget(state("other"), "last")) >= missed + 3000  # now
        step.step(backend.broker.clock_ms())
    assert occurrences_in(r, "same")[:3] == [missed + 1000, missed + 2000, missed + 3000]
    assert occurrences_in(r, "other") == []


def test_the_timetable_is_when_a_schedule_runs():
    """Its interval, or its cron expression (spaces aside) and the time zone it is read
    in: a change of TIME_ZONE moves a cron schedule's runs, not an interval's."""
    daily = Schedule("s", "t", cron="30  3 * * *", args=(1,))
    assert daily.timetable(BERLIN) == "cron 30 3 * * * Europe/Berlin"
    assert daily.timetable(BERLIN) != daily.timetable(NEW_YORK)
    assert Schedule("s", "t", cron="30 3 * * *", catch_up="all").timetable(BERLIN) == (
        daily.timetable(BERLIN)
    )
    every = Schedule("s", "t", every_ms=60_000)
    assert every.timetable(BERLIN) == every.timetable(NEW_YORK) == "every 60000 ms"
    assert every.timetable() != Schedule("s", "t", cron="* * * * *").timetable()


def test_the_scheduler_loop_enqueues_each_occurrence(r):
    with periodic(
        {"fast": {"task": "tests.support.tasks.noop", "every": 1, "catch_up": "all"}}
    ) as backend:
        scheduler = Scheduler(backend)
        thread = threading.Thread(target=scheduler.run)
        thread.start()
        try:
            wait_until(lambda: len(occurrences_in(r, "fast")) >= 3, 30, "3 occurrences")
        finally:
            scheduler.stop()
            r.rpush(PERIODIC_KEYS.scheduler_wake, 1)
            thread.join(timeout=30)
    found = occurrences_in(r, "fast")
    assert found == list(range(found[0], found[-1] + 1, 1000))


# Spoilt state


SPOILT = ["abc", "", "1e400", "-inf", "nan", "99999999999999999999", "1.5", "-5", "0x10"]


@pytest.mark.parametrize("value", SPOILT)
def test_a_spoilt_last_never_stops_the_schedules(r, value):
    with periodic({"a": EVERY_SECOND, "b": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
        step = stepper(backend)
        r.hset(state("a"), mapping={"last": value, "skipped": value, "last_at": value})
        r.delete(state("b"))
        r.set(state("b"), "not a hash")
        step.last.clear()
        now = backend.broker.clock_ms()
        step.step(now)  # a: starts again (or catches up "latest"); b: starts again
        assert r.type(state("b")) == "hash"
        r.hset(state("b"), "last", int(r.hget(state("b"), "last")) - 3000)
        step.last.clear()
        step.next.clear()
        step.step(backend.broker.clock_ms())
        assert Dashboard(backend).schedules()[0].name == "a"
    assert len(occurrences_in(r, "b")) == 3
    assert int(r.hget(state("a"), "last")) <= now + 1000


def test_a_spoilt_set_of_names_is_rebuilt(r):
    r.set(PERIODIC_KEYS.periodic, "spoilt")
    with periodic({"a": EVERY_SECOND}) as backend:
        stepper(backend)
    assert r.smembers(PERIODIC_KEYS.periodic) == {"a"}


FIELDS = ["last", "last_job", "last_at", "next", "paused", "spec", "timetable", "skipped"]
values = st.one_of(
    st.sampled_from(
        [
            *SPOILT,
            "1",
            "0",
            "<script>x</script>",
            '{"task": 1}',
            "[]",
            "periodic:",
            "every 1000 ms",
        ]
    ),
    st.text(max_size=20),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


def test_fuzz_what_the_script_and_dashboard_read(r, report):
    """Whatever a schedule's key and the set of names hold: no script raises, the
    dashboard reads them, and the schedule runs again afterwards."""

    @fuzz(60)
    @given(
        fields=st.dictionaries(st.sampled_from(FIELDS), values, max_size=len(FIELDS)),
        kind=st.sampled_from(["hash", "string", "list", "set", "zset", "none"]),
        names_kind=st.sampled_from(["set", "string", "none"]),
    )
    def check(fields, kind, names_kind):
        TRIED["periodic state"] += 1
        r.flushall()
        key = state("a")
        if kind == "hash" and fields:
            r.hset(key, mapping=fields)
        elif kind == "string":
            r.set(key, "x")
        elif kind == "list":
            r.rpush(key, "x")
        elif kind == "set":
            r.sadd(key, "x")
        elif kind == "zset":
            r.zadd(key, {"x": 1})
        if names_kind == "string":
            r.set(PERIODIC_KEYS.periodic, "x")
        elif names_kind == "set":
            r.sadd(PERIODIC_KEYS.periodic, "a", "<script>", "b")
        with periodic({"a": {**EVERY_SECOND, "catch_up": "all"}}) as backend:
            Dashboard(backend).schedules()
            step = PeriodicStep(backend)
            now = backend.broker.clock_ms()
            step.step(now)
            step.sync(now, 0.0)
            backend.broker.periodic_pause("a", paused=False)
            run_now(backend, schedules_of(backend)[0])
            rows = Dashboard(backend).schedules()
            assert [row.name for row in rows] == ["a"]
            r.hset(key, "last", now - 3000)
            step.last.clear()
            step.next.clear()
            step.step(now)
        assert len(occurrences_in(r, "a")) >= 2

    with counted("periodic state", report):
        check()


# Exactly once, with real schedulers


@pytest.mark.long
def test_three_schedulers_for_a_minute_enqueue_each_occurrence_once(r, procs, report, monkeypatch):
    """Three ``runscheduler`` on an every-second schedule that catches up "all"; at
    half time one is SIGKILLed and started again. Ledger: the jobs Redis holds (one
    per occurrence, by its deterministic id) and the arrival counter, which every job
    stored takes one number of: stores = occurrences means no occurrence was stored
    twice, and consecutive occurrences that none was missed."""
    monkeypatch.setenv(
        "REDISQUEUE_TEST_PERIODIC",
        json.dumps({"beat": {"task": "tests.support.tasks.noop", "every": 1, "catch_up": "all"}}),
    )
    command = ("runscheduler", "--backend", "periodic")
    schedulers = [procs.start(*command) for _ in range(3)]
    # The registration stores its time as `last`, which the first occurrence replaces:
    # read as soon as it is there, it may already be that occurrence's (a whole second).
    last = wait_until(lambda: r.hget(state("beat"), "last"), 60, "the registration")
    registered = int(last)
    wait_until(lambda: len(occurrences_in(r, "beat")) >= 30, 90, "30 occurrences")
    procs.kill(schedulers[0])
    schedulers[0] = procs.start(*command)
    wait_until(lambda: len(occurrences_in(r, "beat")) >= 60, 90, "60 occurrences")
    outputs = procs.stop_all()
    found = occurrences_in(r, "beat")
    stores = int(r.get(PERIODIC_KEYS.seq)) // 2  # a store steps the counter by 2
    per_scheduler = [
        sum(map(int, re.findall(r"enqueued (\d+) occurrence", out))) for out in outputs
    ]
    missed = (found[-1] - found[0]) // 1000 + 1 - len(found)
    duplicates = stores - len(found)
    report(
        f"periodic exactly once: 3 schedulers (one SIGKILLed and restarted), "
        f"{len(found)} occurrences, duplicates {duplicates}, missed {missed}, "
        f"enqueued per scheduler since its last start {per_scheduler}"
    )
    # Nothing before registration: the first occurrence after it, or the one read.
    first_after = registered // 1000 * 1000 + 1000
    assert found[0] == first_after or (registered % 1000 == 0 and found[0] == registered)
    assert missed == 0 and duplicates == 0
    assert sum(per_scheduler) <= len(found)


# Settings


def test_system_checks_report_wrong_schedules_and_tasks_that_cannot_be_used():
    from django_redisqueue.checks import check_periodic_tasks, check_settings

    wrong = {"a b": EVERY_SECOND, "x": {"task": "t", "cron": "61 * * * *", "every": 1}}
    with periodic(wrong):
        errors = [e for e in check_settings() if e.id == "django_redisqueue.E009"]
    assert len(errors) == 2
    assert "invalid schedule name 'a b'" in errors[0].msg
    assert "exactly one of 'cron' and 'every'" in errors[1].msg
    odd = {
        "never": {
            "task": "tests.support.tasks.noop",
            "cron": "0 0 */29 2 5#5",
        },  # no run in 50 years
        "seconds": {"task": "tests.support.tasks.noop", "cron": "0 30 2 * * *"},  # six fields
        "huge": {"task": "tests.support.tasks.noop", "every": 1e308},
        "tiny": {"task": "tests.support.tasks.noop", "every": 0.001},
    }
    with periodic(odd):
        errors = [e.msg for e in check_settings() if e.id == "django_redisqueue.E009"]
    assert len(errors) == 4 and "never matches" in errors[0] and "6 fields" in errors[1]
    with periodic({"gone": {"task": "tests.support.tasks.nope", "every": 1}, "ok": EVERY_SECOND}):
        warnings = check_periodic_tasks()
    assert [w.id for w in warnings] == ["django_redisqueue.W003"]
    assert "'tests.support.tasks.nope' cannot be imported" in warnings[0].msg
