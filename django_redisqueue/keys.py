"""The Redis key schema: every key this app writes, in one place.

All keys of one backend share a prefix wrapped in a hash tag, ``{drq:<alias>}``, so
Redis Cluster keeps them on one shard: the claim script chooses between queues in a
single atomic step, which Cluster allows only within one hash slot.

============================  ======  ===========================================
key                           type    contents (written by)
============================  ======  ===========================================
``{P}:queue:<name>``          zset    ids of READY jobs; score orders by priority
                                      then arrival (enqueue.lua, claim.lua)
``{P}:wake:<name>``           list    wake-up tokens for idle workers, at most
                                      one; a hint, never data (enqueue.lua,
                                      claim.lua; BLPOPed by workers)
``{P}:seq``                   string  arrival counter for FIFO order (enqueue.lua)
``{P}:running``               zset    ids of RUNNING jobs; score is the lease
                                      deadline in ms (claim.lua, finish.lua,
                                      Broker.extend_leases)
``{P}:job:<id>``              hash    the job: ``payload`` (JSON envelope),
                                      ``status``, ``attempts``, ``workers``,
                                      ``owner`` (fencing token while RUNNING),
                                      ``started_at``, ``last_attempted_at``,
                                      ``finished_at`` (ms), ``result`` or
                                      ``errors`` (JSON); ``waiters`` while a
                                      client waits. TTL once finished.
``{P}:job:<id>:done``         list    one token pushed on finish when a client
                                      waits (finish.lua); short TTL
============================  ======  ===========================================

Lua scripts get fixed keys through ``KEYS[]``; per-job keys are built inside the
scripts as ``job_prefix .. id`` (and ``.. ':done'``), because a claim learns the id
only inside the script. Those keys share the hash tag, so Cluster still accepts them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Build the keys of one backend from its prefix."""

    prefix: str

    @classmethod
    def for_backend(cls, key_prefix: str) -> KeySchema:
        return cls(prefix="{" + key_prefix + "}")

    def queue(self, name: str) -> str:
        return f"{self.prefix}:queue:{name}"

    def wake(self, name: str) -> str:
        return f"{self.prefix}:wake:{name}"

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}:job:"

    def job(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}"

    def done(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}:done"
