"""The Redis key schema: every key this app writes, in one place.

All keys of one backend share a prefix wrapped in a hash tag, ``{drq:<alias>}``, so
Redis Cluster keeps them on one shard: the claim script chooses between queues in a
single atomic step, which Cluster allows only within one hash slot.

============================  ======  ===========================================
key                           type    contents (written by)
============================  ======  ===========================================
``{P}:queue:<name>``          zset    ids of READY jobs; score orders by priority
                                      then arrival (enqueue, claim, tick, finish,
                                      cancel, operate)
``{P}:wake:<name>``           list    wake-up token for the queue's idle workers,
                                      at most one; a hint, never data (enqueue,
                                      claim, tick; BLPOPed by workers)
``{P}:seq``                   string  arrival counter for FIFO order
``{P}:delayed:<name>``        zset    ids of the queue's READY jobs not yet due
                                      (run_after, retries); score is the due time
                                      in ms by Redis's clock
``{P}:scheduler:wake``        list    wake-up token for schedulers when a job
                                      becomes the first due of its queue; at most
                                      one
``{P}:running``               zset    ids of RUNNING jobs; score is the lease
                                      deadline in ms (claim, finish, tick,
                                      heartbeat, abandon)
``{P}:job:<id>``              hash    the job: ``payload`` (JSON envelope),
                                      ``queue``, ``priority``, ``score`` (its
                                      place in the queue, kept so that a job given
                                      back returns to it), ``status``,
                                      ``enqueued_at``, ``attempts``, ``lost``,
                                      ``workers``, ``owner`` (the last claim's
                                      fencing token: it fences only while
                                      RUNNING), ``started_at``,
                                      ``last_attempted_at``, ``finished_at`` (ms,
                                      Redis's clock), ``result`` and ``errors``
                                      (JSON), ``cancelled``, ``trace`` (where its
                                      last attempt was traced: tracing.py);
                                      ``waiters`` while a client waits. TTL once
                                      finished.
``{P}:job:<id>:done``         list    one token pushed on finish when a client
                                      waits; 60 s TTL
``{P}:job:<id>:then``         list    ids of the jobs waiting for this one (chains,
                                      ``depends_on``; its ``then`` field counts
                                      them); deleted with the field when it ends,
                                      which lets them go or fails them
                                      (enqueue_linked, store_outcome)
``{P}:failed:<name>``         zset    ids of the queue's FAILED jobs (cancelled
                                      ones excepted) by finish time (ms); expires
                                      with the result TTL, trimmed by the tick
``{P}:stats:<minute>``        hash    ``ok:<queue>`` / ``failed:<queue>``: jobs
                                      finished in that minute; 2 h TTL
``{P}:metrics``               hash    counts workers add every heartbeat:
                                      ``jobs|<queue>|<task>|<status>``, and the
                                      histograms' ``duration|…|<le>``,
                                      ``duration_sum|…|``, ``wait|…``,
                                      ``wait_sum|…`` (observe/metrics.py); no TTL
``{P}:paused``                set     names of paused queues (workers skip them)
``{P}:queues``                set     names of the queues used, kept when QUEUES
                                      is empty (any name valid) for workers,
                                      schedulers and the dashboard (enqueue); read
                                      by Broker.known_queues only, which skips a
                                      member that is no queue name
``{P}:workers``               zset    worker ids by last heartbeat (ms)
``{P}:worker:<id>``           hash    a worker's queues, pid, host, start time,
                                      jobs done, ``slots`` (the jobs it runs at
                                      once; absent: 1); 60 s TTL, renewed by
                                      heartbeat
``{P}:schedulers``            zset    scheduler ids by last step (ms)
``{P}:group:<gid>``           hash    a group: ``size`` (members stored),
                                      ``total`` (set when its last batch is
                                      stored: the group is sealed), ``ended``,
                                      ``failed``, ``callback`` (job id),
                                      ``created_at``, ``finished_at``,
                                      ``cancelled``. TTL from creation until
                                      sealed, and once every member ended
                                      (enqueue_linked, record_outcome)
``{P}:group:<gid>:members``   list    the members' ids, in the order given; TTL
                                      as the group's
``{P}:group:<gid>:done``      list    one token pushed when the last member
                                      ends, for ``wait()``; 60 s TTL
``{P}:groups``                zset    group ids by creation (ms), for the
                                      dashboard; no TTL: a group's enqueue trims
                                      the groups created over a result TTL ago
                                      whose record is gone, never a live one
``{P}:broadcast:seq``         string  the last broadcast message's number
``{P}:broadcast:unread``      zset    numbers of the messages some live worker
                                      has not read yet, by number (broadcast;
                                      trimmed by receive and the tick)
``{P}:broadcast:cursors``     zset    worker id -> number of the last message it
                                      read (heartbeat sets it at the current
                                      number: a new worker replays nothing;
                                      receive; dropped after a lease of silence)
``{P}:broadcast:msg:<n>``     hash    a message: ``payload``, ``queue`` (only
                                      workers serving it run it; '' for all),
                                      ``sent_at``, and ``ran:<worker>`` = the
                                      outcome per worker. Result TTL
``{P}:broadcast:sent``        zset    message numbers by send time (ms), for the
                                      dashboard; trimmed to the result TTL
``{P}:broadcast:wake:<wid>``  list    wake-up token for an idle worker when a
                                      message is sent; at most one; 60 s TTL
``{P}:periodic``              set     names of the periodic schedules registered
                                      (periodic.lua: sync adds and removes them)
``{P}:periodic:<name>``       hash    a schedule: ``last`` (ms of the last
                                      occurrence enqueued, or passed while
                                      paused), ``last_job`` (its job id, or the
                                      "run now" job's), ``last_at`` (ms, when
                                      that job was stored), ``next`` (ms of the
                                      next occurrence, for the dashboard),
                                      ``paused`` (1), ``spec`` (the definition,
                                      JSON), ``timetable`` (when it runs: the
                                      timetable in force, of the last sync),
                                      ``skipped`` (occurrences missed and not
                                      enqueued). No TTL: sync deletes it when
                                      the schedule leaves settings (periodic.lua)
``{P}:unique:<key>``          string  the id of the job holding a unique key: no
                                      TTL until the job ends (its ``unique`` field
                                      names the key); then deleted, or kept for
                                      the rest of its ``unique_until`` (store_outcome)
``{P}:limit:<key>:running``   set     ids of the key's RUNNING jobs, whatever their
                                      limits (claim adds; a finish, a give-back or
                                      a recovery removes)
``{P}:limit:<key>:starts``    zset    ``<id>@<ms>``: starts of the key's jobs by
                                      claim time (ms), the newest ``starts`` of its
                                      window; TTL its window's ``ms`` (claim)
``{P}:limit:<key>:window``    hash    ``starts`` (the largest rate) and ``ms`` (the
                                      longest period) of the key's jobs; a day past
                                      ``ms`` after the last enqueue or start of one
                                      with a rate
``{P}:limit:<key>:parked``    zset    ids of READY jobs parked over the limit, by
                                      their queue score (claim parks; a freed
                                      slot or the tick unparks)
``{P}:limits``                zset    limit keys whose parked jobs the tick looks
                                      at, by when (ms): a rate window frees a start,
                                      or a lease later as a safety net
``{P}:idlers:<name>``         zset    worker ids registered idle on the queue, by
                                      the ms of their registration (a claim that
                                      found nothing); an entry whose worker's
                                      ``idle-worker`` key holds another ms is stale
                                      and dropped when met (claim, enqueue); TTL
                                      the registration's
``{P}:idle-worker:<wid>``     string  ``<ms>|<queue>,<queue>,...``: the worker's
                                      standing idle registration and the order of
                                      its queues; gone once a job is handed to it
                                      or its next claim; TTL a few idle waits
``{P}:handoff:<wid>``         list    the claim reply (JSON) of the job an enqueue
                                      handed to the idle worker; at most one;
                                      BLPOPed first by the worker's wait, else
                                      taken by its next claim; TTL the hand-off's
                                      (enqueue, claim, tick, abandon)
``{P}:handed``                zset    ids of RUNNING jobs handed to idle workers
                                      and not yet taken; score is the hand-off's
                                      deadline in ms, when the tick gives the job
                                      back (enqueue; claim and heartbeat take;
                                      tick, abandon)
``{P}:relayed``               zset    ids of the jobs outbox relays stored, by the
                                      ms of the latest relay; kept until the job's
                                      row is deleted, whatever the job's TTL
                                      (enqueue, enqueue_linked; ZREM by the relay)
============================  ======  ===========================================

Job hash fields of the fan-out: ``group`` (a member: the group's id), ``counted``
(set once the member's end was counted in its group), ``after`` (a job that waits:
the id of the job it runs after, or ``group:<gid>`` for a group's callback),
``waiting`` (1 while it waits: READY but in no queue and no delayed set), ``due``
(a waiting job's ``run_after``, ms), ``then`` (ids of the jobs waiting for this one,
comma-separated).

Job hash fields of unique jobs and limits: ``unique`` (the unique key it holds until
it ends), ``unique_until`` (ms: with ``unique_for``, the key is kept until then),
``limit`` (its limit key), ``max_running``, ``rate`` (``<starts>/<ms>``),
``parked`` (the limit key, while parked: READY but in no queue and no delayed set).

Every Lua script gets one key (``script_keys``): the prefix with its hash tag and a
colon. ``lua/lib/keys.lua``, which every script includes (itself or through another
shared file), completes it with the names above, which it spells as this module does
(``fixed_keys`` gives its names; a test checks that they agree), and with an id or a
queue name, which a claim or a promotion learns only inside the script. Those keys
carry the one hash tag, so Cluster keeps them on that key's slot. One key instead of
fourteen saves every call the packing and the checking of thirteen arguments.
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
            "HANDOFF": self.handoff(""),
            "HANDED": self.handed,
            "RELAYED": self.relayed,
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
