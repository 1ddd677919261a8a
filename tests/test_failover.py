"""The kill-chaos workload across a Redis failover: under Sentinel (a master, a replica,
three Sentinels) and on a Redis Cluster (3 masters, 3 replicas), with and without
REPLICA_ACKS. Workers are SIGKILLed at random while a producer enqueues; in the middle
the master holding the jobs is SIGKILLed and its replica promoted.

Each run reports what was acknowledged, refused, lost and run twice, and the time from
the master's death to the first job started on the new one. Jobs append their number
to a ledger on a Redis of their own (the suite's), which no failover touches.

On loopback a replica keeps up with its master within a fraction of a millisecond, so
even without REPLICA_ACKS a failover here seldom loses a write; what a replica that
falls behind loses, and what REPLICA_ACKS keeps, is shown deterministically in
tests/test_replication.py.
"""

import contextlib
import json
import os
import random
import threading
import time
from collections import Counter

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.exceptions import BrokerUnavailable
from tests.conftest import not_on_cluster, wait_until
from tests.support import tasks
from tests.support.topologies import RedisClusterGroup, RedisSentinelGroup

pytestmark = [pytest.mark.failover, not_on_cluster]

BACKEND = ("--backend", "failover")
JOBS = 1200  # enqueued over about 6 s, the master killed after about 2 s
WORKERS = 3
FAILOVER_AT = 2.0  # seconds into the run


@contextlib.contextmanager
def failover_backend(options):
    """The ``failover`` backend (tests/support/settings.py) with ``options``, here and in the
    processes the test starts."""
    os.environ["REDISQUEUE_TEST_FAILOVER"] = json.dumps(options)
    tasks_setting = {
        **settings.TASKS,
        "failover": {
            "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
            "QUEUES": ["default"],
            "OPTIONS": options,
        },
    }
    try:
        with override_settings(TASKS=tasks_setting):
            yield task_backends["failover"]
    finally:
        del os.environ["REDISQUEUE_TEST_FAILOVER"]


class Producer(threading.Thread):
    """Enqueues JOBS ledger jobs at a steady pace; an enqueue that raises is refused and
    not retried (a caller would retry it with a new id)."""

    def __init__(self, ledger_url: str) -> None:
        super().__init__(daemon=True)
        self.ledger_url = ledger_url
        self.acknowledged: dict[int, str] = {}  # job number -> job id
        self.refused = 0

    def run(self) -> None:
        for i in range(JOBS):
            try:
                job = tasks.ledger_at.using(backend="failover").enqueue(self.ledger_url, i, 3)
                self.acknowledged[i] = job.id
            except BrokerUnavailable:
                self.refused += 1
            time.sleep(0.005)  # the producer's pace, not a wait for a condition


def common_options(acks):
    # Short leases bring killed workers' jobs back quickly.
    return {"LEASE": 2, "MAX_RECOVERIES": 10, "REPLICA_ACKS": acks, "REPLICA_ACKS_TIMEOUT": 0.5}


# REPLICA_ACKS=1 runs with two replicas per master, as it should be deployed: once one
# is promoted, the other still confirms writes (with none left, every write would wait
# REPLICA_ACKS_TIMEOUT for nothing, and every enqueue would be refused).


@contextlib.contextmanager
def sentinel_topology(acks):
    with RedisSentinelGroup(replicas=1 + acks) as group:
        options = {
            "SENTINELS": group.sentinel_addresses,
            "SERVICE_NAME": group.service_name,
            **common_options(acks),
        }

        def fail_over() -> None:
            old = group.kill_master()
            group.wait_for_failover(old.address)

        yield options, fail_over


@contextlib.contextmanager
def cluster_topology(acks):
    with RedisClusterGroup(replicas_per_master=1 + acks) as group:
        # Every node, as a deployment lists them: the one a URL names may be the one killed.
        nodes = [node.address for node in group.nodes]
        options = {"CLUSTER_NODES": nodes, **common_options(acks)}

        def fail_over() -> None:
            master = group.master_for_key("{drq:failover}:")
            group.kill(master)
            group.wait_for_failover(master)

        yield options, fail_over


TOPOLOGIES = {"sentinel": sentinel_topology, "cluster": cluster_topology}


@pytest.mark.parametrize("acks", [0, 1], ids=["no-acks", "acks-1"])
@pytest.mark.parametrize("topology", ["sentinel", "cluster"])
def test_kill_chaos_across_a_failover(r, redis_server, procs, report, topology, acks):
    with TOPOLOGIES[topology](acks) as (options, fail_over), failover_backend(options) as backend:
        ledger = redis.Redis.from_url(redis_server.url, decode_responses=True)
        scheduler = procs.start("runscheduler", *BACKEND)
        workers = [procs.start("runworker", *BACKEND) for _ in range(WORKERS)]
        producer = Producer(redis_server.url)
        started = time.monotonic()
        producer.start()
        rng = random.Random(11)
        kills, killed_at, failover_took = 0, None, None
        while producer.is_alive():
            time.sleep(0.4)  # the pace of the chaos, not a wait for a condition
            victim = rng.randrange(WORKERS)
            procs.kill(workers[victim])
            kills += 1
            workers[victim] = procs.start("runworker", *BACKEND)
            if killed_at is None and time.monotonic() - started > FAILOVER_AT:
                killed_at = time.time()
                fail_over()
                failover_took = time.time() - killed_at
        assert killed_at is not None, "the producer finished before the failover"
        acknowledged = producer.acknowledged

        def drained():
            """Nothing left to run: no job waits, is delayed, runs, or was handed to a
            worker (killed before it took the job: the tick gives it back)."""
            counts = backend.queries.counts(["default"])["default"]
            queries = backend.queries
            held = queries.running_count() or queries.size(backend.keys.handed)
            return not (counts.ready or counts.delayed or held)

        # Every acknowledged job runs, or there is nothing left that could run it (lost).
        wait_until(
            lambda: (
                set(acknowledged) <= set(map(int, ledger.lrange("test:ledger", 0, -1)))
                or drained()
            ),
            120,
            "every acknowledged job to run, or nothing left to run",
        )
        # Nothing the new master holds is stuck: it runs everything it has.
        try:
            wait_until(drained, 60, "the new master to run every job it holds")
        except AssertionError as stuck:
            counts = backend.queries.counts(["default"])["default"]
            running = backend.queries.running_count()
            state = "was running" if scheduler.poll() is None else "had ended"
            output = procs.stop(scheduler)[-4000:]
            raise AssertionError(
                f"{stuck}: {counts}, {running} running; the scheduler {state}; "
                f"its last output:\n{output}"
            ) from None
        ran = Counter(map(int, ledger.lrange("test:ledger", 0, -1)))
        lost = sorted(set(acknowledged) - set(ran))
        twice = sum(n - 1 for n in ran.values() if n > 1)
        starts = [
            result.started_at.timestamp()
            for result in map(backend.get_result, acknowledged.values())
            if result.status == TaskResultStatus.SUCCESSFUL
            and result.started_at.timestamp() > killed_at
        ]
        assert starts, "no acknowledged job started on the new master"
        resumed = min(starts) - killed_at
        report(
            f"failover chaos, {topology}, REPLICA_ACKS={acks}: {len(acknowledged)} enqueues "
            f"acknowledged, {producer.refused} refused; lost {len(lost)}, run twice {twice} "
            f"({kills} worker kills); failover {failover_took:.2f} s, first job started "
            f"on the new master {resumed:.2f} s after the old one died"
        )
        # The scheduler lived through it all: it stepped on the new master after the old
        # one died (whether it saw an error depends on when the master died: the client
        # may have reconnected between two of its steps), and stops cleanly.
        wait_until(
            lambda: any(
                seen / 1000 > killed_at
                for _, seen in backend.queries.alive(backend.keys.schedulers)
            ),
            30,
            "the scheduler to step on the new master",
        )
        assert scheduler.poll() is None, "the scheduler died"
        assert "stopped" in procs.stop(scheduler)
        # Enough acknowledged enqueues to judge by. How many are refused depends on how
        # long the failover and the replicas' resync take beside the producer's pace
        # (over half of them, once); a tenth is acknowledged before the master dies.
        assert len(acknowledged) >= JOBS / 10, producer.refused
        if acks:
            assert lost == [], "acknowledged enqueues lost despite REPLICA_ACKS"

        assert twice <= kills + WORKERS  # at least once: killed workers' jobs run again


@pytest.mark.django_db
def test_a_django_redis_sentinel_cache_serves_the_backend_across_a_failover(r, caplog):
    """CONNECTION names a django-redis cache that uses Sentinel: enqueue, the worker,
    wait() and the dashboard all follow the promoted replica, and the worker logs the
    switch once, naming the new master."""
    from django.contrib.auth.models import User
    from django.test import Client

    with RedisSentinelGroup(replicas=1) as group:
        cache = {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{group.service_name}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": group.sentinel_addresses,
            },
        }
        tasks_setting = {
            "default": {
                "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
                "QUEUES": ["default"],
                "OPTIONS": {"CONNECTION": "sentinel"},
            }
        }
        caches = {**settings.CACHES, "sentinel": cache}
        with override_settings(CACHES=caches, TASKS=tasks_setting), worker_thread() as worker:
            backend = task_backends["default"]
            first = tasks.add.enqueue(1, 2)
            assert first.wait(timeout=5) == 3
            group.sync_replicas()

            with caplog.at_level("WARNING", logger="django_redisqueue"):
                old = group.kill_master()
                with pytest.raises(BrokerUnavailable):
                    tasks.add.enqueue(2, 2)  # no master yet: refused at the call site
                new_address = group.wait_for_failover(old.address)
                second = tasks.add.enqueue(2, 3)
                assert second.wait(timeout=10) == 5  # wait() and the worker followed
            assert backend.get_result(first.id).return_value == 3  # the replica had it
            where = f"master {new_address[0]}:{new_address[1]}"
            assert backend.broker.describe().endswith(where)
            switches = [
                record.message
                for record in caplog.records
                if record.name == "django_redisqueue.runtime.worker"
                and "reachable again" in record.message
            ]
            assert len(switches) == 1 and where in switches[0], switches
            assert worker.jobs_done == 2

            staff = User.objects.create_superuser("op", password="pw")
            client = Client()
            client.force_login(staff)
            page = client.get("/admin/django_redisqueue/dashboard/default/")
            assert page.status_code == 200
            assert "Worker" in page.text


@contextlib.contextmanager
def worker_thread():
    """A worker of the default backend running in a thread of this process."""
    from unittest import mock

    from django_redisqueue.compat import task_backends
    from django_redisqueue.runtime.worker import Worker

    with mock.patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker = Worker(task_backends["default"])
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            yield worker
        finally:
            worker.stopping = True
            thread.join(timeout=15)


def role(client) -> str | None:
    """A server's role, or None while it drops its clients (as a master made a replica
    does): the poll asks again."""
    try:
        return client.execute_command("ROLE")[0]
    except redis.ConnectionError:
        return None


def test_a_master_demoted_in_place_answers_readonly_and_the_worker_moves_on(r):
    """A failover that keeps the old master alive (SENTINEL FAILOVER, or a master back
    from a partition): it is made a replica and answers READONLY on the worker's open
    connections; redis-py's Sentinel pool then asks the Sentinels again."""
    with RedisSentinelGroup(replicas=1) as group:
        options = {"SENTINELS": group.sentinel_addresses, "SERVICE_NAME": group.service_name}
        tasks_setting = {
            "default": {
                "BACKEND": "django_redisqueue.backend.RedisQueueBackend",
                "QUEUES": ["default"],
                "OPTIONS": options,
            }
        }
        with override_settings(TASKS=tasks_setting), worker_thread() as worker:
            first = tasks.add.enqueue(1, 1)
            assert first.wait(timeout=5) == 2
            old = group.master
            sentinel = group.client(group.sentinels[0])
            sentinel.execute_command("SENTINEL", "FAILOVER", group.service_name)
            group.wait_for_failover(old.address)
            wait_until(
                lambda: role(group.client(old)) == "slave",
                30,
                "the old master to become a replica",
            )
            second = tasks.add.enqueue(2, 2)
            assert second.wait(timeout=10) == 4
            assert worker.jobs_done == 2


def test_before_any_cluster_node_answers_workers_wait_and_enqueue_raises(procs):
    from tests.support.servers import free_port

    options = {"CLUSTER_NODES": [("127.0.0.1", free_port())]}  # nothing listens there
    with failover_backend(options):
        with pytest.raises(BrokerUnavailable, match="Redis did not answer"):
            tasks.add.using(backend="failover").enqueue(1, 2)
        worker = procs.start("runworker", *BACKEND)
        procs.expect(worker, "Backend 'failover': Redis unreachable (RedisClusterException")
        procs.expect(worker, "retry 2 in")  # waiting, not crashed
        assert worker.poll() is None


def test_a_long_lived_broker_calls_its_scripts_on_the_new_master_after_one_error():
    """A scheduler's broker, which called scripts before the master of its slot died,
    reaches the promoted replica at its next call but one: the failed call has the slot
    map reloaded. (A cluster client sent an FCALL through the node it asks for command
    keys, and kept sending it to that node once it was gone.)"""
    with RedisClusterGroup(replicas_per_master=1) as group:
        options = {"CLUSTER_NODES": [node.address for node in group.nodes]}
        with failover_backend(options) as backend:
            broker = backend.broker
            job = tasks.add.using(backend="failover").enqueue(1, 2)
            master = group.master_for_key("{drq:failover}:")
            assert redis.Redis(port=master.port).wait(1, 10_000) == 1  # the replica has it
            group.kill(master)
            group.wait_for_failover(master)
            with pytest.raises(redis.RedisError):
                broker.claim(["default"], "w1")
            _, claimed = broker.claim(["default"], "w1")
            assert claimed is not None and claimed.job_id == job.id
