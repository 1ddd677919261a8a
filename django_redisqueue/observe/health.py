"""The health probe of one backend (``manage.py queuehealth``): Redis answers and takes
writes, each queue has a live worker, a scheduler steps, no queue's next job waited too
long, the outbox is relayed. Each check's verdict, with the exit code that says it
failed; see docs/howto/metrics-health.md."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

from django_redisqueue.backends import outbox
from django_redisqueue.backends.redis import RedisQueueBackend
from django_redisqueue.observe.deadlines import raise_after
from django_redisqueue.store.gateway import REDIS_ERRORS
from django_redisqueue.store.queries import SCHEDULER_ALIVE_MS, Live, Queries, QueueCounts

HEALTHY = 0
# 1 is a CommandError's (unknown backend or queue) and 2 argparse's (a wrong option).
REDIS_UNHEALTHY = 3
NO_LIVE_WORKER = 4
NO_SCHEDULER = 5
WAITED_TOO_LONG = 6
OUTBOX_STUCK = 7

# Workers read per probe, the most recently seen first: far more than a fleet runs.
WORKERS_READ_LIMIT = 1000
SCHEDULERS_READ_LIMIT = 200


@dataclass
class Check:
    """One check's verdict, as printed and as JSON."""

    name: str  # redis, workers, scheduler, wait, outbox
    ok: bool
    message: str
    queue: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    code: int = HEALTHY  # the exit code when it failed

    def line(self) -> str:
        where = f"[{self.queue}]" if self.queue is not None else ""
        return f"{'OK  ' if self.ok else 'FAIL'} {self.name}{where}: {self.message}"

    @classmethod
    def raised(cls, name: str, what: str, exc: BaseException, code: int) -> Check:
        """The check failed on ``exc``: said after ``what``, named in the figures."""
        return cls(
            name,
            False,
            f"{what}: {type(exc).__name__}: {exc}",
            figures={"error": type(exc).__name__, "detail": str(exc)},
            code=code,
        )


class ProbeTimeout(Exception):
    """The probe took longer than twice --timeout. Not a Redis error, so that redis-py
    does not retry the command it interrupts; it drops that connection."""


# What makes Redis unhealthy for the probe: any error of Redis or of the connection.
PROBE_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ProbeTimeout, OSError)


class Probe:
    """The checks of one backend, each read from Redis with bounded reads."""

    def __init__(self, backend: RedisQueueBackend, options: dict[str, Any]) -> None:
        self.backend = backend
        self.timeout: float = options["timeout"]
        self.max_wait: float = options["max_wait"]
        self.max_outbox_age: float = options["max_outbox_age"]
        self.check_workers = not options["no_workers"]
        self.check_scheduler = not options["no_scheduler"]
        self.host = socket.gethostname() if options["this_host"] else None

    def run(self, queues: list[str]) -> list[Check]:
        """Every check; of Redis's, only the Redis one when Redis is unhealthy (nothing
        else can be read then). The outbox, in the database, is checked either way."""
        checks = self.redis_checks(queues)
        if self.max_outbox_age and self.backend.config.outbox:
            checks.append(self.outbox_check())
        return checks

    def outbox_check(self) -> Check:
        try:
            backlog = outbox.backlog(self.backend.config.outbox, self.backend.alias)
        except outbox.OUTBOX_ERRORS as exc:
            return Check.raised("outbox", "cannot be read", exc, OUTBOX_STUCK)
        age = backlog.age()
        late = age > self.max_outbox_age
        message = f"{backlog.jobs} committed job(s) waiting for the relay"
        if backlog.jobs:
            message += f", the oldest for {age:.1f} s"
        if late:
            message += f", over --max-outbox-age {self.max_outbox_age:g} s"
        return Check(
            "outbox",
            not late,
            message,
            figures={
                "jobs": backlog.jobs,
                "oldest_seconds": round(age, 3),
                "max_outbox_age": self.max_outbox_age,
            },
            code=OUTBOX_STUCK if late else HEALTHY,
        )

    def redis_checks(self, queues: list[str]) -> list[Check]:
        try:
            # A Redis that stalls after answering the ping, or a cluster client that
            # cannot connect, must not hold the probe, whatever the client's timeouts.
            limit = 2 * self.timeout
            with raise_after(
                limit, lambda: ProbeTimeout(f"Redis took over {limit:g} s to answer the probe")
            ):
                started = time.perf_counter()
                queries = self.backend.queries  # a cluster client connects as it is made
                queries.ping(self.timeout, write=True)
                answered_ms = (time.perf_counter() - started) * 1000
                return [self.redis_check(queries, answered_ms), *self.checks(queries, queues)]
        except PROBE_ERRORS as exc:
            return [self.redis_failed(exc)]

    def redis_check(self, queries: Queries, answered_ms: float) -> Check:
        server = queries.describe()  # with Sentinel, a question to a sentinel
        return Check(
            "redis",
            True,
            f"answered and accepts writes in {answered_ms:.1f} ms ({server})",
            figures={"answered_ms": round(answered_ms, 1), "server": server},
        )

    def redis_failed(self, exc: BaseException) -> Check:
        return Check.raised("redis", "unhealthy", exc, REDIS_UNHEALTHY)

    def checks(self, queries: Queries, queues: list[str]) -> list[Check]:
        queues = queues or self.backend.served_queues()
        counts = queries.counts(queues)
        now = queries.clock_ms()
        checks: list[Check] = []
        if self.check_workers:
            workers = self.here(self.backend.queries.live_workers(now, WORKERS_READ_LIMIT))
            checks += self.worker_checks(queues, counts, workers)
        if self.check_scheduler:
            schedulers = self.here(
                self.backend.queries.live_schedulers(now, SCHEDULERS_READ_LIMIT)
            )
            checks.append(self.scheduler_check(schedulers, now))
        if self.max_wait:
            checks += self.wait_checks(queues, counts, queries.head_waits(queues, now))
        return checks

    def here(self, processes: list[Live]) -> list[Live]:
        """``processes``, less those of other hosts with ``--this-host``."""
        return [p for p in processes if self.host is None or p.host == self.host]

    def worker_checks(
        self,
        queues: list[str],
        counts: dict[str, QueueCounts],
        workers: list[Live],
    ) -> list[Check]:
        where = " on this host" if self.host else ""
        if not queues:
            return [
                Check(
                    "workers",
                    True,
                    f"no queue used yet; {len(workers)} live worker(s){where}",
                    figures={"live_workers": len(workers)},
                )
            ]
        # A worker given no queue (QUEUES empty) serves every queue used.
        checks = []
        for queue in queues:
            serving = sum(1 for worker in workers if worker.serves(queue))
            paused = counts[queue].paused
            figures = {"live_workers": serving, "ready": counts[queue].ready, "paused": paused}
            if serving:
                message = f"{serving} live worker(s){where} serve it"
            else:
                message = f"no live worker{where} serves it"
            if paused:
                message += " (paused: not failing)"
            ok = bool(serving) or paused
            if not ok and workers:
                message += f"; {len(workers)} live worker(s){where} serve other queues"
            checks.append(
                Check("workers", ok, message, queue, figures, HEALTHY if ok else NO_LIVE_WORKER)
            )
        return checks

    def scheduler_check(self, schedulers: list[Live], now: int) -> Check:
        where = " on this host" if self.host else ""
        if not schedulers:
            return Check(
                "scheduler",
                False,
                f"no live scheduler{where} (none stepped in the last "
                f"{SCHEDULER_ALIVE_MS / 1000:g} s)",
                figures={"live_schedulers": 0},
                code=NO_SCHEDULER,
            )
        last_step = max(0.0, (now - max(s.seen_ms for s in schedulers)) / 1000)
        return Check(
            "scheduler",
            True,
            f"{len(schedulers)} live scheduler(s){where}, the last step {last_step:.1f} s ago",
            figures={"live_schedulers": len(schedulers), "last_step_age": round(last_step, 3)},
        )

    def wait_checks(
        self,
        queues: list[str],
        counts: dict[str, QueueCounts],
        waits: dict[str, float | None],
    ) -> list[Check]:
        checks = []
        for queue in queues:
            waited, paused = waits[queue], counts[queue].paused
            figures = {
                "waited": None if waited is None else round(waited, 3),
                "max_wait": self.max_wait,
                "ready": counts[queue].ready,
                "paused": paused,
            }
            late = waited is not None and waited > self.max_wait
            if waited is None:
                message = "empty"
            else:
                message = (
                    f"the next of {counts[queue].ready} ready job(s) has waited "
                    f"{waited:.1f} s" + (f", over --max-wait {self.max_wait:g} s" if late else "")
                )
            if paused:
                message += " (paused: not failing)"
            ok = not late or paused
            checks.append(
                Check("wait", ok, message, queue, figures, HEALTHY if ok else WAITED_TOO_LONG)
            )
        return checks
