"""The scheduler loop: promote delayed jobs when due, recover jobs of lost workers, and
enqueue the occurrences of periodic jobs (``runtime/periodic.py``).

Each step is one atomic script (``lua/tick.lua``), so any number of schedulers may run
side by side. Between steps the scheduler sleeps until the next due job or lease
deadline, which the step returns as a duration by Redis's clock, not as a time; a job
that becomes the first due wakes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from collections import deque
from types import FrameType

from django.db import close_old_connections, connections

from django_redisqueue.backends import outbox
from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.core.jobs import error_info, to_json
from django_redisqueue.exceptions import WorkerLost
from django_redisqueue.runtime import SCHEDULER_IDLE_WAIT
from django_redisqueue.runtime.heartbeat import HEARTBEAT_RETRY
from django_redisqueue.runtime.outbox_watch import OutboxWatch
from django_redisqueue.runtime.periodic import PeriodicStep
from django_redisqueue.store.calls import NotReplicated
from django_redisqueue.store.gateway import REDIS_ERRORS, Reconnector

logger = logging.getLogger(__name__)

# Longest sleep when nothing is due (runtime.SCHEDULER_IDLE_WAIT says why): well under
# redis-py's default socket timeout (5 s), which a longer blocking call would hit.
IDLE_WAIT = SCHEDULER_IDLE_WAIT
# Below this, sleep on the local clock: Redis's blocking timeouts are ~0.1 s coarse.
LOCAL_SLEEP_BELOW = 0.25
# Most jobs each kind of move handles per step; a full batch runs the next step at once.
BATCH = 500
# How often the outbox is relayed (s) while it holds nothing to relay.
RELAY_EVERY = 1.0
# How often (s) a scheduler deletes the Functions libraries of other versions.
PRUNE_FUNCTIONS_EVERY = 3600.0
# A step that reaches Redis later than expected by this share of the lease was held
# on its way, and so were the workers' heartbeats: it recovers no lease. Held for
# less, no live worker's lease can run out, as heartbeats renew it every third of it.
HELD_SHARE_OF_LEASE = 0.25


def recovery_grace(lease: float) -> float:
    """How long before a step (s) an earlier step must have run for the leases that ran
    out by then to be recovered: a live worker's heartbeat, refused while Redis held
    every client, tries again every HEARTBEAT_RETRY s; it gets a few tries, or a share
    of the lease (docs/protocol.md, "tick")."""
    return max(HELD_SHARE_OF_LEASE * lease, 4 * HEARTBEAT_RETRY)


class _Interrupted(Exception):
    """Raised by the signal handler to end a blocking wait at once."""


class Scheduler:
    def __init__(
        self,
        backend: RedisQueueBackend,
        *,
        burst: bool = False,
        idle_wait: float = IDLE_WAIT,
        grace: float | None = None,
    ) -> None:
        """``grace``: how long before a step an earlier step must have run for the
        leases that ran out by then to be recovered (s); by default
        ``recovery_grace(LEASE)``."""
        self.backend = backend
        self.idle_wait = idle_wait
        self.broker = backend.broker
        self.burst = burst
        self.scheduler_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.stopping = False
        self.waiting = False
        # Also without schedules: its sync deletes the state of schedules removed.
        self.periodic = PeriodicStep(backend)
        self.next_relay = 0.0  # when to relay the outbox again (monotonic)
        self.sweep_from = 0  # where the next sweep of the relay records starts
        self.outbox_watch = OutboxWatch(
            logger, f"Scheduler {self.scheduler_id}", backend.config.outbox
        )
        self.next_prune = 0.0  # when to delete other versions' libraries (monotonic)
        # After a Redis error, leases are not recovered until a lease has passed since
        # Redis answered again (a monotonic time): workers whose heartbeats failed alike
        # get that long to renew them. Counted from the first reply, not from the error,
        # because a command can be held (CLIENT PAUSE, a busy script) for longer.
        self.recover_after = 0.0
        self.redis_failed = False
        # The steps since the latest one a grace ago: Redis's clock then, and this host's
        # monotonic clock when the reply came. The last one tells what Redis's clock
        # should read at the next step, if nothing held it (_recover_until_ms); the
        # first, which leases may be recovered (_ran_out_by_ms).
        self.grace = recovery_grace(backend.config.lease) if grace is None else grace
        self.steps: deque[tuple[int, float]] = deque()
        self.lost_error = to_json(
            error_info(
                WorkerLost(
                    "The worker running this job was lost (killed, or stalled past its "
                    f"lease) more than {backend.config.max_recoveries} time(s); the task "
                    "may be what kills its worker."
                )
            )
        )

    def run(self) -> None:
        """Promote and recover until stopped (or, in burst mode, until nothing is due)."""
        logger.info("Scheduler %s started (backend %r)", self.scheduler_id, self.backend.alias)
        try:
            with contextlib.suppress(_Interrupted):
                self._loop()
        finally:
            with contextlib.suppress(*REDIS_ERRORS):  # else it ages out of the live ones
                self.broker.unregister_scheduler(self.scheduler_id)
        logger.info("Scheduler %s stopped", self.scheduler_id)

    def _loop(self) -> None:
        backoff = Reconnector(logger, f"Scheduler {self.scheduler_id}", where=self.broker.describe)
        while not self.stopping:
            try:
                recover = not self.redis_failed and time.monotonic() >= self.recover_after
                tick = self.broker.tick(
                    self.scheduler_id,
                    self.backend.served_queues(),
                    batch=BATCH,
                    lost_limit=self.backend.config.max_recoveries,
                    lost_error=self.lost_error,
                    recover=recover,
                    recover_until_ms=self._recover_until_ms(),
                    ran_out_by_ms=self._ran_out_by_ms(),
                    grace_ms=int(self.grace * 1000),
                )
                self.steps.append((tick.now_ms, time.monotonic()))
                periodic_in = self._periodic_step(tick.now_ms)
                relayed = self._relay_step(tick.now_ms)
                self._prune_step()
                if tick.held:
                    logger.warning(
                        "Scheduler %s: Redis held a step; no lease is recovered for the "
                        "next %.1f s, while workers renew theirs",
                        self.scheduler_id,
                        self.backend.config.lease,
                    )
                if self.redis_failed or tick.held:
                    self.redis_failed = False
                    self.recover_after = time.monotonic() + self.backend.config.lease
                backoff.succeeded()
            except REDIS_ERRORS as exc:
                self._failed(backoff, exc)
                continue
            if tick.handed_back:
                logger.info(
                    "Scheduler %s: gave back %d job(s) handed to idle workers that did not "
                    "take them (dead, frozen or cut off); they run elsewhere",
                    self.scheduler_id,
                    tick.handed_back,
                )
            if tick.promoted or tick.recovered or tick.failed:
                logger.info(
                    "Scheduler %s: promoted %d due job(s), recovered %d lost job(s), "
                    "failed %d lost too often",
                    self.scheduler_id,
                    tick.promoted,
                    tick.recovered,
                    tick.failed,
                )
            next_in = _sooner(tick.next_in, periodic_in)
            if next_in == 0 or relayed >= outbox.RELAY_BATCH:
                continue  # a batch was full
            if self.burst and not tick.overdue:
                break  # (a lease that ran out is recovered first, after its grace)
            try:
                self.sleep(next_in)
            except REDIS_ERRORS as exc:
                self._failed(backoff, exc)

    def _periodic_step(self, now_ms: int) -> float | None:
        """Sync the schedules when due, enqueue the occurrences due at ``now_ms``;
        return the seconds until the next one (None: no schedule)."""
        if self.periodic.due_for_sync(time.monotonic()):
            self.periodic.sync(now_ms, time.monotonic())
        return self.periodic.step(now_ms)

    def _prune_step(self) -> None:
        """Delete the Functions libraries of this app's other versions, at most once
        per PRUNE_FUNCTIONS_EVERY: so an old version's go within that time once its
        last process stops (docs/protocol.md, "Redis Functions")."""
        if time.monotonic() < self.next_prune:
            return
        self.next_prune = time.monotonic() + PRUNE_FUNCTIONS_EVERY
        pruned = self.broker.scripts.prune()
        if pruned:
            logger.info(
                "Scheduler %s: deleted %d Functions librar%s of other versions of this app",
                self.scheduler_id,
                len(pruned),
                "y" if len(pruned) == 1 else "ies",
            )

    def _relay_step(self, now_ms: int) -> int:
        """Relay what the outboxes hold, at most once per RELAY_EVERY, and sweep their
        relay records by Redis's time ``now_ms`` (the step's); return how many jobs. A
        database error is logged, and the step is tried again next time."""
        if not self.backend.config.outbox or time.monotonic() < self.next_relay:
            return 0
        self.next_relay = time.monotonic() + RELAY_EVERY
        close_old_connections()
        try:
            relayed = self.backend.outbox.relay_left()
            self.sweep_from = outbox.sweep_records(
                self.broker, self.backend.config.outbox, self.sweep_from, now_ms=now_ms
            )
        except NotReplicated as exc:
            # The master holds the jobs; their rows stay until a relay is confirmed
            # (relayed again, they store nothing). Not Redis failing: leases still go.
            self.broker.unreplicated.note("enqueue", exc)
            return 0
        except outbox.OUTBOX_ERRORS as exc:
            self.outbox_watch.failed(exc)
            for database in self.backend.config.outbox:
                with contextlib.suppress(*outbox.OUTBOX_ERRORS):  # (one Django cannot load)
                    connections[database].close()  # a new connection at the next step
            return 0
        self.outbox_watch.succeeded()
        if relayed:
            logger.info(
                "Scheduler %s: relayed %d job(s) from the outbox", self.scheduler_id, relayed
            )
            self.next_relay = 0.0  # a full batch may leave more
        return relayed

    def _recover_until_ms(self) -> int:
        """The latest time by Redis's clock at which the next step may recover leases:
        when it was sent, by the last step's reading and this host's elapsed time
        (no clocks compared), plus a share of the lease; 0 before the first step."""
        if not self.steps:
            return 0
        redis_then, local_then = self.steps[-1]
        elapsed_ms = (time.monotonic() - local_then) * 1000
        return int(
            redis_then + elapsed_ms + HELD_SHARE_OF_LEASE * self.backend.config.lease * 1000
        )

    def _ran_out_by_ms(self) -> int:
        """Redis's clock at this scheduler's latest step a grace ago or more (0: none
        yet): the leases that ran out by then, while Redis answered, are recovered."""
        now = time.monotonic()
        while len(self.steps) >= 2 and now - self.steps[1][1] >= self.grace:
            self.steps.popleft()
        if self.steps and now - self.steps[0][1] >= self.grace:
            return self.steps[0][0]
        return 0

    def _failed(self, backoff: Reconnector, exc: Exception) -> None:
        self.redis_failed = True
        backoff.failed(exc)

    def sleep(self, seconds: float | None) -> None:
        """Sleep ``seconds``, at most ``idle_wait``; wake early when a job becomes the
        first due."""
        wait = self.idle_wait if seconds is None else min(seconds, self.idle_wait)
        if wait <= 0:
            return
        self.waiting = True
        started = time.monotonic()
        try:
            if wait < LOCAL_SLEEP_BELOW:
                time.sleep(wait)
            else:
                self.broker.wait_for_schedule(wait - LOCAL_SLEEP_BELOW / 2)
        finally:
            self.waiting = False
        # A wait that overran was held on its way (a busy script, CLIENT PAUSE, a stalled
        # host), as were the workers' heartbeats meanwhile, and no error said so: as
        # after a held step, leases are left to them for a lease.
        lease = self.backend.config.lease
        if time.monotonic() - started > wait + HELD_SHARE_OF_LEASE * lease:
            self.recover_after = time.monotonic() + lease

    def stop(self) -> None:
        self.stopping = True

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT (Ctrl-C) stop the scheduler after its current step."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        logger.info(
            "Scheduler %s: %s received, stopping", self.scheduler_id, signal.Signals(signum).name
        )
        self.stop()
        if self.waiting:
            # Nothing is half done while waiting: end the wait rather than sit it out.
            raise _Interrupted


def _sooner(a: float | None, b: float | None) -> float | None:
    """The smaller of two waits, None standing for no wait at all."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)
