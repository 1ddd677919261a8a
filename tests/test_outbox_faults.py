"""The outbox's promise under faults, on SQLite, PostgreSQL and MariaDB: a producer
(``tests/support/management/commands/outbox_produce.py``, a view's work in a process of its
own) commits 1,000 jobs, a tenth of them in transactions that roll back, while Redis
is stopped, out of memory and read-only (a master demoted in a failover), and while
the producer and runscheduler, the two relays, are SIGKILLed. Every committed job
runs, once; no job of a rolled-back transaction runs; the outboxes end empty.

The jobs append their number to a ledger on the suite's own Redis, which no fault
touches; the producer commits a row of that number with each job, so the database
says which jobs were committed."""

import subprocess
import sys
from collections import Counter

import pytest
import redis
from django.db.models import Max

from django_redisqueue.models import OutboxJob
from tests.conftest import ROOT, child_env, not_on_cluster, private_redis, wait_until
from tests.support.models import Committed
from tests.support.servers import free_port

DATABASES = ["default", "postgresql", "mariadb"]
PHASE = 200  # jobs each fault sees

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=DATABASES),
    pytest.mark.usefixtures("outbox_backends"),
    not_on_cluster,
]


def produce(alias: str, first: int, count: int, ledger_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "outbox_produce", alias, str(first), str(count),
         ledger_url],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("database", DATABASES)
def test_every_committed_job_runs_once_whatever_redis_and_the_relays_go_through(
    database, procs, r, redis_server, report, every_database_in_children
):
    alias = f"outbox-{database}"
    ledger_url = redis_server.url
    committed = Committed.objects.using(database)

    def ran() -> list[int]:
        return [int(n) for n in r.lrange("test:ledger", 0, -1)]

    def all_ran() -> bool:
        return set(ran()) >= set(committed.values_list("number", flat=True))

    with private_redis("--appendonly", "yes", "--appendfsync", "always") as server:
        admin = redis.Redis.from_url(server.url)
        scheduler = procs.start("runscheduler", "--backend", alias)
        procs.start("runworker", "--backend", alias)

        produce(alias, 0, PHASE, ledger_url)  # nothing wrong
        wait_until(all_ran, 60, "the first jobs to run")

        server.kill()  # Redis stopped: every commit's relay fails
        produce(alias, PHASE, PHASE, ledger_url)
        assert OutboxJob.objects.using(database).count() == PHASE * 9 // 10
        server.start()
        wait_until(all_ran, 60, "the jobs committed while Redis was stopped")

        used = admin.info("memory")["used_memory"]
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", used // 2)  # out of memory: every write refused
        try:
            produce(alias, 2 * PHASE, PHASE, ledger_url)
        finally:
            admin.config_set("maxmemory", 0)
        wait_until(all_ran, 60, "the jobs committed while Redis was out of memory")

        admin.replicaof("127.0.0.1", free_port())  # demoted: READONLY to every write
        try:
            produce(alias, 3 * PHASE, PHASE, ledger_url)
        finally:
            admin.replicaof("NO", "ONE")
        wait_until(all_ran, 60, "the jobs committed while Redis was read-only")

        # The relays killed: the producer mid-run (a transaction in flight rolls back;
        # one committed may not be relayed yet), runscheduler while it may relay.
        killed = procs.start("outbox_produce", alias, str(4 * PHASE), str(PHASE), ledger_url)
        wait_until(lambda: committed.filter(number__gte=4 * PHASE).count() >= PHASE // 4, 60,
                   "the producer to commit")  # fmt: skip
        procs.kill(scheduler)
        procs.kill(killed)
        scheduler = procs.start("runscheduler", "--backend", alias)
        # Past the last number the killed producer committed, however far it got.
        after_kill = committed.aggregate(last=Max("number"))["last"] + 1
        produce(alias, after_kill, PHASE // 2, ledger_url)
        wait_until(all_ran, 60, "the jobs committed around the kills")
        wait_until(lambda: not OutboxJob.objects.using(database).exists(), 30, "no row left")

    runs = Counter(ran())
    numbers = set(committed.values_list("number", flat=True))
    twice = sorted(n for n, count in runs.items() if count > 1)
    rolled_back = sorted(runs.keys() - numbers)
    report(
        f"outbox faults ({database}): committed={len(numbers)} ran={len(runs)} "
        f"twice={len(twice)} rolled back but ran={len(rolled_back)}"
    )
    assert len(numbers) >= 4 * PHASE * 9 // 10
    assert runs.keys() >= numbers
    assert not twice, twice[:10]
    assert not rolled_back, rolled_back[:10]
