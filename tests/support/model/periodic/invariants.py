"""The periodic model's invariants, read from Redis after every step: exactly the keys
the model expects, each with its contents and TTL; each job stored once; and every
occurrence of an "all" schedule in force since its start has a job, but those skipped
while its unique task's key was held. And the abstract state each run counts."""

from __future__ import annotations

from hypothesis.stateful import invariant

from tests.support.model.harness import RUN, STATES, snapshot
from tests.support.model.periodic.schedules import POOL, grid, occurrence_id, period


class InvariantChecks:
    """What Redis must hold after every step."""

    def expected_keys(self) -> dict[str, object]:
        keys = self.keys
        want: dict[str, object] = {}
        if self.names is None:
            want[keys.periodic] = ("string", "spoilt", False)
        elif self.names:
            want[keys.periodic] = ("set", sorted(self.names), False)
        for name, state in self.states.items():
            if isinstance(state, str):
                want[keys.periodic_schedule(name)] = ("string", state, False)
            else:
                want[keys.periodic_schedule(name)] = ("hash", state, False)
        for job_id, job in self.jobs.items():
            want[keys.job_prefix + job_id] = ("hash", job, job_id in self.ended)
        for unique, (holder, window) in self.unique.items():
            want[f"{keys.prefix}:unique:{unique}"] = ("string", holder, window)
        for key, (starts, ms) in self.windows.items():
            record = {"starts": str(starts), "ms": str(ms)}
            want[keys.limit(key, "window")] = ("hash", record, True)
        for job_id, job in self.taken.items():
            want[keys.job_prefix + job_id] = ("hash", job, True)
        for queue, members in self.queues.items():
            if not members:
                continue
            order = sorted(members.items(), key=lambda item: (item[1], item[0]))
            want[keys.queue_prefix + queue] = ("zset", [(i, float(s)) for i, s in order], False)
        for queue in self.wakes:
            want[keys.wake_prefix + queue] = ("list", ["1"], False)
        if self.known_queues:
            want[keys.known_queues] = ("set", sorted(self.known_queues), False)
        if self.seq:
            want[keys.seq] = ("string", str(self.seq), False)
        return want

    @invariant()
    def redis_holds_the_model(self):
        """Every key, its contents, and no TTL but on finished jobs and on a unique key
        in its window."""
        assert self.failure is None, self.failure
        RUN["checks"] += 1
        STATES.add(hash(self.abstract_state()))
        got = snapshot(self.r)
        want = self.expected_keys()
        assert got.keys() == want.keys(), (
            sorted(got.keys() - want.keys()),
            sorted(want.keys() - got.keys()),
        )
        for key, value in want.items():
            assert got[key] == value, (key, got[key], value)

    @invariant()
    def each_occurrence_once_and_none_missed(self):
        """One store per job (the arrival counter); every last job exists; and every
        occurrence of an "all" schedule in force in (base, last] has a job, but those
        skipped while a job of its unique task held the key."""
        assert self.seq == 2 * len(self.jobs)
        for state in self.states.values():
            if isinstance(state, dict) and "last_job" in state:
                assert self.exists(state["last_job"])
        clock = self.clock()
        for name, schedule in self.in_force.items():
            last = self.valid_last(name, clock)
            if schedule.catch_up != "all" or last is None or name not in self.base:
                continue
            p = period(schedule)
            first, n = grid(p, self.base[name], last)
            assert n <= 10_000, (name, self.base[name], last)
            overlapping = self.overlapping.get(name, set())
            missed = [
                at
                for at in range(first, first + n * p, p)
                if not self.exists(occurrence_id(name, at)) and at not in overlapping
            ]
            assert not missed, (name, self.base[name], last, missed)
            RUN["occurrences checked"] += n

    def abstract_state(self) -> tuple:
        return (
            tuple(
                tuple((name, POOL[name].index(x)) for name, x in sorted(settings.items()))
                for settings in [self.in_force, *self.settings]
            ),
            tuple(
                (n, s if isinstance(s, str) else tuple(sorted(k for k in s if k != "last")))
                for n, s in sorted(self.states.items())
            ),
            None if self.names is None else tuple(sorted(self.names)),
            min(len(self.jobs), 20),
            len(self.taken),
        )
