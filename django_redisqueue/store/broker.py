"""The protocol's writes: every move of a job, each an atomic Lua script.

The rest of the code speaks verbs (``enqueue``, ``claim``, ``finish``,
``wait_for_work``, ``heartbeat``, ``watch``); the keys come from ``keys.py`` and
the atomic steps are the Lua scripts in ``lua/`` (each with the shared files of
``lua/lib/`` it includes: ``scripts.py``), called as Redis Functions where Redis has
them, else by SHA (``calls.py``). The read-side queries
are in ``queries.py``; both go through ``gateway.Gateway``.
``docs/protocol.md`` explains the delivery protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from django_redisqueue.store.calls import NotReplicated, ScriptCalls, UnreplicatedWrites
from django_redisqueue.store.connection import Client
from django_redisqueue.store.gateway import Gateway, sync, text
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.wire import (
    AFTER_GROUP,
    Claimed,
    MissingJob,
    NewJob,
    Outcome,
    PeriodicReply,
    Received,
    Tick,
    chains_together,
    claimed_from_reply,
    enqueue_batches,
    enqueue_reply,
)

logger = logging.getLogger(__name__)


# Seconds a worker's record outlives its last heartbeat.
WORKER_TTL = 60
# How long (ms) a job handed to an idle worker waits for the worker to take it before
# the scheduler gives it back (docs/protocol.md, "The hand-off"): a live worker takes it
# within a round trip; a dead, frozen or cut-off one leaves it this long, not a lease.
HANDED_MS = 1000


class Broker(Gateway):
    """The protocol's moves of one backend's jobs: each an atomic script."""

    def __init__(
        self,
        client: Client,
        keys: KeySchema,
        *,
        lease: float,
        result_ttl: int,
        replica_acks: int = 0,
        replica_acks_timeout: float = 1.0,
    ) -> None:
        super().__init__(client, keys)
        self.lease_ms = int(lease * 1000)
        self.handed_ms = HANDED_MS
        self.result_ttl = result_ttl
        self.replica_acks = replica_acks
        self.replica_acks_timeout = replica_acks_timeout
        self.scripts = ScriptCalls(client, self._script_keys, self._server, self._lost_server)
        # The number of the last broadcast message, as the latest claim saw it.
        self.last_broadcast = 0
        self.unreplicated = UnreplicatedWrites()

    def _on(self, client: redis.Redis) -> Broker:
        """This broker's calls on ``client`` (``Gateway.pinned``): the same settings,
        and what the backend's broker has learnt (no Functions, writes too few
        replicas confirmed) shared."""
        pinned = Broker(
            client,
            self.keys,
            lease=self.lease_ms / 1000,
            result_ttl=self.result_ttl,
            replica_acks=self.replica_acks,
            replica_acks_timeout=self.replica_acks_timeout,
        )
        pinned.unreplicated, pinned.handed_ms = self.unreplicated, self.handed_ms
        pinned.scripts.functions = self.scripts.functions
        return pinned

    def _run(self, script: str, *args: Any, acked: bool = False) -> Any:
        """Call a script. ``acked``: a write that waits for REPLICA_ACKS replicas (if
        set); when too few confirm it, say so in the log and carry on (a job's move
        lost with a failed master is redone: it runs again, at least once)."""
        if self._held_used_at is not None:
            self._look_at_held_connection()
        if not (acked and self.replica_acks):
            return self.scripts.call(script, args)
        try:
            return self._run_many([(script, args)])[0]
        except NotReplicated as exc:
            self.unreplicated.note(script, exc)
            return exc.replies[0]

    def _run_many(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """Call scripts in one round trip (ScriptCalls.run_many), with this backend's
        REPLICA_ACKS."""
        return self.scripts.run_many(
            calls,
            lambda pipe: self._execute(pipe, raise_on_error=False),
            self._lost_server,
            self.replica_acks,
            self.replica_acks_timeout,
        )

    # Producers

    def enqueue(
        self, jobs: Sequence[NewJob], *, record_queues: bool = False, relayed: bool = False
    ) -> list[int | str | None]:
        """Store jobs in one round trip: one script call per ENQUEUE_BATCH_JOBS jobs
        (or ENQUEUE_BATCH_BYTES of payload), each call atomic. ``record_queues``: add
        the queues' names to the queues used. ``relayed``: an outbox relay sends them,
        and a job relayed before is not stored again, whatever became of it
        (``forget_relayed``). Returns each job's enqueue time (ms), None for a job whose
        id is taken or that was relayed before (that job changes nothing), or, for a
        job whose unique key another job holds, that job's id (it is not stored)."""
        if not jobs:
            return []
        head = [int(record_queues), self.handed_ms, int(relayed)]
        calls = [("enqueue", [*head, *args]) for args in enqueue_batches(jobs)]
        if len(calls) == 1 and not self.replica_acks:
            with self.spares.lend() as broker:
                # Looked at every time (the call's own look then finds it fresh): a
                # refused enqueue fails a user's request.
                broker._look_at_held_connection(after=0.0)
                replies = [broker._run("enqueue", *calls[0][1])]
        else:
            replies = self._run_many(calls)
        return [enqueue_reply(reply) for replies_of_call in replies for reply in replies_of_call]

    def forget_relayed(self, job_ids: Sequence[str]) -> None:
        """Drop the relay records of jobs whose outbox rows are deleted: none can be
        relayed again (docs/protocol.md, "The outbox's relay")."""
        if job_ids:
            self.client.zrem(self.keys.relayed, *job_ids)

    def relayed_jobs(self, before_ms: int, start: int, count: int) -> list[str]:
        """The ids of up to ``count`` relay records last relayed before ``before_ms``
        (Redis's clock), from place ``start``, the longest unrelayed first."""
        page = self.client.zrangebyscore(self.keys.relayed, "-inf", f"({before_ms}", start, count)
        return [text(job_id) or "" for job_id in sync(page)]

    def cancel(self, job_id: str, error: str) -> str | None:
        """Cancel a READY job; return "CANCELLED", or the status that prevents it."""
        return text(self._run("cancel", job_id, self.result_ttl, error, acked=True)) or None

    def stop(self, job_id: str, error: str) -> str | None:
        """Ask a RUNNING job to stop (stop.lua); return "STOPPING", "STOPPED" (handed,
        not started) or the status of a job that is not running (None: no such job)."""
        reply = self._run("stop", job_id, self.result_ttl, self.lease_ms, error, acked=True)
        return text(reply) or None

    # Workers

    def claim(
        self,
        queues: Sequence[str],
        worker_id: str,
        finished: Outcome | None = None,
        *,
        woken_by: str = "",
        broadcasts: bool = True,
        take_handed: bool = False,
        idle_ms: int | None = None,
    ) -> tuple[bool | None, Claimed | None]:
        """Store ``finished`` (if any), then claim the next job from the first
        non-empty queue of ``queues`` (none: only store). ``woken_by``: the queue whose
        wake-up token the worker took since its last claim; the claim passes it on if
        that queue still holds jobs. ``broadcasts``: read the last broadcast's number
        into ``last_broadcast`` too (else it keeps the number it had). ``take_handed``:
        the worker registered as idle since its last claim that named queues, so the
        job handed to it meanwhile, if any, is the one claimed. ``idle_ms``: finding no
        job, the worker registers as idle for that long, to be handed the next job of
        its queues (docs/protocol.md, "The hand-off").

        Returns whether the outcome was stored (False: the caller no longer owned the
        job; None: there was none) and the job claimed, if any.
        """
        outcomes = [finished] if finished else []
        args: list[Any] = [
            self.lease_ms,
            worker_id,
            self.result_ttl,
            woken_by,
            "1" if broadcasts else "",
            "1" if take_handed else "",
            "" if idle_ms is None else idle_ms,
            len(outcomes),
        ]
        for outcome in outcomes:
            args += outcome.as_args()
        stored, claimed, last_broadcast = self._run("claim", *args, *queues, acked=True)
        if broadcasts:
            self.last_broadcast = int(last_broadcast)
        job = claimed_from_reply(claimed) if claimed else None
        return (bool(stored[0]) if stored else None), job

    def finish(self, outcome: Outcome) -> bool:
        """Store a job's outcome; False if the caller no longer owns the job."""
        return bool(self.claim((), "", outcome, broadcasts=False)[0])

    def abandon(
        self,
        worker_id: str,
        *,
        handed_only: bool = False,
        keep: Iterable[tuple[str, str]] = (),
    ) -> list[str]:
        """Give back, uncounted, every job ``worker_id`` owns but the attempts it
        ``keep``s, (job id, owner token) pairs (running in its other slots); return their
        ids. Its registration as idle ends.
        ``handed_only``: only the job handed to it that it has not taken (a worker that
        stops while idle holds no other): one job looked at, not every running one."""
        given_back = self._run(
            "abandon",
            worker_id,
            self.result_ttl,
            self.lease_ms,
            "1" if handed_only else "",
            *(part for pair in keep for part in pair),
            acked=True,
        )
        return [text(job_id) or "" for job_id in given_back]

    def wait_for_stops(self, worker_id: str, timeout: float) -> tuple[str, str] | None:
        """Block up to ``timeout`` s for an attempt the worker is asked to stop: its job
        id and owner token."""
        reply = self._blpop([self.keys.stops(worker_id)], timeout)
        job_id, _, owner = (text(reply[1]) or "").partition(" ") if reply else ("", "", "")
        return (job_id, owner) if job_id else None

    def wait_for_work(
        self, queues: Sequence[str], timeout: float, worker_id: str = ""
    ) -> str | Claimed | None:
        """Block until a wake-up token arrives for one of ``queues`` (or, with
        ``worker_id``, a job handed to that worker or a broadcast message for it), or
        the timeout. Return the job handed over, which the worker takes (``heartbeat``)
        before it runs it; or the
        queue whose token was taken ('' for a broadcast; None: the timeout)."""
        wakes = [*map(self.keys.wake, queues)]
        if worker_id:
            # A handed job first: it is this worker's to take (HANDED, not yet RUNNING).
            wakes = [self.keys.handoff(worker_id), *wakes, self.keys.broadcast_wake(worker_id)]
        # execute_command: Redis takes a fractional timeout, which some redis-py
        # versions' annotations of blpop refuse.
        taken = self._blpop(wakes, timeout)
        if taken is None:
            return None
        key = text(taken[0]) or ""
        if worker_id and key == self.keys.handoff(worker_id):
            return claimed_from_reply(taken[1]) or ""  # (nothing handed: the worker claims)
        if not key.startswith(self.keys.wake_prefix):
            return ""
        return key.removeprefix(self.keys.wake_prefix)

    def heartbeat(
        self,
        worker_id: str,
        info: Mapping[str, str | int],
        owned: Mapping[str, str],
        traces: Mapping[str, str] | None = None,
    ) -> tuple[list[str], list[str]]:
        """Record the worker as alive (for the dashboard) and extend the leases of the
        jobs it still owns (id: owner token), storing their running attempts' trace
        records (``traces``, id: record); return the ids it no longer owns, and those
        of the jobs it owns that were asked to stop."""
        args: list[Any] = [self.lease_ms, worker_id, WORKER_TTL, len(info)]
        for name, value in info.items():
            args += [name, value]
        for job_id, owner in owned.items():
            args += [job_id, owner, (traces or {}).get(job_id, "")]
        lost, stopping = self._run("heartbeat", *args)
        return [text(i) or "" for i in lost], [text(i) or "" for i in stopping]

    def report_progress(self, reports: Sequence[tuple[str, str, str]]) -> list[bool]:
        """Store running jobs' progress (job id, owner token, record), each only while
        its job is its owner's; True per report stored."""
        args = [value for report in reports for value in report]
        return [bool(stored) for stored in self._run("progress", *args)] if args else []

    # Schedulers

    def tick(
        self,
        scheduler_id: str,
        queues: Sequence[str],
        *,
        batch: int,
        lost_limit: int,
        lost_error: str,
        recover: bool = True,
        recover_until_ms: int = 0,
        ran_out_by_ms: int | None = None,
        grace_ms: int = 0,
    ) -> Tick:
        """Promote the due delayed jobs of ``queues`` and (``recover``) recover jobs
        whose lease has passed, unless the step runs after ``recover_until_ms`` by
        Redis's clock (0: whenever it runs). Only leases that ran out by
        ``ran_out_by_ms`` (Redis's clock at an earlier step, ``grace_ms`` ago; None: by
        now) are recovered; for one that ran out since, the next step is due in
        ``grace_ms`` (docs/protocol.md, "tick"). Handed jobs not taken in time go back
        whatever the flags."""
        promoted, recovered, failed, next_at, now, held, overdue, handed = self._run(
            "tick",
            scheduler_id,
            batch,
            lost_limit,
            self.result_ttl,
            lost_error,
            int(recover),
            recover_until_ms,
            self.lease_ms,
            "" if ran_out_by_ms is None else ran_out_by_ms,
            grace_ms,
            *queues,
        )
        next_at = int(next_at)
        next_in = None if next_at < 0 else max(next_at - int(now), 0) / 1000
        return Tick(
            int(promoted),
            int(recovered),
            int(failed),
            next_in,
            int(now),
            bool(held),
            bool(overdue),
            int(handed),
        )

    def wait_for_schedule(self, timeout: float) -> bool:
        """Block until a job becomes the first due, or the timeout (~0.1 s precise)."""
        return self._blpop([self.keys.scheduler_wake], timeout) is not None

    def _blpop(self, wakes: Sequence[str], timeout: float) -> Any:
        """BLPOP wake-up lists. One of another type (written by hand) would refuse every
        wait: it holds no token, and is deleted (the next wait blocks as it should)."""
        try:
            return sync(self.client.execute_command("BLPOP", *wakes, timeout))
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            for key in wakes:
                if text(sync(self.client.type(key))) not in ("list", "none"):
                    self.client.delete(key)
            return None

    # Results

    def watch(self, job_id: str) -> str | None:
        """Ask to be woken when the job finishes; return its status (None: no such job)."""
        return text(self._run("watch", job_id)) or None

    def wait_finished(self, job_id: str, timeout: float) -> bool:
        """Block until a watched job finishes; True if it did within ``timeout``.

        BLMOVE from the list to itself leaves the token in place for other waiters.
        """
        done = self.keys.done(job_id)
        # Redis takes a fractional timeout; redis-py's annotation of blmove says int.
        return (
            self.client.execute_command("BLMOVE", done, done, "LEFT", "RIGHT", timeout) is not None
        )

    # Liveness, for the dashboard

    def unregister_worker(self, worker_id: str) -> None:
        pipe = self._pipeline(transaction=False)
        pipe.zrem(self.keys.workers, worker_id)
        pipe.delete(self.keys.worker(worker_id), self.keys.broadcast_wake(worker_id))
        pipe.zrem(self.keys.broadcast_cursors, worker_id)
        self._execute(pipe)

    def unregister_scheduler(self, scheduler_id: str) -> None:
        """The twin of unregister_worker: a scheduler that stopped is no longer live
        (its step registers it; see ``tick``)."""
        self.client.zrem(self.keys.schedulers, scheduler_id)

    # Fan-out: groups, chains, broadcast (docs/protocol.md, "Fan-out")

    def enqueue_linked(
        self,
        jobs: Sequence[NewJob],
        *,
        group_id: str = "",
        record_queues: bool = False,
        relayed: bool = False,
    ) -> list[int | None]:
        """Store jobs that wait for others (``NewJob.after``) or form a group (its
        members, and its callback last), in one round trip: one atomic call per batch,
        the last one sealing the group. ``relayed``: as ``enqueue``'s (a job relayed
        before is skipped, and so is its look for the job it runs after). Returns each
        job's enqueue time (ms), or None for a job whose id is taken. Raises MissingJob,
        storing nothing, when a job names one to run after that does not exist."""
        position = {job.job_id: i for i, job in enumerate(jobs)}
        for i, job in enumerate(jobs):
            if position.get(job.after, -1) >= i:
                raise ValueError(f"Job {job.job_id} runs after a job stored after it.")
        # Jobs waited for from outside the batch: every call checks them all first.
        outside = sorted(
            {job.after for job in jobs if job.after not in ("", AFTER_GROUP)} - position.keys()
        )
        # A chain in one piece, so that a call holds it whole; a group's members in
        # their order, which is its results'.
        order = list(range(len(jobs))) if group_id else chains_together(jobs)
        batches = list(enqueue_batches([jobs[i] for i in order], linked=True))
        calls = [
            (
                "enqueue_linked",
                [
                    int(record_queues),
                    group_id,
                    int(i == len(batches) - 1),
                    self.result_ttl,
                    int(relayed),
                    len(outside),
                    *outside,
                    *args,
                ],
            )
            for i, args in enumerate(batches)
        ]
        if len(calls) == 1 and not self.replica_acks:
            replies = [self._run("enqueue_linked", *calls[0][1])]
        else:
            replies = self._run_many(calls)
        enqueued: list[int | None] = [None] * len(jobs)
        places = iter(order)
        for missing, reply in replies:
            if int(missing):
                raise MissingJob(text(reply) or "")
            for at in reply:
                enqueued[next(places)] = int(at) or None
        return enqueued

    def wait_group(self, group_id: str, timeout: float) -> bool:
        """Block until the group's last member ends (a token pushed then), or the
        timeout; True if the token came. BLMOVE leaves it for other waiters."""
        done = self.keys.group_done(group_id)
        return (
            self.client.execute_command("BLMOVE", done, done, "LEFT", "RIGHT", timeout) is not None
        )

    def cancel_group(self, group_id: str, error: str, slice_size: int = 1000) -> int:
        """Cancel every member of a group that has not started, then its callback, a
        slice of members per call; return how many jobs were cancelled."""
        cancelled, start = 0, 0
        while start >= 0:
            count, start = self._run(
                "cancel_group", group_id, self.result_ttl, error, start, slice_size, acked=True
            )
            cancelled += int(count)
            start = int(start)
        return cancelled

    def broadcast(self, payload: str, queue: str = "") -> int:
        """Send a message to every live worker (or those serving ``queue``); return
        its number."""
        return int(self._run("broadcast", payload, queue, self.result_ttl, self.lease_ms))

    def receive(
        self,
        worker_id: str,
        queues: Sequence[str],
        ran: Sequence[tuple[int, str]] = (),
        most: int = 100,
    ) -> Received:
        """Record how the broadcast messages ``ran`` ended (number, SUCCESSFUL or
        FAILED), then read up to ``most`` of the ones this worker has not read, and take
        those for it: call again while ``more``, even when none was taken."""
        args: list[Any] = [worker_id, ",".join(queues), self.lease_ms, most]
        for number, status in ran:
            args += [number, status]
        more, *taken = self._run("receive", *args)
        messages = [
            (int(n), text(p) or "")
            for n, p in zip(map(text, taken[::2]), taken[1::2], strict=True)
            if n and n.isdigit()  # a member written by hand is no message number
        ]
        return Received(messages, bool(int(more)))

    # Periodic (docs/protocol.md, "Periodic jobs"; lua/periodic.lua)

    def periodic_sync(
        self, schedules: Sequence[tuple[str, str, str, int | str]]
    ) -> tuple[list[int | None], list[str], list[str]]:
        """Register schedules given as (name, spec JSON, timetable, next occurrence ms
        or '' for none), and delete the state of every other one; a schedule whose
        timetable is not the one in force starts now. Returns each schedule's ``last``
        (None for a name refused), the names whose state was deleted, and those whose
        timetable changed."""
        args: list[Any] = ["sync", len(schedules)]
        for name, spec, timetable, next_ms in schedules:
            args += [name, spec, timetable, next_ms]
        lasts, removed, edited = self._run("periodic", *args, acked=True)
        return (
            [int(last) if int(last) >= 0 else None for last in lasts],
            [text(name) or "" for name in removed],
            [text(name) or "" for name in edited],
        )

    def periodic_run(
        self,
        name: str,
        *,
        timetable: str,
        expected_last: int | None,
        now_ms: int,
        next_ms: int,
        skipped: int,
        queue: str,
        priority: int,
        payload: str,
        jobs: Sequence[tuple[int, str]],
        record_queues: bool = False,
        options: str = "",
    ) -> PeriodicReply:
        """Enqueue a schedule's occurrences ``jobs`` (occurrence ms, job id), oldest
        first, if ``timetable`` is the one in force and its ``last`` is still
        ``expected_last``; each once, whoever calls."""
        args: list[Any] = [
            "run",
            name,
            timetable,
            "" if expected_last is None else expected_last,
            now_ms,
            next_ms,
            skipped,
            queue,
            priority,
            payload,
            int(record_queues),
            options,
        ]
        for at, job_id in jobs:
            args += [at, job_id]
        status, last, stored, last_job = self._run("periodic", *args, acked=True)
        return PeriodicReply(text(status) or "", int(last), int(stored), text(last_job) or "")

    def periodic_pause(self, name: str, paused: bool = True) -> None:
        """Pause a schedule (its occurrences pass without a job), or resume it (from
        now: the paused time is not caught up)."""
        self._run("periodic", "pause" if paused else "resume", name, acked=True)

    def periodic_run_now(
        self, name: str, job: NewJob, *, record_queues: bool = False
    ) -> int | str | None:
        """Enqueue ``job`` for schedule ``name`` at once, recorded as its last job (its
        ``last`` occurrence unchanged); its enqueue time (ms), None if the id is taken,
        or, for a unique task whose key a job holds, that job's id (nothing stored)."""
        at = self._run(
            "periodic",
            "run_now",
            name,
            job.job_id,
            job.payload,
            job.queue,
            job.priority,
            int(record_queues),
            job.options,
            acked=True,
        )
        return text(at[0]) if isinstance(at, list) else int(at) or None

    # Operators

    def operate(self, action: str, queue: str, job_ids: Sequence[str] = (), limit: int = 0) -> int:
        """Apply a dashboard action (see lua/operate.lua); return how many it changed."""
        changed = self._run(
            "operate", action, queue, limit or len(job_ids), self.result_ttl, *job_ids, acked=True
        )
        return int(changed)

    # Inspection: bounded reads only (no KEYS, no scans, pages of a known size)

    def add_metrics(self, counts: Mapping[str, int], sums: Mapping[str, float]) -> list[str]:
        """Add a worker's counts (HINCRBY) and sums (HINCRBYFLOAT: a field that holds
        a fraction refuses HINCRBY) to the metrics hash (observe/metrics.py) in one round trip;
        return the fields Redis refused, whose amounts were not added."""
        pipe = self._pipeline(transaction=False)
        for name, count in counts.items():
            pipe.hincrby(self.keys.metrics, name, count)
        for name, amount in sums.items():
            pipe.hincrbyfloat(self.keys.metrics, name, amount)
        replies = self._execute(pipe, raise_on_error=False)
        names = [*counts, *sums]
        return [
            name
            for name, reply in zip(names, replies, strict=True)
            if isinstance(reply, Exception)
        ]
