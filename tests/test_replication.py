"""REPLICA_ACKS: enqueue and every job move wait for replicas (WAIT) on the connection
that wrote. Each test runs a private master and a replica that replicates through a
proxy (tests/support/proxy.py). A replica frozen with SIGSTOP confirms nothing, so a write that
really waits for it can be told from one that does not; a replication stream held by
the proxy when the master dies is lost with it, as across a real failover.
"""

import logging
import os
import signal
from contextlib import contextmanager
from unittest import mock

import pytest
import redis
from django.db import transaction
from django.test import override_settings

from django_redisqueue.backends import outbox
from django_redisqueue.backends.outbox import OutboxRelay
from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.exceptions import BrokerUnavailable
from django_redisqueue.models import OutboxJob
from django_redisqueue.store.calls import NotReplicated
from django_redisqueue.store.queries import Queries
from tests.conftest import not_on_cluster, run_worker_here, use_redis, wait_until
from tests.support import tasks
from tests.support.proxy import LinkProxy
from tests.support.servers import RedisServer

pytestmark = not_on_cluster  # a pair of servers of its own


@pytest.fixture
def link():
    return {}


@pytest.fixture
def pair(link):
    """A master and its replica, in sync; every backend uses the master. The replica
    replicates through ``link["proxy"]``."""
    master = RedisServer("--repl-diskless-sync-delay", "0")  # the replica syncs at once
    master.start()
    link["proxy"] = proxy = LinkProxy(master.port)
    replica = RedisServer("--replicaof", "127.0.0.1", str(proxy.port))
    replica.start()
    try:
        info = redis.Redis(port=replica.port)
        wait_until(
            lambda: info.info("replication")["master_link_status"] == "up", 10, "the replica"
        )
        with use_redis(master.url):
            yield master, replica
    finally:
        replica.stop()
        proxy.close()
        master.stop()


# Seconds WAIT may take: ample where the replica is expected to confirm (WAIT returns as
# soon as it does, however busy the host), short where no replica can.
CONFIRMED_WITHIN = 10.0
NOT_CONFIRMED_WITHIN = 0.3


@contextmanager
def acked_backend(acks: int, timeout: float = CONFIRMED_WITHIN, alias="default", **options):
    from django.conf import settings

    tasks_setting = {alias: dict(conf) for alias, conf in settings.TASKS.items()}
    tasks_setting[alias]["OPTIONS"] = {
        **tasks_setting[alias]["OPTIONS"],
        "REPLICA_ACKS": acks,
        "REPLICA_ACKS_TIMEOUT": timeout,
        **options,
    }
    with override_settings(TASKS=tasks_setting):
        yield task_backends[alias]


@contextmanager
def frozen(server: RedisServer):
    """The server's process stopped (SIGSTOP): it answers nothing, and replicates nothing."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def test_an_acked_enqueue_is_on_the_replica_when_it_returns(pair):
    _, replica = pair
    on_replica = redis.Redis(port=replica.port, decode_responses=True)
    with acked_backend(1) as backend:
        results = tasks.add.enqueue_many([((i, i), {}) for i in range(2500)])  # 3 calls
        # The replica holds every job the moment enqueue returns: no wait here.
        ids = [result.id for result in results]
        on_replica_jobs = Queries(on_replica, backend.keys, result_ttl=60).jobs(ids, "status")
        assert on_replica_jobs == [{"status": "READY"}] * len(ids)


def test_an_enqueue_no_replica_confirms_raises_at_the_call_site(pair):
    _, replica = pair
    with acked_backend(1, NOT_CONFIRMED_WITHIN) as backend, frozen(replica):
        with pytest.raises(BrokerUnavailable, match=r"not safely.*0 of the 1 replica"):
            tasks.add.enqueue(1, 2)
        # The master has it: it runs, unless the master fails before the replica has it.
        assert backend.queries.queue_length("default") == 1


def test_without_replica_acks_nothing_waits_for_a_frozen_replica(pair):
    _, replica = pair
    with acked_backend(0), frozen(replica):
        assert tasks.add.enqueue(1, 2).status == TaskResultStatus.READY


def test_more_acks_than_replicas_never_passes(pair):
    # The one replica confirms, unless a loaded host makes it miss the short WAIT.
    with (
        acked_backend(2, NOT_CONFIRMED_WITHIN),
        pytest.raises(BrokerUnavailable, match=r"[01] of the 2 replica"),
    ):
        tasks.add.enqueue(1, 2)


def test_the_worker_runs_and_stores_jobs_a_replica_does_not_confirm(pair, caplog):
    _, replica = pair
    with acked_backend(1):
        jobs = [tasks.add.enqueue(2, i) for i in range(3)]
    with acked_backend(1, NOT_CONFIRMED_WITHIN) as backend:
        with frozen(replica), caplog.at_level(logging.WARNING):
            worker = run_worker_here(backend)
        assert [job.wait(timeout=5) for job in jobs] == [2, 3, 4]
    warnings = [r.message for r in caplog.records if r.name == "django_redisqueue.store.calls"]
    # One line says that writes may be lost with the master (not one per write): the
    # three claims, each with the finish of the job before, and the last finish. The
    # loop's own connection counts with the backend's: one count, one warning clock.
    assert len(warnings) == 1
    assert "0 of the 1 replica(s)" in warnings[0]
    assert worker.broker.unreplicated is backend.broker.unreplicated
    assert backend.broker.unreplicated.count == 4 - 1


def test_acked_writes_survive_losing_the_master(pair):
    """Promote the replica at once after the writes, as a failover would: every job an
    acked enqueue returned, and every outcome an acked finish stored, is there."""
    master, replica = pair
    with acked_backend(1) as backend:
        done = tasks.add.enqueue(1, 1)
        run_worker_here(backend)
        waiting = tasks.add.enqueue_many([((i, 1), {}) for i in range(500)])
    master.kill()
    promoted = redis.Redis(port=replica.port)
    promoted.replicaof("NO", "ONE")
    with use_redis(replica.url):
        backend = task_backends["default"]
        assert backend.get_result(done.id).status == TaskResultStatus.SUCCESSFUL
        assert backend.queries.queue_length("default") == len(waiting)


def caught_up(master: RedisServer, replica: RedisServer) -> None:
    """Wait until the replica has processed everything the master has written."""
    offset = redis.Redis(port=master.port).info("replication")["master_repl_offset"]
    on_replica = redis.Redis(port=replica.port)
    wait_until(
        lambda: on_replica.info("replication")["slave_repl_offset"] >= offset,
        10,
        "the replica to catch up",
    )


def fail_over(master: RedisServer, replica: RedisServer, proxy: LinkProxy) -> None:
    """The master dies with the replication stream it had not delivered; the replica
    is made master, as Sentinel would."""
    master.kill()
    proxy.cut()
    redis.Redis(port=replica.port).replicaof("NO", "ONE")


@pytest.mark.parametrize("acks", [0, 1])
def test_what_a_failover_loses_of_acknowledged_enqueues(pair, link, acks, report):
    master, replica = pair
    proxy = link["proxy"]
    acknowledged, refused = [], 0
    with acked_backend(acks, timeout=0.05):
        for i in range(20):
            if i == 10:
                caught_up(master, replica)
                proxy.hold()  # the replica falls behind from here on
            try:
                acknowledged.append(tasks.add.enqueue(i, i).id)
            except BrokerUnavailable:
                refused += 1
    fail_over(master, replica, proxy)
    with use_redis(replica.url):
        backend = task_backends["default"]
        lost = [job_id for job_id in acknowledged if not backend.queries.get_job(job_id)]
    report(
        f"failover, REPLICA_ACKS={acks}: {len(acknowledged)} enqueues acknowledged, "
        f"{refused} refused, {len(lost)} acknowledged lost"
    )
    if acks:
        assert (len(acknowledged), refused, lost) == (10, 10, [])
    else:  # the ten made while the replica was behind were acknowledged, and are gone
        assert (len(acknowledged), refused, len(lost)) == (20, 0, 10)


@pytest.mark.django_db(transaction=True)
def test_outbox_rows_no_replica_confirms_stay_and_their_jobs_run_once(pair):
    """REPLICA_ACKS with the replica down: the commit's relay stores the jobs on the
    master and keeps the rows; runscheduler relays them again and again, also after the
    jobs ran and their results expired, and stores nothing; once the replica confirms,
    the rows go, and so do their relay records. (Before the records, ten jobs ran 49
    times in 20 s so.)"""
    _, replica = pair
    ledger = tasks.client()
    ledger.delete("test:ledger")
    with (
        acked_backend(1, NOT_CONFIRMED_WITHIN, alias="outbox-default", RESULT_TTL=1) as backend,
        frozen(replica),
    ):
        with transaction.atomic():
            jobs = [tasks.ledger.using(backend=backend.alias).enqueue(i, 0) for i in range(3)]
        rows = OutboxJob.objects.filter(job_id__in=[job.id for job in jobs])
        assert rows.count() == 3  # the master holds the jobs; no replica confirmed them
        run_worker_here(backend)
        keys = [backend.keys.job(job.id) for job in jobs]
        wait_until(lambda: not ledger.exists(*keys), 10, "the results to expire")
        for _ in range(2):
            with pytest.raises(NotReplicated):
                outbox.relay(
                    backend.broker, backend.alias, "default", record_queues=False, settle=0
                )
            assert rows.count() == 3
        run_worker_here(backend)
    with acked_backend(1, alias="outbox-default") as backend:
        assert (
            outbox.relay(backend.broker, backend.alias, "default", record_queues=False, settle=0)
            == 3
        )
        assert not rows.exists()
        assert outbox.sweep_records(backend.broker, ["default"], hold=0) == 0
        assert not ledger.exists(backend.keys.relayed)
    assert sorted(ledger.lrange("test:ledger", 0, -1)) == ["0", "1", "2"]


@pytest.mark.django_db(transaction=True)
def test_an_unconfirmed_relay_still_stores_each_job_right_after_the_one_it_waits_for(pair):
    """runscheduler relays a job and one that runs after it, with no replica confirming:
    both are stored in that relay (the second waiting for the first), so a later relay,
    after the first's result expired, does not find the second's job missing."""
    _, replica = pair
    ledger = tasks.client()
    ledger.delete("test:ledger")
    with acked_backend(1, NOT_CONFIRMED_WITHIN, alias="outbox-default") as backend:
        task = tasks.ledger.using(backend=backend.alias)
        died = mock.patch.object(OutboxRelay, "relay_committed")  # the producer died
        with frozen(replica):
            with died, transaction.atomic():
                first = task.enqueue(1, 0)
                then = task.using(depends_on=first.id).enqueue(2, 0)
            with pytest.raises(NotReplicated):
                outbox.relay(
                    backend.broker, backend.alias, "default", record_queues=False, settle=0
                )
            assert ledger.exists(backend.keys.job(first.id), backend.keys.job(then.id)) == 2
            run_worker_here(backend)
    assert ledger.lrange("test:ledger", 0, -1) == ["1", "2"]
