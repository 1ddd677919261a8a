"""Fair queues in the protocol model (lib/queues.lua, "Fair queues").

A job enqueued with a fairness key (``fair`` in its options: '', "a", "b" or "c")
has, besides its place on its queue, an entry in its turn's list (its key at its
priority), and its turn is among the queue's turns, ordered as jobs of their priority
arriving when the turn joined or last had its go. A claim (or a hand-off) whose queue's
first job is fair takes the first live job of the first turn instead; that turn goes
behind the others of its priority while it has entries. An entry whose job left the
queue otherwise (cancelled, moved by an operator, claimed by its place as a job that is
not fair) is dropped when met. A job back at its old place (given back, recovered,
unparked) goes first in its turn, and its turn no later than that place.

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
# Most dropped entries one claim looks through (lib/queues.lua's FAIR_LOOKS).
FAIR_LOOKS = 100
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
        # Per turn with entries: its order (band, seq), and its entries (seq, job id).
        self.turns: dict[Turn, tuple[int, int]] = {}
        self.entries: dict[Turn, list[tuple[int, str]]] = {}
        # Per turn with live jobs: the turns of its queue and priority that had a go
        # since it joined or last had its own.
        self.gone_since: dict[Turn, set[str]] = {}

    def fair_add(self, job: Job, back: bool) -> None:
        """fair_add: its entry last (first, ``back``) in its turn; its turn joins at
        its place (``back``: no later than its place)."""
        turn = turn_of(job)
        place = (-job.priority, job.seq)
        if not self.has_live(turn):  # its wait starts now
            self.gone_since[turn] = set()
        entries = self.entries.setdefault(turn, [])
        if back:
            entries.insert(0, (job.seq, job.id))
            if turn not in self.turns or place < self.turns[turn]:
                self.turns[turn] = place
            # Its go is undone: the others' waits forget it.
            for gone in self.gone_since.values():
                gone.discard(turn[1])
        else:
            entries.append((job.seq, job.id))
            self.turns.setdefault(turn, place)

    def live(self, queue: str, seq: int, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.place == QUEUED and job.queue == queue and job.seq == seq

    def fair_take(self, queue: str) -> Job | None:
        """fair_pop: the first live job of the queue's first turn, or past FAIR_LOOKS
        dropped entries (or with no turn) the queue's first job."""
        for _ in range(FAIR_LOOKS):
            mine = [(order, turn) for turn, order in self.turns.items() if turn[0] == queue]
            if not mine:
                break
            _, turn = min(mine, key=lambda item: (item[0], item[1][1]))
            entries = self.entries[turn]
            if not entries:
                del self.turns[turn], self.entries[turn]
                continue
            seq, job_id = entries.pop(0)
            if not self.live(queue, seq, job_id):
                RUN["fair entries dropped"] += 1
                continue
            if entries:
                self.seq += 1
                self.turns[turn] = (self.turns[turn][0], self.seq)
            else:
                del self.turns[turn], self.entries[turn]
            self.had_a_go(turn)
            RUN["fair claims"] += 1
            return self.jobs[job_id]
        ready = self.queue_order(queue)
        return ready[0] if ready else None

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
        return any(self.live(turn[0], seq, job_id) for seq, job_id in self.entries.get(turn, []))

    def next_in(self, queue: str) -> Job | None:
        """The job a claim or a hand-off takes from ``queue``: its first, or, when that
        one is fair, the first of the first turn."""
        ready = self.queue_order(queue)
        if not ready:
            return None
        if ready[0].fair is None:
            return ready[0]
        return self.fair_take(queue)

    def check_fairness(self) -> None:
        """Redis holds the model's turns, in order, and their entries."""
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
            pipe.lrange(k.fair_turn(queue, name), 0, -1)
        for (turn, entries), got in zip(self.entries.items(), pipe.execute(), strict=True):
            ids = [entry.split(" ", 1)[1] for entry in got]
            assert ids == [job_id for _, job_id in entries], (
                f"{turn} holds {self.names(ids)}, model {self.names([i for _, i in entries])}"
            )

    def expected_fair_keys(self, expires: dict[str, bool]) -> None:
        for queue in {queue for queue, _ in self.turns}:
            expires[self.keys.fair(queue)] = False
        for (queue, name), entries in self.entries.items():
            if entries:
                expires[self.keys.fair_turn(queue, name)] = False

    # Rules.

    @rule(specs=st.lists(FAIR_SPEC, min_size=1, max_size=4))
    def enqueue_fair_jobs(self, specs):
        """Jobs of fairness keys in one call, some with limits, some an hour ahead."""
        self.op_enqueue_options(
            [(*spec[:3], None, spec[4]) for spec in specs],
            via_api=False,
            fair=[spec[3] for spec in specs],
        )
