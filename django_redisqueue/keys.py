"""The Redis key schema: every key this app writes, in one place.

All keys of one backend share a prefix wrapped in a hash tag, ``{drq:<alias>}``, so
Redis Cluster keeps them on one shard: the claim script chooses between queues in a
single atomic step, which Cluster allows only within one hash slot.

============================  ======  ===========================================
key                           type    contents (written by)
============================  ======  ===========================================
``{P}:queue:<name>``          zset    ids of READY jobs; score orders by priority
                                      then arrival (enqueue, claim, tick, cancel)
``{P}:wake:<name>``           list    wake-up token for the queue's idle workers,
                                      at most one; a hint, never data (enqueue,
                                      claim, tick; BLPOPed by workers)
``{P}:seq``                   string  arrival counter for FIFO order
``{P}:delayed``               zset    ids of READY jobs not yet due (run_after,
                                      retries); score is the due time in ms
``{P}:scheduler:wake``        list    wake-up token for schedulers when a job
                                      becomes the first due; at most one
``{P}:running``               zset    ids of RUNNING jobs; score is the lease
                                      deadline in ms (claim, finish, tick,
                                      heartbeat)
``{P}:job:<id>``              hash    the job: ``payload`` (JSON envelope),
                                      ``queue``, ``priority``, ``status``,
                                      ``attempts``, ``lost``, ``workers``,
                                      ``owner`` (fencing token while RUNNING),
                                      ``started_at``, ``last_attempted_at``,
                                      ``finished_at`` (ms), ``result`` and
                                      ``errors`` (JSON); ``waiters`` while a
                                      client waits. TTL once finished.
``{P}:job:<id>:done``         list    one token pushed on finish when a client
                                      waits; 60 s TTL
``{P}:delayed:counts``        hash    delayed jobs per queue name
``{P}:failed:<name>``         zset    ids of the queue's FAILED jobs by finish
                                      time (ms); entries older than the result
                                      TTL are dropped as new ones arrive
``{P}:stats:<minute>``        hash    ``ok:<queue>`` / ``failed:<queue>``: jobs
                                      finished in that minute; 2 h TTL
``{P}:paused``                set     names of paused queues (workers skip them)
``{P}:workers``               zset    worker ids by last heartbeat (ms)
``{P}:worker:<id>``           hash    a worker's queues, pid, host, start time,
                                      jobs done; 60 s TTL, renewed by heartbeat
``{P}:schedulers``            zset    scheduler ids by last step (ms)
============================  ======  ===========================================

Every Lua script gets the same ``KEYS`` (``script_keys``): the fixed keys and the
prefixes of the per-job and per-queue keys, which the scripts complete with an id or
a queue name because a claim or a promotion learns them only inside the script. Those
keys carry the same hash tag, so Cluster still accepts them.
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
    def queue_prefix(self) -> str:
        return f"{self.prefix}:queue:"

    @property
    def wake_prefix(self) -> str:
        return f"{self.prefix}:wake:"

    @property
    def seq(self) -> str:
        return f"{self.prefix}:seq"

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"

    @property
    def delayed(self) -> str:
        return f"{self.prefix}:delayed"

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
    def delayed_counts(self) -> str:
        return f"{self.prefix}:delayed:counts"

    @property
    def schedulers(self) -> str:
        return f"{self.prefix}:schedulers"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def script_keys(self) -> list[str]:
        """The KEYS every Lua script receives, in the order lua/common.lua names them."""
        return [
            self.job_prefix,
            self.queue_prefix,
            self.wake_prefix,
            self.seq,
            self.running,
            self.delayed,
            self.scheduler_wake,
            self.paused,
            self.failed_prefix,
            self.stats_prefix,
            self.delayed_counts,
            self.schedulers,
            self.workers,
            self.worker(""),
        ]

    def queue(self, name: str) -> str:
        return f"{self.queue_prefix}{name}"

    def wake(self, name: str) -> str:
        return f"{self.wake_prefix}{name}"

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
