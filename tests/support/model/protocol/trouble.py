"""Redis trouble in the protocol model: SCRIPT FLUSH, an error raised before a script
runs, a real out-of-memory Redis, and calls whose reply is lost after they ran (a claim,
a fan-out call, an enqueue with options). A call refused changes nothing, and the model
neither; a call that ran counts whole, whether or not its caller learns it."""

from __future__ import annotations

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import rule

from django_redisqueue.core.jobs import SUCCESSFUL
from tests.support.model.harness import INJECTED, RUN, forget_scripts, snapshot
from tests.support.model.protocol.records import (
    DELAYS,
    LIMITS,
    QUEUES,
    STATUSES,
    UNIQUE_KEYS,
    UNKNOWN_ID,
    WORKERS,
)
from tests.support.model.protocol.strategies import (
    MEMBER,
    OPTIONED,
    ORDER,
    PICK,
    RETRY_DELAY,
    STATUS,
    WORKER,
)


class RedisTrouble:
    """The steps in which Redis, or the way to it, fails."""

    # Rules: Redis trouble.

    @rule(
        trouble=st.sampled_from(["script flush", "out of memory", *sorted(INJECTED)]),
        operation=st.tuples(*[PICK] * 5),
    )
    def redis_trouble(self, trouble, operation):
        """SCRIPT FLUSH and FUNCTION FLUSH (a restart, a failover: the broker loads its
        scripts again); an error before a script runs (nothing changes, and the model
        neither); a real OOM (maxmemory below what is used: a script is refused whole,
        before its first write, or runs whole; never half-way)."""
        if trouble == "script flush":
            forget_scripts(self.r)
            return
        before = snapshot(self.r)
        if trouble in INJECTED:
            exc = INJECTED[trouble]()
            self.client.fault = exc
            with pytest.raises(type(exc)):
                self.any_operation(*operation)
            self.client.fault = None
            assert snapshot(self.r) == before
            return
        self.out_of_memory(lambda: self.any_operation(*operation), before)

    def out_of_memory(self, operation, before: dict[str, object]):
        """Run ``operation`` while Redis is out of memory: each script it calls is
        refused whole (then nothing changed since ``before``, and this returns None)
        or runs whole (this returns what ``operation`` returned)."""
        self.r.config_set("maxmemory", 1)
        try:
            return operation()
        except redis.exceptions.ResponseError as exc:
            assert "maxmemory" in str(exc), exc
            assert snapshot(self.r) == before
            RUN["refused when out of memory"] += 1
            return None
        finally:
            self.r.config_set("maxmemory", 0)

    def any_operation(self, kind: int, worker: int, pick: int, status: int, other: int) -> None:
        """One broker call of any kind; the model moves only if it succeeds."""
        kinds = ["enqueue", "claim", "heartbeat", "tick", "abandon", "retry_failed"]
        kinds += ["finish"] if self.any_held() else []
        kinds += ["cancel", "watch"] if self.jobs else []
        kinds += ["chain", "group", "broadcast", "receive"]
        kinds += ["cancel group"] if self.groups else []
        kinds += ["unique", "limited"]
        kind_name = self.pick(kinds, kind)
        worker_id = self.pick(WORKERS, worker)
        if kind_name in ("chain", "group", "broadcast", "receive", "cancel group"):
            self.any_fan_out_operation(kind_name, worker_id, pick, other)
        elif kind_name == "enqueue":
            self.op_enqueue("default", 0, self.pick(DELAYS.values(), other), via_api=False)
        elif kind_name in ("unique", "limited"):
            unique = (
                (self.pick(UNIQUE_KEYS, other), bool(pick % 2)) if kind_name == "unique" else None
            )
            limit = self.pick(sorted(LIMITS), other)
            self.op_enqueue_options([("default", 0, "now", unique, limit)], via_api=False)
        elif kind_name == "claim":
            self.op_claim(worker_id, QUEUES, None)
        elif kind_name == "finish":
            held_by, job_id, token = self.held_job(pick)
            outcome = self.outcome(job_id, token, self.pick(STATUSES, status), 0)
            self.op_finish(held_by, outcome)
        elif kind_name == "heartbeat":
            self.op_heartbeat(worker_id, {})
        elif kind_name == "tick":
            self.op_tick("s1", QUEUES, 100, True)
        elif kind_name == "abandon":
            self.op_abandon(worker_id, keep=self.in_other_slots(worker_id))
        elif kind_name == "retry_failed":
            self.op_operate("retry_failed", self.pick(QUEUES, other), [], 0)
        elif kind_name == "cancel":
            self.op_cancel(self.pick(self.jobs.values(), pick), via_api=False)
        else:
            self.op_watch(self.pick(self.jobs.values(), pick))

    def any_fan_out_operation(self, kind: str, worker: str, pick: int, other: int) -> None:
        step = ("default", 0, "now", "prev", pick)
        if kind == "chain":  # three jobs: two calls
            self.op_linked([step] * 3)
        elif kind == "group":  # three members and a callback: two calls
            self.op_linked([step] * 3, self.ids.new_job_id(), ("default", 0, "now"))
        elif kind == "broadcast":
            self.op_broadcast(self.pick(["", *QUEUES], other), via_api=False)
        elif kind == "receive":  # by a worker with outcomes to report, if there is one
            reporting = [w for w in WORKERS if self.to_report[w]]
            self.op_receive(self.pick(reporting, pick) or worker, QUEUES, SUCCESSFUL, 100)
        else:
            self.op_cancel_group(self.pick(self.groups, pick), False, 1)

    # Rules: replies lost.

    @rule(
        worker=WORKER,
        order=ORDER,
        with_outcome=st.booleans(),
        pick=PICK,
        status=STATUS,
        retry_in=RETRY_DELAY,
    )
    def claim_reply_lost(self, worker, order, with_outcome, pick, status, retry_in):
        """The claim runs but its reply is lost; the worker sends its outcome again
        (fenced: refused if stored) and gives back what the claim may have taken,
        keeping the jobs of its other slots (a slot worker's claims carry no outcome:
        its slots store their own). With every slot busy, the claim only stores."""
        outcome = None
        held = self.pick(sorted(self.held[worker].items()), pick)
        if with_outcome and held is not None:
            outcome = self.outcome(*held, status, retry_in)
        if not self.slot_free(worker, outcome):
            order = ()
        keep = self.in_other_slots(worker, outcome)
        self.client.lose_reply = redis.exceptions.ConnectionError("Connection reset by peer")
        t0 = self.clock()
        take = self.takes_handed(worker)
        with pytest.raises(redis.exceptions.ConnectionError):
            self.broker.claim(order, worker, outcome, take_handed=take)
        again = self.broker.finish(outcome) if outcome else None
        given = self.broker.abandon(worker, keep=keep)
        t1 = self.clock()
        self.m_finish(outcome, (t0, t1))
        self.m_claim(order, worker, (t0, t1), take=take)
        assert again is self.m_finish(outcome, (t0, t1))
        self.check_kept(given, keep, self.owners())
        expected = self.m_abandon(worker, (t0, t1), frozenset(keep))
        assert sorted(given) == sorted(j.id for j in expected)
        self.held[worker] = dict(keep)
        RUN["lost claim replies"] += 1
        RUN["jobs kept in hand by a give-back"] += len(keep)

    @rule(
        kind=st.sampled_from(["chain", "group", "cancel group", "broadcast", "receive"]),
        steps=st.lists(MEMBER, max_size=4),
        pick=PICK,
        worker=WORKER,
    )
    def fan_out_reply_lost(self, kind, steps, pick, worker):
        """The call runs but its reply is lost: what it did stands (a group its sender
        never learnt the id of, a receive whose messages the worker never runs)."""
        self.client.lose_reply = redis.exceptions.ConnectionError("Connection reset by peer")
        if kind == "chain":
            self.op_linked(steps or [("default", 0, "now", "none", pick)], lost=True)
        elif kind == "group":
            self.op_linked(steps, self.ids.new_job_id(), ("low", 0, "now"), lost=True)
        elif kind == "cancel group":
            gid = self.pick([*self.groups, UNKNOWN_ID], pick)
            self.op_cancel_group(gid, False, 1, lost=True)
        elif kind == "broadcast":
            self.op_broadcast("", via_api=False, lost=True)
        else:
            self.op_receive(worker, QUEUES, SUCCESSFUL, 2, lost=True)
        assert self.client.lose_reply is None, "no reply was lost"
        RUN["lost fan-out replies"] += 1

    @rule(spec=OPTIONED)
    def enqueue_with_options_reply_lost(self, spec):
        """The enqueue runs, its reply is lost: what it did stands."""
        self.client.lose_reply = redis.exceptions.ConnectionError("Connection reset by peer")
        self.op_enqueue_options([spec], via_api=False, lost=True)
        assert self.client.lose_reply is None, "no reply was lost"
