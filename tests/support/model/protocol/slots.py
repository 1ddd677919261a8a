"""Workers with several slots in the protocol model: each worker is a process of 1 to 3
slots (``runworker --threads N``, docs/architecture.md, "Many jobs in one process"). It
claims only with a slot free (a claim that finishes a job frees that job's slot first),
registers as idle only then, and is handed at most one job per registration, into that
free slot, which the slots' own claims (a slot stores its outcome and claims its next
job in one call) leave to it; each slot ends its job alone; a give-back after a lost
reply keeps the attempts of the other slots (a job claimed again beside a slot still
running it after its lease ran out goes back); one heartbeat renews them all; a lease
runs out for one job while the others stay the worker's, and that job's late outcome is
refused.

After every step: no worker holds more jobs than its slots (those it claimed and took,
and the one handed to it), one registered as idle has a slot free, and Redis gives a
worker no job it did not ask for: every RUNNING job it owns is in one of its slots, or
one it forgot (``worker_vanishes``), whose lease will run out. The invariant reads the
model, which redis_holds_what_the_model_says (invariants.py) compares with Redis in the
same step: each job's owner and place."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from django_redisqueue.store.wire import RELEASE, Outcome
from tests.support.model.harness import RUN
from tests.support.model.protocol.records import QUEUES, RUNNING, WORKERS
from tests.support.model.protocol.strategies import ORDER, PICK, STATUS, WORKER


class SlotModel:
    """The slots of each worker: how many, which jobs fill them, and the rules and the
    invariant that are theirs."""

    def slot_free(self, worker: str, outcome: Outcome | None = None) -> bool:
        """Whether the worker may claim: fewer jobs in hand than slots, once ``outcome``
        (its own, sent with the claim) is stored. A job handed to it is in the slot its
        registration kept free, which its next claim takes first."""
        held = self.held[worker]
        ends = outcome is not None and held.get(outcome.job_id) == outcome.owner
        return len(held) - ends < self.slots[worker]

    def in_other_slots(
        self, worker: str, outcome: Outcome | None = None
    ) -> tuple[tuple[str, str], ...]:
        """The attempts (job id, owner token) a give-back of the worker keeps: those in
        its slots but the one whose ``outcome`` it sent."""
        ending = outcome.job_id if outcome is not None else None
        return tuple(sorted(item for item in self.held[worker].items() if item[0] != ending))

    def forget_slots(self, worker: str) -> None:
        """The worker's process is gone: the jobs it held run out their leases."""
        self.forgotten |= set(self.held[worker].items())
        self.held[worker].clear()

    # Rules.

    @rule(worker=WORKER, order=ORDER)
    def fill_the_slots(self, worker, order):
        """A slot worker's loop: a claim for each free slot, carrying no outcome (its
        slots store their own), until every slot is busy or a claim finds nothing and
        registers as idle (a job handed to it later fills the free slot)."""
        for _ in range(self.slots[worker]):
            if not self.slot_free(worker) or worker in self.idle:
                return
            self.op_claim(worker, order, None, idle=True)
            self.settle()  # what this claim set, before the next one

    @rule(
        worker=WORKER,
        pick=PICK,
        order=ORDER,
        status=STATUS,
        retry_in=st.sampled_from([0, 50]),
        fill=st.booleans(),
    )
    def a_slot_stores_and_claims_the_next(self, worker, pick, order, status, retry_in, fill):
        """A slot whose job ended stores its outcome and claims its next job in one call,
        beside the loop and the other slots: it neither takes the job handed to the
        worker nor registers as idle (the loop, which keeps a slot free for that, does
        both), nor reads the broadcasts' number. ``fill``: the loop fills the slots
        first, registering as idle if it runs out of jobs."""
        if fill:
            self.fill_the_slots(worker, QUEUES)
        chosen = self.pick(sorted(self.held[worker].items()), pick)
        if chosen is None:
            return
        outcome = self.outcome(*chosen, status, retry_in)
        RUN["slot claims beside a registration"] += worker in self.idle
        self.op_claim(worker, order, outcome, broadcasts=False, take=False)

    @rule(worker=WORKER, pick=PICK, status=STATUS, reclaim=st.booleans())
    def one_lease_of_several_runs_out(self, worker, pick, status, reclaim):
        """The worker fills its slots; the lease of one of its jobs runs out and a tick
        recovers it (``reclaim``: another worker claims it again); the worker's
        heartbeat renews the others and finds it lost; the late outcome of the slot
        stopped is refused, and the other jobs stay the worker's."""
        self.fill_the_slots(worker, QUEUES)
        mine = [
            (job_id, token)
            for job_id, token in sorted(self.held[worker].items())
            if self.jobs[job_id].place == RUNNING and self.jobs[job_id].owner == token
        ]
        chosen = self.pick(mine, pick)
        if chosen is None:
            return
        job_id, token = chosen
        job = self.jobs[job_id]
        self.r.zadd(self.lease_key(job), {job_id: 0}, xx=True)
        job.deadline = 0
        self.op_tick("s1", QUEUES, 100, True)
        others = [w for w in WORKERS if w != worker and self.slot_free(w)]
        if reclaim and others:
            self.op_claim(others[0], (job.queue,), None)
        self.op_heartbeat(worker, {})
        assert job_id not in self.held[worker], "the heartbeat did not find the lease lost"
        self.op_finish(worker, self.outcome(job_id, token, status, 0))
        self.op_finish(worker, Outcome(job_id, token, RELEASE))  # the stopped slot's
        if len(mine) > 1:
            RUN["leases lost beside jobs in hand"] += 1

    # The invariant.

    @invariant()
    def slots_hold_every_job_of_their_worker(self):
        """No worker holds more jobs than its slots, one registered as idle has a slot
        free, and every job Redis says a worker runs is in one of its slots (or is one
        it forgot)."""
        self.forgotten = {(i, t) for i, t in self.forgotten if self.jobs[i].owner == t}
        owned: dict[str, set[tuple[str, str]]] = {w: set() for w in WORKERS}
        for job in self.job_list(RUNNING):
            assert job.owner is not None, job
            owned[job.owner.split("/")[0]].add((job.id, job.owner))
        for worker in WORKERS:
            held, slots = self.held[worker], self.slots[worker]
            handed = self.handed.get(worker)
            assert len(held) + (handed is not None) <= slots, (
                f"{worker} holds {self.names(held)}, handed {handed}: more than {slots} slots"
            )
            if worker in self.idle:
                assert len(held) < slots, f"{worker} registered idle with every slot busy"
            in_slots = set(held.items())
            if handed is not None:
                in_slots.add((handed, self.jobs[handed].owner))
            unasked = owned[worker] - in_slots - self.forgotten
            assert not unasked, f"{worker} runs {unasked}, in none of its slots"
