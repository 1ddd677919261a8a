"""Fair queues in the protocol model (lib/queues.lua, "Fair queues").

A job enqueued with a fairness key (``fair`` in its options: '', "a", "b" or "c")
has, besides its place on its queue, an entry at that place in its turn (its key at
its priority), and its turn is among the queue's turns, ordered as jobs of their
priority arriving when the turn joined or last had its go. A claim (or a hand-off)
whose queue's first job is fair takes the first live job of the first turn instead
(making the first job's entry again if it has none); that turn goes behind the others
of its priority while it has entries. A job cancelled or emptied by an operator takes
its entry with it; one claimed by its place (with no turn left, or past the claim's
looks) too; an entry whose job left the queue otherwise is dropped when met. A job
back at its old place (given back, recovered, unparked) takes its place in its turn,
and its turn comes no later than that place.

Any queue of the model holds fair jobs beside jobs that are not (as during the deploy
that makes a queue fair): a job that is not fair, first in its queue, is claimed by its
place. Fair jobs meet limits, unique keys, pauses, give-backs, recoveries, cancels and
operators' moves through the other areas' rules.

After every step the turns and their lists in Redis are the model's, in order; and the
fairness bound holds: while a turn has a live job waiting, no other turn of its queue
and priority has two goes (a go given back does not count: it is undone).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.support.model.harness import RUN
from tests.support.model.protocol.records import QUEUED, QUEUES, Job

FAIR_KEYS = ("", "a", "b", "c")
FAIR_SPEC = st.tuples(
    st.sampled_from(["default", "default", "low"]),
    st.sampled_from([0, 0, 0, 5]),
    st.sampled_from(["now", "now", "now", "an hour"]),
    st.sampled_from(FAIR_KEYS),
    st.sampled_from([None, None, None, "a-one", "b-rate"]),
)

Turn = tuple[str, str]  # (queue, "<priority>:<key>")


def turn_of(job: Job) -> Turn:
    return job.queue, f"{job.priority}:{job.fair}"


class FairnessModel:
    def init_fairness(self) -> None:
        # Per turn with entries: its order (band, seq), and its entries (job id: the
        # job's place, (band, seq)).
        self.turns: dict[Turn, tuple[int, int]] = {}
        self.entries: dict[Turn, dict[str, tuple[int, int]]] = {}
        # Per turn with live jobs: the turns of its queue and priority that had a go
        # since it joined or last had its own.
        self.gone_since: dict[Turn, set[str]] = {}

    def fair_add(self, job: Job, back: bool) -> None:
        """fair_add: its entry at its place in its turn; its turn joins at its place if
        it had none (``back``: no later than its place)."""
        turn = turn_of(job)
        place = (-job.priority, job.seq)
        if not self.has_live(turn):  # its wait starts now
            self.gone_since[turn] = set()
        self.entries.setdefault(turn, {})[job.id] = place
        if back:
            if turn not in self.turns or place < self.turns[turn]:
                self.turns[turn] = place
            # Its go is undone: the others' waits forget it.
            for gone in self.gone_since.values():
                gone.discard(turn[1])
        else:
            self.turns.setdefault(turn, place)

    def fair_drop(self, job: Job) -> None:
        """fair_drop: a job leaving its queue other than by its turn (cancelled,
        emptied, claimed by its place) takes its entry, and its turn if the last."""
        turn = turn_of(job)
        entries = self.entries.get(turn, {})
        if entries.pop(job.id, None) is not None and not entries:
            del self.entries[turn], self.turns[turn]

    def live(self, queue: str, place: tuple[int, int], job_id: str) -> bool:
        job = self.jobs.get(job_id)
        return (
            job is not None
            and job.place == QUEUED
            and job.queue == queue
            and (-job.priority, job.seq) == place
        )

    def fair_take(self, queue: str, looks: list[int]) -> Job | None:
        """fair_pop: the first live job of the queue's first turn; with no turn, or
        past the claim's ``looks`` at turns and entries that held none, the queue's
        first job, its entry dropped."""
        while looks[0] > 0:
            mine = [(order, turn) for turn, order in self.turns.items() if turn[0] == queue]
            if not mine:
                break
            _, turn = min(mine, key=lambda item: (item[0], item[1][1]))
            entries = self.entries[turn]
            job_id, place = min(entries.items(), key=lambda item: (item[1], item[0]))
            del entries[job_id]
            if self.live(queue, place, job_id):
                if entries:
                    self.seq += 1
                    self.turns[turn] = (self.turns[turn][0], self.seq)
                else:
                    del self.turns[turn], self.entries[turn]
                self.had_a_go(turn)
                RUN["fair claims"] += 1
                return self.jobs[job_id]
            RUN["fair entries dropped"] += 1
            if not entries:
                del self.turns[turn], self.entries[turn]
            looks[0] -= 1
        ready = self.queue_order(queue)
        if not ready:
            return None
        if ready[0].fair is not None:
            self.fair_drop(ready[0])
        return ready[0]

    def had_a_go(self, turn: Turn) -> None:
        """The fairness bound: no turn of the same queue and priority with a live job
        waiting has seen this one go twice."""
        queue, name = turn
        priority = name.split(":", 1)[0]
        for other, gone in self.gone_since.items():
            if other == turn or other[0] != queue or other[1].split(":", 1)[0] != priority:
                continue
            if not self.has_live(other):
                continue
            assert name not in gone, f"turn {name} had two goes while {other[1]} waited"
            gone.add(name)
        self.gone_since[turn] = set()

    def has_live(self, turn: Turn) -> bool:
        return any(
            self.live(turn[0], place, job_id)
            for job_id, place in self.entries.get(turn, {}).items()
        )

    def next_in(self, queue: str, looks: list[int]) -> Job | None:
        """The job a claim or a hand-off takes from ``queue``: its first, or, when that
        one is fair, the first of the first turn (the first job's entry made again if
        it had none)."""
        ready = self.queue_order(queue)
        if not ready:
            return None
        head = ready[0]
        if head.fair is None:
            return head
        if head.id not in self.entries.get(turn_of(head), {}):
            self.fair_add(head, back=True)
            RUN["fair entries made again"] += 1
        return self.fair_take(queue, looks)

    def check_fairness(self) -> None:
        """Redis holds the model's turns, in order, and their entries. With none in the
        model, check_keys finds any fair key Redis holds unexpected."""
        if not self.turns:
            return
        k = self.keys
        pipe = self.r.pipeline(transaction=False)
        for queue in QUEUES:
            pipe.zrange(k.fair(queue), 0, -1)
        turns_of = dict(zip(QUEUES, pipe.execute(), strict=True))
        for queue in QUEUES:
            mine = sorted(
                ((order, turn[1]) for turn, order in self.turns.items() if turn[0] == queue)
            )
            assert turns_of[queue] == [name for _, name in mine], (
                f"fair:{queue} {turns_of[queue]}, model {mine}"
            )
        pipe = self.r.pipeline(transaction=False)
        for queue, name in self.entries:
            pipe.zrange(k.fair_turn(queue, name), 0, -1)
        for (turn, entries), got in zip(self.entries.items(), pipe.execute(), strict=True):
            want = [job_id for job_id, _ in sorted(entries.items(), key=lambda e: (e[1], e[0]))]
            assert got == want, f"{turn} holds {self.names(got)}, model {self.names(want)}"

    def expected_fair_keys(self, expires: dict[str, bool]) -> None:
        for queue in {queue for queue, _ in self.turns}:
            expires[self.keys.fair(queue)] = False
        for (queue, name), entries in self.entries.items():
            if entries:
                expires[self.keys.fair_turn(queue, name)] = False

    # Rules.

    @rule(queue=st.sampled_from(["default", "low"]), backlog=st.integers(2, 4))
    def enqueue_a_fair_backlog(self, queue, backlog):
        """One key's backlog, then a key with one job: the second key's turn comes after
        one job of the first."""
        self.op_enqueue_options(
            [(queue, 0, "now", None, None)] * (backlog + 1),
            via_api=False,
            fair=["a"] * backlog + ["b"],
        )

    @rule(specs=st.lists(FAIR_SPEC, min_size=1, max_size=4))
    def enqueue_fair_jobs(self, specs):
        """Jobs of fairness keys in one call, some with limits, some an hour ahead."""
        self.op_enqueue_options(
            [(*spec[:3], None, spec[4]) for spec in specs],
            via_api=False,
            fair=[spec[3] for spec in specs],
        )
