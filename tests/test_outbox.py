"""The transactional outbox (``OPTIONS["OUTBOX"]``), on SQLite, PostgreSQL and MariaDB:
a job enqueued in a transaction commits or rolls back with it, reaches Redis once it
has committed whatever Redis does at the commit, and is stored once however often it
is relayed. The fault test is in test_outbox_faults.py."""

import contextlib
import io
import json
from datetime import timedelta
from unittest import mock

import pytest
import redis
from django.core.management import call_command
from django.db import OperationalError, connections, transaction
from django.urls import reverse
from django.utils import timezone

from django_redisqueue.backends import outbox
from django_redisqueue.backends.outbox import OutboxRelay
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.core.conf import validate
from django_redisqueue.dashboard.reads import Dashboard
from django_redisqueue.exceptions import ConfigurationError, NotCancellable, NotStoppable
from django_redisqueue.models import OutboxJob
from django_redisqueue.observe import metrics
from django_redisqueue.observe.health import OUTBOX_STUCK
from tests.conftest import not_on_cluster, private_redis, run_worker_here, wait_until
from tests.support import tasks
from tests.support.outboxes import two_relays_at_once, waiting

DATABASES = ["default", "postgresql", "mariadb"]

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=DATABASES),
    pytest.mark.usefixtures("outbox_backends"),
    not_on_cluster,
]


@pytest.fixture(params=DATABASES)
def database(request):
    return request.param


@pytest.fixture
def backend(database, r):
    return task_backends[f"outbox-{database}"]


def rows(database):
    """The outbox's rows, oldest first."""
    rows = OutboxJob.objects.using(database).order_by("id")
    return list(rows.values_list("job_id", flat=True))


def queued(r, backend):
    return r.zrange(backend.keys.queue("default"), 0, -1)


def job_exists(backend, job_id):
    return backend.queries.get_job(job_id) is not None


def enqueue(backend, *args, task=tasks.add, **options):
    return task.using(backend=backend.alias, **options).enqueue(*args)


def test_a_job_commits_with_the_transaction_and_reaches_redis_after_it(backend, database):
    with transaction.atomic(using=database):
        result = enqueue(backend, 1, 2)
        assert rows(database) == [result.id]
        assert not job_exists(backend, result.id)
        # Known before it reaches Redis: READY, from the outbox.
        assert backend.get_result(result.id).status == TaskResultStatus.READY
    assert rows(database) == []
    assert job_exists(backend, result.id)
    assert result.enqueued_at is not None
    assert backend.get_result(result.id).args == [1, 2]


def test_a_transactions_jobs_leave_its_outbox_together_right_after_the_commit(backend, database):
    """Jobs written to one outbox in one transaction are relayed in one batch, as jobs
    queued on commit are pushed in one: one relay, one round trip."""
    relayed = []
    relay = OutboxRelay.relay_committed

    def counted(self, results, database):
        relayed.append([result.id for result in results])
        relay(self, results, database)

    with (
        mock.patch.object(OutboxRelay, "relay_committed", counted),
        transaction.atomic(using=database),
    ):
        ids = [enqueue(backend, i, 1).id for i in range(3)]
    assert relayed == [ids]
    assert rows(database) == []
    assert all(job_exists(backend, job_id) for job_id in ids)


def test_a_rolled_back_transaction_or_savepoint_leaves_no_job(backend, database):
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic(using=database):
        dropped = enqueue(backend, 1, 1)
        raise Undo
    with transaction.atomic(using=database):
        kept = enqueue(backend, 2, 2)
        with pytest.raises(Undo), transaction.atomic(using=database):
            in_savepoint = enqueue(backend, 3, 3)
            raise Undo
        after_savepoint = enqueue(backend, 4, 4)
    assert rows(database) == []
    for result in (dropped, in_savepoint):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result.id)
    assert job_exists(backend, kept.id) and job_exists(backend, after_savepoint.id)


def test_outside_a_transaction_the_job_goes_to_redis_at_once(backend, database):
    result = enqueue(backend, 1, 2)
    assert job_exists(backend, result.id)
    assert rows(database) == []


def test_a_commit_while_redis_refuses_keeps_the_job_until_the_relay(database, caplog):
    """The commit succeeds and the caller hears nothing; the job waits, READY, in the
    outbox; runscheduler's relay stores it once Redis is back."""
    with private_redis("--appendonly", "yes") as server:
        backend = task_backends[f"outbox-{database}"]
        server.kill()
        with transaction.atomic(using=database):
            result = enqueue(backend, 5, 6)
        assert rows(database) == [result.id]
        assert "stay in the outbox" in caplog.text
        assert backend.get_result(result.id).status == TaskResultStatus.READY
        with pytest.raises(redis.ConnectionError):
            backend.outbox.relay_left(settle=0)
        assert rows(database) == [result.id]  # nothing deleted on a failed relay
        server.start()
        assert backend.outbox.relay_left(settle=0) == 1
        assert rows(database) == []
        assert backend.get_result(result.id).status == TaskResultStatus.READY
        assert job_exists(backend, result.id)


def test_a_row_relayed_twice_makes_one_job(backend, database, r):
    with transaction.atomic(using=database):
        result = enqueue(backend, 1, 2)
    stored = backend.queries.get_job(result.id)
    # As if a relay stored the job and died before deleting its row.
    copy = waiting(result.id, 9)
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [copy])
    assert backend.outbox.relay_left(settle=0) == 1
    assert rows(database) == []
    assert backend.queries.get_job(result.id) == stored
    assert backend.get_result(result.id).args == [1, 2]  # the first one, untouched
    assert queued(r, backend) == [result.id]


def test_a_row_relayed_after_its_job_ran_and_its_result_expired_stores_nothing(
    backend, database, r
):
    """The producer dies between the commit's store and its delete; the jobs run, and
    their results expire (a result TTL of 1 s); runscheduler relays the rows: each job
    ran once, and the rows and their relay records are gone. (Before the records, 20
    jobs ran 40 times so.)"""
    ledger = tasks.client()
    ledger.delete("test:ledger")
    with mock.patch.object(outbox, "forget"), transaction.atomic(using=database):
        jobs = [enqueue(backend, i, 0, task=tasks.ledger) for i in range(5)]
    assert len(rows(database)) == 5 and queued(r, backend) == [job.id for job in jobs]
    with mock.patch.object(backend.broker, "result_ttl", 1):
        run_worker_here(backend)
    keys = [backend.keys.job(job.id) for job in jobs]
    wait_until(lambda: not r.exists(*keys), 10, "the results to expire")
    assert backend.outbox.relay_left(settle=0) == 5
    assert rows(database) == [] and queued(r, backend) == []
    assert outbox.sweep_records(backend.broker, backend.config.outbox, hold=0) == 0
    assert not r.exists(backend.keys.relayed)
    assert sorted(ledger.lrange("test:ledger", 0, -1)) == ["0", "1", "2", "3", "4"]


def test_the_sweep_drops_the_relay_records_of_deleted_rows_only(backend, database, r):
    """Records of rows deleted go; those of rows that remain stay (relayed again, they
    must store nothing), and a page of them does not stop the sweep: it goes on past
    them, and starts again from the oldest once it reached the end."""
    with mock.patch.object(outbox, "forget"), transaction.atomic(using=database):
        kept = [enqueue(backend, i, i) for i in range(3)]
    with transaction.atomic(using=database):
        gone = [enqueue(backend, i, i) for i in range(4)]
    assert r.zcard(backend.keys.relayed) == 7
    start = outbox.sweep_records(backend.broker, backend.config.outbox, batch=3, hold=0)
    assert start == 3  # a first page all kept: the next sweep starts past it
    assert r.zcard(backend.keys.relayed) == 7
    assert outbox.sweep_records(backend.broker, backend.config.outbox, start, batch=3, hold=0) == 0
    assert set(r.zrange(backend.keys.relayed, 0, -1)) == {job.id for job in kept}
    assert rows(database) == [job.id for job in kept]
    assert not {job.id for job in gone} & set(r.zrange(backend.keys.relayed, 0, -1))


def test_runscheduler_relays_what_is_left_and_sweeps_the_records_of_deleted_rows(
    backend, database, r
):
    from django_redisqueue.runtime.scheduler import Scheduler

    with transaction.atomic(using=database):
        relayed = enqueue(backend, 1, 1)  # by the commit: its row is deleted, its record left
    an_old_row(database, backend, 10, timezone.now())  # left behind: runscheduler's
    Scheduler(backend, burst=True).run()
    assert rows(database) == []
    assert queued(r, backend) == [relayed.id, "d" * 26]
    # Held for a while (a relay that read a row before its delete may store it late)...
    assert set(r.zrange(backend.keys.relayed, 0, -1)) == {relayed.id, "d" * 26}
    with mock.patch.object(outbox, "RECORD_HOLD_SECONDS", 0):
        Scheduler(backend, burst=True).run()
    assert not r.exists(backend.keys.relayed)  # ...then swept by the scheduler


def test_a_relay_that_read_its_rows_before_they_were_deleted_finds_their_records(
    backend, database, r
):
    """The committing process reads its rows, then stalls; runscheduler relays the rows,
    deletes them and sweeps; the jobs run and their results expire; the stalled relay
    stores nothing: the records are held past the sweep."""
    stalled = []
    stall = mock.patch.object(OutboxRelay, "relay_committed", lambda *a: stalled.append(a))
    with stall, transaction.atomic(using=database):
        job = enqueue(backend, 1, 1)
    OutboxJob.objects.using(database).update(created_at=timezone.now() - timedelta(seconds=10))
    assert backend.outbox.relay_left(settle=0) == 1
    assert outbox.sweep_records(backend.broker, backend.config.outbox) == 0
    r.delete(backend.keys.job(job.id))  # it ran, and its result expired
    r.zrem(backend.keys.queue("default"), job.id)
    with mock.patch.object(outbox, "present", return_value={job.id}):  # read before the delete
        backend.outbox.relay_committed(*stalled[0][1:])
    assert not r.exists(backend.keys.job(job.id))  # stored nothing


def test_relays_at_once_relay_each_row_once_and_in_order(backend, database, r):
    """Two relays at the same moment, the first holding the five oldest rows: where the
    database skips locked rows, the second leaves it the step (relaying the fifteen
    others now would put them ahead in the queue); elsewhere (SQLite) it waits for the
    first to commit, then relays them."""
    ids = [f"{n:026x}" for n in range(20)]
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [waiting(job_id, n) for n, job_id in enumerate(ids)])

    def skipped(relayed):
        assert relayed == {"second": 0}  # done while the first holds its rows

    relayed = two_relays_at_once(backend, database, 5, 100, skipping=skipped)
    if connections[database].features.has_select_for_update_skip_locked:
        assert relayed == {"first": 5, "second": 0}
        assert backend.outbox.relay_left(settle=0) == 15
    else:
        assert relayed == {"first": 5, "second": 15}
    assert rows(database) == []
    assert queued(r, backend) == ids


def test_a_job_that_runs_after_another_in_the_same_transaction(backend, database, r):
    with transaction.atomic(using=database):
        first = enqueue(backend, 1, 1)
        then = enqueue(backend, 2, 2, depends_on=first)
    assert rows(database) == []
    assert backend.get_result(then.id).status == TaskResultStatus.READY
    assert queued(r, backend) == [first.id]


def test_the_relay_drops_a_job_that_runs_after_a_job_that_is_gone(backend, database, caplog):
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [waiting("a" * 26, 1, after="b" * 26)])
    assert backend.outbox.relay_left(settle=0) == 1
    assert rows(database) == []
    assert "does not exist" in caplog.text


@pytest.mark.parametrize("relayed_by", ["the commit", "runscheduler"])
def test_a_delayed_limited_job_keeps_its_time_and_limit_through_the_outbox(
    backend, database, relayed_by
):
    died = relayed_by == "runscheduler"  # the committing process, before its relay
    left_behind = mock.patch.object(OutboxRelay, "relay_committed")
    with left_behind if died else contextlib.nullcontext(), transaction.atomic(using=database):
        result = enqueue(
            backend, "a", 0, task=tasks.limited_two, limit_key="partner:7", delay=3600
        )
    if died:
        assert rows(database) == [result.id]
        assert backend.outbox.relay_left(settle=0) == 1
    assert rows(database) == []
    assert backend.queries.delayed_count(["default"]) == 1  # due in an hour, not ready
    assert backend.queries.queue_length("default") == 0
    assert "partner:7" in Dashboard(backend).job(result.id).limits


def test_a_unique_job_cannot_go_through_the_outbox_but_may_skip_it(backend, database):
    with transaction.atomic(using=database):
        with pytest.raises(ValueError, match="unique"):
            enqueue(backend, "k", task=tasks.unique_report)
        result = enqueue(backend, "k", task=tasks.unique_report, outbox=False)
        assert rows(database) == []
    assert job_exists(backend, result.id)


def test_the_task_may_opt_out_and_an_opt_in_needs_an_outbox(backend, database):
    with transaction.atomic(using=database):
        skipped = enqueue(backend, 1, 1, outbox=False)
        assert rows(database) == []
        assert job_exists(backend, skipped.id)  # at once, as without the outbox
    with pytest.raises(ConfigurationError, match="OUTBOX"):
        tasks.add.using(outbox=True).enqueue(1, 1)


def test_a_database_without_an_outbox_sends_as_without_one_unless_asked(r):
    backend = task_backends["outbox-default"]
    with transaction.atomic(using="postgresql"):
        [result] = backend.enqueue_many(tasks.add, [((1, 1), {})], using="postgresql")
        assert job_exists(backend, result.id)  # at once: ENQUEUE_ON_COMMIT is off
    assert rows("default") == rows("postgresql") == []
    with pytest.raises(ConfigurationError, match="'postgresql' has no outbox"):
        backend.enqueue_many(tasks.add.using(outbox=True), [((1, 1), {})], using="postgresql")


def test_a_manually_rolled_back_savepoint_takes_its_jobs(backend, database):
    """Django keeps the on_commit callbacks of a savepoint that savepoint_rollback()
    undid; the relay sends only the jobs whose rows committed."""
    with transaction.atomic(using=database):
        kept = enqueue(backend, 1, 1)
        savepoint = transaction.savepoint(using=database)
        undone = enqueue(backend, 2, 2)
        transaction.savepoint_rollback(savepoint, using=database)
    assert job_exists(backend, kept.id)
    assert not job_exists(backend, undone.id)
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(undone.id)


def test_a_job_whose_dependency_is_gone_drops_alone(backend, database, caplog):
    with transaction.atomic(using=database):
        welcome = enqueue(backend, 1, 1)
        orphan = enqueue(backend, 2, 2, depends_on="0" * 26)  # a result expired, say
    assert job_exists(backend, welcome.id)
    assert not job_exists(backend, orphan.id)
    assert rows(database) == []
    assert "does not exist" in caplog.text


def test_a_job_waiting_for_a_job_still_in_the_outbox_is_relayed_after_it(backend, database):
    with (
        mock.patch.object(backend.broker, "enqueue", side_effect=redis.ConnectionError("down")),
        transaction.atomic(using=database),
    ):
        first = enqueue(backend, 1, 1)  # left behind: Redis refused its relay
    with transaction.atomic(using=database):
        then = enqueue(backend, 2, 2, depends_on=first)
    assert rows(database) == [first.id, then.id]  # it waits for the one it runs after
    assert backend.outbox.relay_left(settle=0) == 2
    assert rows(database) == []
    assert backend.get_result(then.id).status == TaskResultStatus.READY


def left_behind(backend):
    """The committing process dies before its relay: the rows wait for runscheduler."""
    return mock.patch.object(OutboxRelay, "relay_committed")


def test_a_batch_of_the_relay_takes_the_jobs_that_run_after_its_own(backend, database):
    """Relayed alone, a chain's first job could run and its result expire before the
    batch holding the next one, which would then be dropped: they go together."""
    with left_behind(backend), transaction.atomic(using=database):
        first = enqueue(backend, 1, 1)
        other = enqueue(backend, 9, 9)
        then = enqueue(backend, 2, 2, depends_on=first)
        last = enqueue(backend, 3, 3, depends_on=then)
    relayed = outbox.relay(
        backend.broker, backend.alias, database, record_queues=False, batch=1, settle=0
    )
    assert relayed == 3
    assert rows(database) == [other.id]  # not linked to the batch: the next one's
    run_worker_here(backend)
    assert backend.get_result(last.id).return_value == 6


def test_a_relay_cut_by_redis_stores_a_job_with_the_one_it_runs_after_or_neither(
    backend, database
):
    with left_behind(backend), transaction.atomic(using=database):
        first = enqueue(backend, 1, 1)
        then = enqueue(backend, 2, 2, depends_on=first)
    send = backend.broker.enqueue_linked

    def cut(jobs, **options):  # the connection drops before the call that carries it
        if any(job.job_id == then.id for job in jobs):
            raise redis.ConnectionError("connection reset")
        return send(jobs, **options)

    with mock.patch.object(backend.broker, "enqueue_linked", cut), pytest.raises(redis.RedisError):
        backend.outbox.relay_left(settle=0)
    assert not job_exists(backend, first.id)  # else it could run, and its result expire
    assert backend.outbox.relay_left(settle=0) == 2
    run_worker_here(backend)
    assert backend.get_result(then.id).return_value == 4


def test_a_job_after_one_relayed_before_whose_result_expired_is_dropped(
    backend, database, r, caplog
):
    """Never left waiting for a job that is gone: dropped, said, its row deleted."""
    first, then = "a" * 26, "b" * 26
    backend.broker.enqueue([waiting(first, 1)], relayed=True)
    run_worker_here(backend)
    r.delete(backend.keys.job(first))  # as its result's TTL would
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [waiting(first, 1), waiting(then, 2, after=first)])
    assert backend.outbox.relay_left(settle=0) == 2
    assert rows(database) == []
    assert not job_exists(backend, then)
    assert f"job(s) {then} run after job {first}, which does not exist" in caplog.text


def test_a_job_in_the_outbox_cannot_be_cancelled_yet_and_has_its_page(backend, database, viewer):
    with left_behind(backend), transaction.atomic(using=database):
        result = enqueue(backend, 1, 1)
    with pytest.raises(NotCancellable, match="in the outbox"):
        result.cancel()
    with pytest.raises(NotStoppable, match=r"in the outbox.*not started"):
        result.stop()
    page = viewer.get(reverse("admin:redisqueue_job", args=[backend.alias, result.id]))
    assert page.status_code == 200
    assert "in the outbox: committed, waiting for the relay" in page.text


@pytest.mark.parametrize(
    "value", [None, 1, "", [], ["default", "default"], ["default", 2], {"default": True}]
)
def test_a_wrong_outbox_setting_is_reported(value):
    problems = validate("x", {"OPTIONS": {"OUTBOX": value}})
    assert [p.code for p in problems] == ["E006"], problems
    assert "OUTBOX" in problems[0].msg


@pytest.mark.parametrize("value", ["nowhere", ["default", "nowhere"]])
def test_an_outbox_in_a_database_django_does_not_have_is_reported(value):
    """Found by the checks, not by every enqueue() and a runscheduler that exits."""
    problems = validate("x", {"OPTIONS": {"OUTBOX": value}})
    assert [p.code for p in problems] == ["E006"], problems
    assert "DATABASES has no 'nowhere'" in problems[0].hint


def test_the_backlog_counts_the_rows_and_the_oldest_age(backend, database):
    assert outbox.backlog([database], backend.alias) == outbox.Backlog(0, None)
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [waiting("c" * 26, 1)])
    backlog = outbox.backlog([database], backend.alias)
    assert backlog.jobs == 1 and backlog.age() >= 0
    assert outbox.backlog([database], "another").jobs == 0


def test_wait_blocks_on_a_job_in_the_outbox_until_it_runs(
    database, procs, every_database_in_children
):
    with private_redis() as server:
        backend = task_backends[f"outbox-{database}"]
        server.kill()
        with transaction.atomic(using=database):
            result = enqueue(backend, 20, 22)
        server.start()
        procs.start("runscheduler", "--backend", backend.alias)
        procs.start("runworker", "--backend", backend.alias)
        assert result.wait(timeout=30) == 42
        wait_until(lambda: rows(database) == [], 10, "the row to go")


def an_old_row(database, backend, seconds, now):
    """A committed row the relays left behind ``seconds`` before ``now``."""
    with transaction.atomic(using=database):
        outbox.write(database, backend.alias, [waiting("d" * 26, 1)])
    OutboxJob.objects.using(database).update(created_at=now - timedelta(seconds=seconds))


def test_the_overview_queuestats_metrics_and_probe_show_a_stuck_relay(r, viewer):
    backend = task_backends["outbox-default"]
    now = timezone.now()
    an_old_row("default", backend, 120, now)

    # The outbox's ages are by this host's clock (Django's timezone.now): pinned.
    with mock.patch.object(timezone, "now", return_value=now):
        page = viewer.get(reverse("admin:redisqueue_overview", args=[backend.alias])).text
        out = io.StringIO()
        call_command("queuestats", "--backend", backend.alias, "--json", stdout=out)
        exposition = metrics.render([backend])
        probe = ["queuehealth", "--backend", backend.alias, "--no-workers", "--no-scheduler"]
        with pytest.raises(SystemExit) as stuck:
            call_command(*probe, stdout=io.StringIO())
        call_command(*probe, "--max-outbox-age", "300", stdout=io.StringIO())  # exits 0
        call_command(*probe, "--max-outbox-age", "0", stdout=io.StringIO())  # no check
    assert (
        "<strong>1</strong> committed job waiting for the relay to Redis, the oldest for 120.0 s"
    ) in page
    assert json.loads(out.getvalue())["outbox"] == {"jobs": 1, "oldest_seconds": 120.0}
    assert 'redisqueue_outbox_jobs{backend="outbox-default"} 1' in exposition
    assert 'redisqueue_outbox_oldest_seconds{backend="outbox-default"} 120\n' in exposition
    assert stuck.value.code == OUTBOX_STUCK

    # Gone once relayed.
    assert backend.outbox.relay_left() == 1
    assert Dashboard(backend).overview()["outbox"] == {"jobs": 0, "oldest_seconds": 0.0}


def test_an_outbox_that_cannot_be_read_fails_the_probe_and_spares_the_overview(r):
    backend = task_backends["outbox-default"]
    broken = mock.patch.object(outbox, "backlog", side_effect=OperationalError("no such table"))
    with broken:
        assert Dashboard(backend).overview()["outbox"]["error"] == "no such table"
        out = io.StringIO()
        with pytest.raises(SystemExit) as failed:
            call_command("queuehealth", "--backend", backend.alias, "--no-workers",
                         "--no-scheduler", stdout=out)  # fmt: skip
        assert "outbox: cannot be read: OperationalError" in out.getvalue()
        exposition = metrics.render([backend])
        assert 'redisqueue_outbox_readable{backend="outbox-default"} 0' in exposition
        assert 'redisqueue_outbox_oldest_seconds{backend="outbox-default"} +Inf' in exposition
    assert failed.value.code == OUTBOX_STUCK


def test_a_batch_larger_than_a_database_packet_goes_through_the_outbox(backend, database):
    """Rows go in INSERTs that each fit a server's packet limit: a transaction of jobs
    of 400 KB each, half as much again as MariaDB's max_allowed_packet in all, commits,
    and every job reaches Redis (in one INSERT, MariaDB dropped the connection)."""
    packet = 16 << 20
    if connections[database].vendor == "mysql":
        with connections[database].cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            packet = cursor.fetchone()[0]
    argument = "x" * (400 * 1024)
    count = packet * 3 // 2 // len(argument) + 1
    with transaction.atomic(using=database):
        results = tasks.noop_any.using(backend=backend.alias).enqueue_many(
            [((argument,), {})] * count
        )
        assert len(rows(database)) == count
    assert rows(database) == []
    assert all(job_exists(backend, result.id) for result in results)
