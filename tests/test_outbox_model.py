"""The model-based test of the outbox: transactions that commit or roll back (a
savepoint among them), commits whose relay succeeds, is refused by Redis or never runs
(the process died between the commit and the relay), runscheduler's relay of what is
left (a batch at a time, oldest first), a relay that dies after storing and before
deleting, one refused by Redis, two relays at once (in order), and jobs that run and
whose results expire (so that a row relayed late finds nothing of its job but the
relay record); on SQLite and PostgreSQL (MariaDB has the fault test), against the
suite's real Redis.

A Python model keeps which jobs were committed, in what order, and which wait in the
outbox; after every step the database's rows and Redis's queue must be what it says:
every committed job in exactly one of the two (or, after a relay died between its
store and its delete, in both, until a relay deletes the row), no job of a rolled-back
transaction anywhere, each job stored once, however late its row is relayed again, and
a relay record for each job stored whose row remains (and, after runscheduler's sweep,
for no other)."""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import pytest
import redis
from django.db import connections, transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from django_redisqueue.backends import outbox
from django_redisqueue.backends.outbox import OutboxRelay
from django_redisqueue.compat import TaskResultDoesNotExist, TaskResultStatus, task_backends
from django_redisqueue.models import OutboxJob
from tests.conftest import not_on_cluster
from tests.support import tasks
from tests.support.outboxes import two_relays_at_once

DATABASES = ["default", "postgresql"]
EXAMPLES = int(os.environ.get("REDISQUEUE_OUTBOX_EXAMPLES", "60"))

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=DATABASES),
    pytest.mark.usefixtures("outbox_backends"),
    not_on_cluster,
]


class Undo(Exception):
    pass


class Died(Exception):
    """A relay's process, killed between storing the jobs and deleting their rows."""


class OutboxMachine(RuleBasedStateMachine):
    database: str
    r: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.backend = task_backends[f"outbox-{self.database}"]
        self.task = tasks.add.using(backend=self.backend.alias)
        self.committed: list[str] = []  # in commit order
        self.rolled_back: set[str] = set()
        self.rows: list[str] = []  # the outbox, oldest first
        self.stored: list[str] = []  # in the order they reached Redis: their queue's
        self.ran: set[str] = set()  # run, and their results expired

    def reach_redis(self, ids: list[str]) -> None:
        self.stored += [job_id for job_id in ids if job_id not in self.stored]

    @initialize()
    def empty(self) -> None:
        OutboxJob.objects.using(self.database).all().delete()
        self.r.flushall()

    def enqueue(self, jobs: int) -> list[str]:
        return [self.task.enqueue(n, n).id for n in range(jobs)]

    @rule(jobs=st.integers(1, 3), fate=st.sampled_from(["relayed", "refused", "died"]))
    def commit(self, jobs: int, fate: str) -> None:
        """A transaction commits; its relay stores the jobs, is refused by Redis, or
        never runs (the process died after the commit)."""
        if fate == "refused":
            failing = mock.patch.object(
                self.backend.broker, "enqueue", side_effect=redis.ConnectionError("down")
            )
        elif fate == "died":
            failing = mock.patch.object(OutboxRelay, "relay_committed")
        else:
            failing = contextlib.nullcontext()
        with failing, transaction.atomic(using=self.database):
            ids = self.enqueue(jobs)
        self.committed += ids
        if fate == "relayed":
            self.reach_redis(ids)
        else:
            self.rows += ids

    @rule(jobs=st.integers(1, 3))
    def roll_back(self, jobs: int) -> None:
        ids: list[str] = []
        with pytest.raises(Undo), transaction.atomic(using=self.database):
            ids += self.enqueue(jobs)
            raise Undo
        self.rolled_back |= set(ids)

    @rule(jobs=st.integers(1, 2))
    def roll_back_a_savepoint(self, jobs: int) -> None:
        """The savepoint's jobs go with it; the transaction's others commit."""
        with transaction.atomic(using=self.database):
            before = self.enqueue(jobs)
            inner: list[str] = []
            with pytest.raises(Undo), transaction.atomic(using=self.database):
                inner += self.enqueue(jobs)
                raise Undo
            after = self.enqueue(1)
        self.rolled_back |= set(inner)
        self.committed += before + after
        self.reach_redis(before + after)

    def relay_batch(self, batch: int) -> int:
        return outbox.relay(
            self.backend.broker, self.backend.alias, self.database, record_queues=False,
            batch=batch, settle=0,
        )  # fmt: skip

    @rule(batch=st.integers(1, 4))
    def relay(self, batch: int) -> None:
        """runscheduler's relay: the oldest rows, up to a batch."""
        assert self.relay_batch(batch) == min(batch, len(self.rows))
        self.reach_redis(self.rows[:batch])
        del self.rows[:batch]

    @rule(batch=st.integers(1, 4))
    def relay_dies_before_deleting(self, batch: int) -> None:
        """The jobs are stored, the rows stay (the transaction rolls back)."""
        if not self.rows:
            return
        with mock.patch.object(outbox, "_delete_rows", side_effect=Died), pytest.raises(Died):
            self.relay_batch(batch)
        self.reach_redis(self.rows[:batch])

    @rule()
    def relay_refused_by_redis(self) -> None:
        with mock.patch.object(
            self.backend.broker, "enqueue", side_effect=redis.ConnectionError("down")
        ):
            if self.rows:
                with pytest.raises(redis.ConnectionError):
                    self.relay_batch(10)
            else:
                assert self.relay_batch(10) == 0

    @rule(first=st.integers(1, 3))
    def two_relays_at_once(self, first: int) -> None:
        """The first holds ``first`` rows while the second relays: the second takes the
        others (SKIP LOCKED) or waits its turn (SQLite); each row is relayed once."""
        if not self.rows:
            return
        relayed = two_relays_at_once(
            self.backend, self.database, first, 10, skipping=lambda relayed: None
        )
        held = min(first, len(self.rows))
        # Where locked rows are skipped, the second leaves the step to the first, which
        # holds the oldest; elsewhere it waits for it, then relays the next ones.
        after = 0 if connections[self.database].features.has_select_for_update_skip_locked else 10
        second = min(after, len(self.rows) - held)
        assert relayed == {"first": held, "second": second}
        self.reach_redis(self.rows[: held + second])
        del self.rows[: held + second]

    @rule(count=st.integers(1, 3))
    def jobs_run_and_their_results_expire(self, count: int) -> None:
        """The oldest queued jobs run, and their results expire: their hashes go."""
        queue = self.backend.keys.queue("default")
        for job_id in self.r.zrange(queue, 0, count - 1):
            self.r.zrem(queue, job_id)
            self.r.delete(self.backend.keys.job(job_id))
            self.ran.add(job_id)

    @rule(batch=st.integers(1, 4))
    def a_row_is_relayed_again_after_its_job_ran_and_its_result_expired(self, batch: int) -> None:
        """The whole story in one step: a relay dies between its store and its delete,
        the jobs run and their results expire, and the rows are relayed again."""
        if self.rows:
            self.relay_dies_before_deleting(batch)
            self.jobs_run_and_their_results_expire(batch)
            self.relay(batch)

    @invariant()
    def the_outbox_holds_what_the_model_says(self) -> None:
        rows = OutboxJob.objects.using(self.database).order_by("id")
        assert list(rows.values_list("job_id", flat=True)) == self.rows

    @invariant()
    def redis_holds_each_stored_job_once_and_no_other(self) -> None:
        queued = self.r.zrange(self.backend.keys.queue("default"), 0, -1)
        # each once, first in first out, and never again once it ran
        assert queued == [job_id for job_id in self.stored if job_id not in self.ran]

    @rule()
    def sweep(self) -> None:
        """runscheduler's sweep: the relay records of deleted rows go."""
        assert outbox.sweep_records(self.backend.broker, [self.database], hold=0) == 0
        records = set(self.r.zrange(self.backend.keys.relayed, 0, -1))
        assert records == set(self.rows) & set(self.stored)

    @invariant()
    def a_relay_record_stands_for_each_job_stored_whose_row_remains(self) -> None:
        records = set(self.r.zrange(self.backend.keys.relayed, 0, -1))
        assert records >= set(self.rows) & set(self.stored)

    @invariant()
    def every_committed_job_is_somewhere_and_no_rolled_back_one(self) -> None:
        assert set(self.committed) == set(self.stored) | set(self.rows)
        assert not self.rolled_back & (set(self.stored) | set(self.rows))
        for job_id in self.committed[-3:]:  # found by its id wherever it is
            if job_id not in self.ran or job_id in self.rows:
                assert self.backend.get_result(job_id).status == TaskResultStatus.READY
        for job_id in list(self.rolled_back)[:3]:
            with pytest.raises(TaskResultDoesNotExist):
                self.backend.get_result(job_id)


@pytest.mark.parametrize("database", DATABASES)
def test_the_outbox_follows_its_model(database, r):
    OutboxMachine.database = database
    OutboxMachine.r = r
    machine = OutboxMachine.TestCase
    machine.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine().runTest()
