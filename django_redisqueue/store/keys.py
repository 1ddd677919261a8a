"""The Redis key schema: every key this app writes, spelt in one place. Each key's type
and contents are in docs/protocol.md, "Keys": a new key gets its row there.

All keys of one backend share a prefix wrapped in a hash tag, ``{drq:<alias>}``, so
Redis Cluster keeps them on one shard: the claim script chooses between queues in a
single atomic step, which Cluster allows only within one hash slot.

Every Lua script gets one key (``script_keys``): the prefix with its hash tag and a
colon. ``lua/lib/keys.lua`` completes it with the names this module spells
(``fixed_keys``; a test checks that they agree), and with an id or a queue name that a
script learns only inside it. One key instead of fourteen saves every call the packing
and the checking of thirteen arguments.
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

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}:job:"

    @property
    def entries_prefix(self) -> str:
        return f"{self.prefix}:entries:"

    def entries(self, job_id: str) -> str:
        """The bucket that holds the job's entry, if it is kept as one: the first three
        characters of its id name it (4,096 buckets of hex ids)."""
        return f"{self.entries_prefix}{job_id[:3]}"

    @property
    def queue_prefix(self) -> str:
        return f"{self.prefix}:queue:"

    @property
    def wake_prefix(self) -> str:
        return f"{self.prefix}:wake:"

    @property
    def delayed_prefix(self) -> str:
        return f"{self.prefix}:delayed:"

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"

    @property
    def scheduler_wake(self) -> str:
        return f"{self.prefix}:scheduler:wake"

    @property
    def paused(self) -> str:
        return f"{self.prefix}:paused"

    @property
    def failed_prefix(self) -> str:
        return f"{self.prefix}:failed:"

    @property
    def stats_prefix(self) -> str:
        return f"{self.prefix}:stats:"

    @property
    def metrics(self) -> str:
        return f"{self.prefix}:metrics"

    @property
    def known_queues(self) -> str:
        return f"{self.prefix}:queues"

    @property
    def schedulers(self) -> str:
        return f"{self.prefix}:schedulers"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def groups(self) -> str:
        return f"{self.prefix}:groups"

    @property
    def group_prefix(self) -> str:
        return f"{self.prefix}:group:"

    @property
    def broadcast_prefix(self) -> str:
        return f"{self.prefix}:broadcast:"

    @property
    def broadcast_seq(self) -> str:
        return f"{self.broadcast_prefix}seq"

    @property
    def broadcast_unread(self) -> str:
        return f"{self.broadcast_prefix}unread"

    @property
    def broadcast_cursors(self) -> str:
        return f"{self.broadcast_prefix}cursors"

    @property
    def broadcast_sent(self) -> str:
        return f"{self.broadcast_prefix}sent"

    @property
    def limits(self) -> str:
        return f"{self.prefix}:limits"

    @property
    def limit_prefix(self) -> str:
        return f"{self.prefix}:limit:"

    @property
    def periodic(self) -> str:
        return f"{self.prefix}:periodic"

    def periodic_schedule(self, name: str) -> str:
        return f"{self.prefix}:periodic:{name}"

    @property
    def script_keys(self) -> list[str]:
        """The KEYS every Lua script receives: the prefix, which lua/lib/keys.lua
        completes into every key above."""
        return [f"{self.prefix}:"]

    @property
    def fixed_keys(self) -> dict[str, str]:
        """The keys lua/lib/keys.lua builds from ``script_keys``, by its names for
        them (prefixes for the per-job, per-queue and per-worker keys)."""
        return {
            "JOB": self.job_prefix,
            "ENTRIES": self.entries_prefix,
            "QUEUE": self.queue_prefix,
            "WAKE": self.wake_prefix,
            "SEQ": self.seq,
            "RUNNING": self.running,
            "DELAYED": self.delayed_prefix,
            "SCHEDULER_WAKE": self.scheduler_wake,
            "PAUSED": self.paused,
            "FAILED": self.failed_prefix,
            "STATS": self.stats_prefix,
            "SCHEDULERS": self.schedulers,
            "WORKERS": self.workers,
            "WORKER": self.worker(""),
            "KNOWN_QUEUES": self.known_queues,
            "GROUP": self.group_prefix,
            "GROUPS": self.groups,
            "BROADCAST": self.broadcast_prefix,
            "BROADCAST_SEQ": self.broadcast_seq,
            "CURSORS": self.broadcast_cursors,
            "UNREAD": self.broadcast_unread,
            "SENT": self.broadcast_sent,
            "UNIQUE": self.unique(""),
            "LIMIT": self.limit_prefix,
            "LIMITS": self.limits,
            "PERIODIC": self.periodic,
            "SCHEDULE": self.periodic_schedule(""),
            "IDLE": self.idle(""),
            "IDLE_WORKER": self.idle_worker(""),
            "IDLE_WIDE": self.idle_wide,
            "HANDOFF": self.handoff(""),
            "HANDED": self.handed,
            "STOPS": self.stops(""),
            "RELAYED": self.relayed,
            "FAIR": self.fair(""),
        }

    def queue(self, name: str) -> str:
        return f"{self.queue_prefix}{name}"

    def wake(self, name: str) -> str:
        return f"{self.wake_prefix}{name}"

    def delayed(self, queue: str) -> str:
        return f"{self.delayed_prefix}{queue}"

    def job(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}"

    def done(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}:done"

    def failed(self, queue: str) -> str:
        return f"{self.failed_prefix}{queue}"

    def stats(self, minute: int) -> str:
        return f"{self.stats_prefix}{minute}"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def dependents(self, job_id: str) -> str:
        return f"{self.job_prefix}{job_id}:then"

    def group(self, group_id: str) -> str:
        return f"{self.group_prefix}{group_id}"

    def group_members(self, group_id: str) -> str:
        return f"{self.group_prefix}{group_id}:members"

    def group_done(self, group_id: str) -> str:
        return f"{self.group_prefix}{group_id}:done"

    def broadcast_message(self, number: int | str) -> str:
        return f"{self.broadcast_prefix}msg:{number}"

    def broadcast_wake(self, worker_id: str) -> str:
        return f"{self.broadcast_prefix}wake:{worker_id}"

    def idle(self, queue: str) -> str:
        return f"{self.prefix}:idlers:{queue}"

    def idle_worker(self, worker_id: str) -> str:
        return f"{self.prefix}:idle-worker:{worker_id}"

    def handoff(self, worker_id: str) -> str:
        return f"{self.prefix}:handoff:{worker_id}"

    def stops(self, worker_id: str) -> str:
        """The ids of the jobs a worker is asked to stop (stop.lua), which it blocks on."""
        return f"{self.prefix}:stops:{worker_id}"

    def fair(self, queue: str) -> str:
        """A fair queue's turns: its fairness keys that have jobs waiting (lua/lib/queues.lua)."""
        return f"{self.prefix}:fair:{queue}"

    def fair_turn(self, queue: str, turn: str) -> str:
        """One turn's jobs: those of one fairness key at one priority, in order."""
        return f"{self.fair(queue)}:{turn}"

    @property
    def idle_wide(self) -> str:
        """Set while a worker of more queues than its registration names stands idle."""
        return f"{self.prefix}:idle-wide"

    @property
    def handed(self) -> str:
        return f"{self.prefix}:handed"

    @property
    def relayed(self) -> str:
        return f"{self.prefix}:relayed"

    def unique(self, key: str) -> str:
        return f"{self.prefix}:unique:{key}"

    def limit(self, key: str, part: str) -> str:
        """A limit key's ``running``, ``starts``, ``window`` or ``parked`` key."""
        return f"{self.limit_prefix}{key}:{part}"
