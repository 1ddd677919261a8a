"""The outbox's relay records (docs/protocol.md, "The outbox's relay"), with time in
them: outbox relays store jobs, recording each id; a finished job's result expires (its
hash and done list go, as their TTL would make them); a row is relayed again, whatever
became of its job (running, finished, its result expired), and stores nothing; the
relay that deleted a row forgets its record. After every step the records are the ids
the model says. Without the records, a row relayed after its job's result expired
stores the job again, and the model's places no longer match Redis."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from django_redisqueue.core.jobs import SUCCESSFUL
from django_redisqueue.store.wire import MissingJob, NewJob
from tests.support import tasks
from tests.support.model.harness import RUN, snapshot
from tests.support.model.protocol.records import (
    DELAYS,
    DELETED,
    FINISHED,
    QUEUES,
    UNKNOWN_ID,
    Spec,
)
from tests.support.model.protocol.strategies import JOB_QUEUE, PICK, PRIORITY, WORKER


class RelayModel:
    """Relays of outbox rows, and results that expire."""

    def init_relays(self) -> None:
        self.relay_records: set[str] = set()  # the ids in {P}:relayed

    @rule(
        batch=st.lists(
            st.tuples(JOB_QUEUE, PRIORITY, st.sampled_from(list(DELAYS))), min_size=1, max_size=3
        )
    )
    def relay_outbox_rows(self, batch):
        """A relay stores an outbox's jobs: as any enqueue call, each id recorded."""
        ids = self.op_enqueue_batch([(q, p, DELAYS[d]) for q, p, d in batch], relayed=True)
        self.relay_records |= set(ids)

    @rule(pick=PICK, linked=st.booleans(), recorded=st.booleans())
    def relay_a_row_again(self, pick, linked, recorded):
        """A row relayed again (its delete failed, its process died, too few replicas
        confirmed the store), whatever its job became. A job stored before records
        were kept (taken id, no record) gets one. ``recorded``: a row relayed before,
        else any job."""
        live = {j.id for j in self.jobs.values() if j.place != DELETED}
        chosen = self.relay_records if recorded else self.relay_records | live
        job_id = self.pick(sorted(chosen), pick)
        if job_id is not None:
            self.relay_again(job_id, linked)

    @rule(pick=PICK, recorded=st.booleans())
    def a_result_expires(self, pick, recorded):
        """A finished job's result TTL passes. ``recorded``: one relayed from an
        outbox, if any."""
        ended = [j for j in self.job_list(FINISHED) if self.may_expire(j)]
        if recorded and any(j.id in self.relay_records for j in ended):
            ended = [j for j in ended if j.id in self.relay_records]
        job = self.pick(ended, pick)
        if job is not None:
            self.expire(job)

    @rule(worker=WORKER, priority=PRIORITY, linked=st.booleans())
    def a_row_is_relayed_after_its_job_ran_and_its_result_expired(self, worker, priority, linked):
        """The whole story in one step: a relay stores a job, a worker runs it, its
        result expires, the row is relayed again (it was never deleted)."""
        [job_id] = self.op_enqueue_batch([("default", priority, None)], relayed=True)
        self.relay_records.add(job_id)
        self.work_until_idle(worker, QUEUES, SUCCESSFUL)
        job = self.jobs[job_id]
        if job.place == FINISHED and self.may_expire(job):
            self.expire(job)
            self.relay_again(job_id, linked)

    def may_expire(self, job) -> bool:
        """Jobs of a group, with a unique key or in a failed index keep their hash
        here: their records expire with the group's, the key's, the index's."""
        return job.status == SUCCESSFUL and job.group is None and not job.unique

    def expire(self, job) -> None:
        """A finished job's result TTL passes: its hash and done list go."""
        self.r.delete(self.keys.job(job.id), self.keys.done(job.id))
        job.place, job.done = DELETED, []
        RUN["results expired"] += 1

    def relay_again(self, job_id: str, linked: bool) -> None:
        """The relay of a job relayed before: nothing changes but the record's time,
        also through the linked enqueue, whose look for a job to run after is skipped
        (it may be long gone)."""
        before = snapshot(self.r, skip=(self.keys.relayed,))
        payload = self.backend.prepare(tasks.noop, (), {})._payload
        if linked:
            job = NewJob(job_id, "low", 5, payload, 0, UNKNOWN_ID)
            reply = self.broker.enqueue_linked([job], relayed=True)
        else:
            reply = self.broker.enqueue([NewJob(job_id, "low", 5, payload)], relayed=True)
        assert reply == [None], f"a row relayed again stored its job: {reply}"
        assert snapshot(self.r, skip=(self.keys.relayed,)) == before
        if self.jobs[job_id].place == DELETED:
            RUN["rows relayed after their result expired"] += 1
        self.relay_records.add(job_id)

    @rule(pick=PICK, priority=PRIORITY)
    def a_relay_sends_a_job_relayed_before_and_one_that_runs_after_it(self, pick, priority):
        """One linked call of a relay: a row relayed before (its job in any state, its
        result perhaps expired), then a new job that runs after it. The first stores
        nothing; the second waits for it, runs at once after a success, fails after a
        failure; if the first's result expired, nothing at all is stored (MissingJob):
        it is never left waiting for a job that is gone."""
        first = self.pick(sorted(self.relay_records), pick)
        if first is None:
            return
        then = self.backend.prepare(tasks.noop, (), {})
        jobs = [
            NewJob(first, "low", 5, then._payload),
            NewJob(then.id, "default", priority, then._payload, 0, first),
        ]
        before = snapshot(self.r)
        gone = first not in self.jobs or self.jobs[first].place == DELETED
        t0 = self.clock()
        try:
            enqueued = self.broker.enqueue_linked(jobs, relayed=True)
        except MissingJob as exc:
            assert gone and exc.job_id == first, f"MissingJob({exc.job_id}) for {first}"
            assert snapshot(self.r) == before, "a refused relay stored something"
            RUN["relays refused: the job waited for is gone"] += 1
            return
        assert not gone, f"{then.id} was stored after {first}, whose result expired"
        t1 = self.clock()
        assert enqueued[0] is None and enqueued[1] is not None, enqueued
        self.m_enqueue_linked([Spec(then.id, "default", priority, 0, first)], "", (t0, t1))
        self.relay_records |= {first, then.id}
        RUN["relays run after a job relayed before"] += 1

    @rule(picks=st.lists(PICK, min_size=1, max_size=3))
    def relayed_rows_deleted(self, picks):
        """The relay deleted the rows: it drops their records."""
        records = sorted(self.relay_records)
        ids = sorted({self.pick(records, p) for p in picks} - {None})
        self.broker.forget_relayed(ids)
        self.relay_records -= set(ids)

    @invariant()
    def the_relay_records_are_the_models(self):
        assert set(self.r.zrange(self.keys.relayed, 0, -1)) == self.relay_records
