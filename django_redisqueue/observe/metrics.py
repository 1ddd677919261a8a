"""Prometheus metrics: what workers count, and the exposition of every backend.

Workers sum their counts in memory and the heartbeat adds them to ``{P}:metrics``, so
that a job costs Redis no command more; the exposition (``render``) reads Redis on each
scrape, so every endpoint shows the whole backend (docs/reference/metrics.md). The text
format (version 0.0.4) is written here, without a dependency.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import logging
import math
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, cast

from django.db import connections

from django_redisqueue.backends import outbox
from django_redisqueue.core.jobs import owner_worker
from django_redisqueue.store.gateway import REDIS_ERRORS, reply_lost

if TYPE_CHECKING:
    from django_redisqueue.backends.redis import RedisQueueBackend
    from django_redisqueue.observe.events import JobEvent
    from django_redisqueue.store.queries import Live, QueueCounts

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Upper bounds (s) of the histograms' buckets, of a job's run and of its wait alike:
# 5 ms to 10 minutes, as jobs run.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
# The label of a task that is not registered in the worker that ran the job.
UNREGISTERED = "(unregistered)"
# Bounds of one scrape's reads: live workers and schedulers read, and queues exposed
# (with QUEUES empty, the first in alphabetical order). Far more than a fleet runs; past
# them the gauges undercount (so do the running jobs: queries.RUNNING_READ_LIMIT).
ALIVE_READ_LIMIT = 10_000
QUEUE_SERIES_LIMIT = 1000
SEPARATOR = "|"  # in the hash's field names: not in queue names nor task paths
# runworker --metrics-port: seconds a client has to send its request (and to take the
# answer), and the most requests served at once; a connection past them is closed.
REQUEST_TIMEOUT = 5.0
MAX_REQUEST_THREADS = 4


def _bucket(value: float) -> str:
    """The name of the first bucket (``le``) that holds ``value``."""
    if not value <= DURATION_BUCKETS[-1]:  # (NaN too)
        return "+Inf"
    return BUCKET_NAMES[bisect.bisect_left(DURATION_BUCKETS, value)]


@dataclass
class JobMetrics:
    """A worker's counts and sums since it last sent them: hash field -> increment."""

    counts: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    sums: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, event: JobEvent, task_registered: bool) -> None:
        task = event.task if task_registered else UNREGISTERED
        labels = f"{event.queue}{SEPARATOR}{task}{SEPARATOR}"
        with self.lock:
            self.counts[f"jobs{SEPARATOR}{labels}{event.status}"] += 1
            self._observe("duration", labels, event.duration)
            if event.wait is not None:
                self._observe("wait", labels, event.wait)

    def _observe(self, name: str, labels: str, value: float) -> None:
        self.counts[f"{name}{SEPARATOR}{labels}{_bucket(value)}"] += 1
        self.sums[f"{name}_sum{SEPARATOR}{labels}"] += value

    def send(self, backend: RedisQueueBackend) -> None:
        """Add the counts to Redis. Those Redis refused (OOM, READONLY, a field spoilt
        by hand) are kept for the next call; after a lost reply, which may have added
        them, they are dropped: a counter may miss a few jobs, never count one twice."""
        with self.lock:
            counts, self.counts = self.counts, defaultdict(int)
            sums, self.sums = self.sums, defaultdict(float)
        if not counts and not sums:
            return
        try:
            refused = backend.broker.add_metrics(counts, sums)
        except REDIS_ERRORS as exc:
            if reply_lost(exc):
                raise
            refused = [*counts, *sums]  # refused: nothing was added
        if not refused:
            return
        with self.lock:
            for name in refused:
                if name in counts:
                    self.counts[name] += counts[name]
                else:
                    self.sums[name] += sums[name]
        raise MetricsRefused(f"Redis refused {len(refused)} metric field(s)")


class MetricsRefused(Exception):
    """Some counts were not added to Redis; they are kept for the next send."""


@dataclass
class Family:
    """One metric family of the exposition: its samples as (suffix, labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float, suffix: str = "") -> None:
        self.samples.append((suffix, labels, value))

    def lines(self) -> Iterator[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for suffix, labels, value in self.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            yield f"{self.name}{suffix}{{{text}}} {_number(value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(value)


# The buckets' names, as the exposition writes them: made once, not at every job.
BUCKET_NAMES = (*(_number(bound) for bound in DURATION_BUCKETS), "+Inf")


class Exposition:
    """The metric families of one scrape, filled backend by backend."""

    def __init__(self) -> None:
        self.up = Family("redisqueue_up", "gauge", "1 when the backend's Redis answered.")
        self.jobs = Family(
            "redisqueue_queue_jobs",
            "gauge",
            "Jobs per queue and state now (failed: within the result TTL).",
        )
        self.paused = Family("redisqueue_queue_paused", "gauge", "1 when the queue is paused.")
        self.head_wait = Family(
            "redisqueue_queue_wait_seconds",
            "gauge",
            "How long the job that runs next in the queue has waited (0: empty queue).",
        )
        self.workers = Family(
            "redisqueue_workers", "gauge", "Live worker processes serving the queue."
        )
        self.workers_alive = Family(
            "redisqueue_workers_alive", "gauge", "Live worker processes of the backend."
        )
        self.slots = Family(
            "redisqueue_worker_slots",
            "gauge",
            "Jobs the live worker processes can run at once (runworker --threads, summed).",
        )
        self.busy_slots = Family(
            "redisqueue_worker_busy_slots",
            "gauge",
            "Slots of the live worker processes running a job now.",
        )
        self.schedulers_alive = Family(
            "redisqueue_schedulers_alive", "gauge", "Live schedulers of the backend."
        )
        self.scheduler_age = Family(
            "redisqueue_scheduler_last_step_age_seconds",
            "gauge",
            "Seconds since a scheduler last stepped (absent: none is registered; one "
            "that stops cleanly unregisters).",
        )
        self.outbox_jobs = Family(
            "redisqueue_outbox_jobs",
            "gauge",
            "Committed jobs waiting in the outbox for the relay to Redis (OUTBOX).",
        )
        self.outbox_age = Family(
            "redisqueue_outbox_oldest_seconds",
            "gauge",
            "How long the oldest job in the outbox has waited for the relay (0: none; "
            "+Inf: the outbox cannot be read).",
        )
        self.outbox_readable = Family(
            "redisqueue_outbox_readable",
            "gauge",
            "1 when the outbox's databases could be read (OUTBOX).",
        )
        self.finished = Family(
            "redisqueue_jobs_total",
            "counter",
            "Attempts whose outcome workers stored, by status "
            "(SUCCESSFUL, FAILED, RETRY, RELEASE).",
        )
        self.duration = Family(
            "redisqueue_job_duration_seconds", "histogram", "How long jobs ran."
        )
        self.wait = Family(
            "redisqueue_job_wait_seconds",
            "histogram",
            "How long jobs waited from enqueue (or their due time) to their first start.",
        )

    def families(self) -> list[Family]:
        return [
            self.up,
            self.jobs,
            self.paused,
            self.head_wait,
            self.workers,
            self.workers_alive,
            self.slots,
            self.busy_slots,
            self.schedulers_alive,
            self.scheduler_age,
            self.outbox_jobs,
            self.outbox_age,
            self.outbox_readable,
            self.finished,
            self.duration,
            self.wait,
        ]

    def text(self) -> str:
        return "\n".join(line for f in self.families() for line in f.lines()) + "\n"

    def add_backend(self, backend: RedisQueueBackend) -> None:
        """The samples of one backend; ``redisqueue_up`` 0 alone when Redis fails."""
        labels = {"backend": backend.alias}
        self._add_outbox(backend, labels)
        try:
            read = _read(backend)
        except REDIS_ERRORS as exc:
            logger.warning("Metrics of backend %r unread: %s", backend.alias, exc)
            self.up.add(labels, 0)
            return
        self.up.add(labels, 1)
        for queue, row in read.counts.items():
            at = {**labels, "queue": queue}
            for state in ("ready", "running", "delayed", "failed"):
                self.jobs.add({**at, "state": state}, float(getattr(row, state)))
            self.paused.add(at, float(row.paused))
            self.head_wait.add(at, read.head_waits.get(queue) or 0.0)
            self.workers.add(at, float(sum(1 for w in read.workers if w.serves(queue))))
        self.workers_alive.add(labels, float(len(read.workers)))
        self.slots.add(labels, float(sum(w.slots for w in read.workers)))
        self.busy_slots.add(labels, float(sum(w.busy(read.in_hand[w.id]) for w in read.workers)))
        self.schedulers_alive.add(labels, float(read.schedulers_alive))
        if read.scheduler_age is not None:
            self.scheduler_age.add(labels, read.scheduler_age)
        self._add_counts(labels, read.counters)

    def _add_outbox(self, backend: RedisQueueBackend, labels: dict[str, str]) -> None:
        """The outbox's gauges, read from the database whatever Redis does; none when
        the backend has no outbox. When it cannot be read (logged), the oldest job's age
        is +Inf, so that an alert on it fires rather than falls silent, and the count
        is left out (unknown)."""
        if not backend.config.outbox:
            return
        try:
            backlog = outbox.backlog(backend.config.outbox, backend.alias)
        except outbox.OUTBOX_ERRORS as exc:
            logger.warning("Outbox of backend %r unread: %s", backend.alias, exc)
            self.outbox_readable.add(labels, 0)
            self.outbox_age.add(labels, math.inf)
            return
        self.outbox_readable.add(labels, 1)
        self.outbox_jobs.add(labels, float(backlog.jobs))
        self.outbox_age.add(labels, backlog.age())

    def _add_counts(self, labels: dict[str, str], counters: dict[str, float]) -> None:
        histograms: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
        sums: dict[tuple[str, str, str], float] = {}
        for name, value in sorted(counters.items()):
            parts = name.split(SEPARATOR)
            if len(parts) != 4:
                continue  # not a field workers write
            kind, queue, task, last = parts
            at = {**labels, "queue": queue, "task": task}
            if kind == "jobs":
                self.finished.add({**at, "status": last}, value)
            elif kind in ("duration", "wait"):
                histograms[kind, queue, task][last] = value
            elif kind in ("duration_sum", "wait_sum"):
                sums[kind.removesuffix("_sum"), queue, task] = value
        for (kind, queue, task), buckets in sorted(histograms.items()):
            family = self.duration if kind == "duration" else self.wait
            at = {**labels, "queue": queue, "task": task}
            total = 0.0
            for bound in BUCKET_NAMES:
                total += buckets.get(bound, 0.0)
                family.add({**at, "le": bound}, total, "_bucket")
            family.add(at, sums.get((kind, queue, task), 0.0), "_sum")
            family.add(at, total, "_count")


@dataclass
class _Read:
    counts: dict[str, QueueCounts]
    head_waits: dict[str, float | None]
    workers: list[Live]
    in_hand: Counter[str]  # running jobs by the worker that owns them
    schedulers_alive: int
    scheduler_age: float | None
    counters: dict[str, float]


def _read(backend: RedisQueueBackend) -> _Read:
    queries, keys = backend.queries, backend.keys
    queues = backend.served_queues()[:QUEUE_SERIES_LIMIT]
    counts = queries.counts(queues)
    running = queries.jobs([job_id for job_id, _ in queries.running()], "queue", "owner")
    per_queue = Counter(job.get("queue") for job in running)
    counts = {queue: replace(row, running=per_queue[queue]) for queue, row in counts.items()}
    now = queries.clock_ms()
    last_step = queries.alive(keys.schedulers, 1)  # the latest, live or not
    return _Read(
        counts=counts,
        head_waits=queries.head_waits(queues),
        workers=queries.live_workers(now, ALIVE_READ_LIMIT),
        in_hand=Counter(owner_worker(job.get("owner", "")) for job in running),
        schedulers_alive=len(queries.live_schedulers(now, ALIVE_READ_LIMIT)),
        scheduler_age=(now - last_step[0][1]) / 1000 if last_step else None,
        counters=queries.metrics(),
    )


def render(backends: Iterable[RedisQueueBackend]) -> str:
    """The exposition of ``backends``, in Prometheus's text format."""
    exposition = Exposition()
    for backend in backends:
        exposition.add_backend(backend)
    return exposition.text()


class _DeadlineReader(io.RawIOBase):
    """A request's socket, read against one deadline for the whole request: a client
    that sends a byte at a time (a slowloris) cannot hold a thread for longer."""

    def __init__(self, connection: socket.socket, seconds: float) -> None:
        self.connection = connection
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long to arrive")
        self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


class _MetricsHandler(BaseHTTPRequestHandler):
    backends: Sequence[RedisQueueBackend] = ()
    # The socket's timeout (StreamRequestHandler's), for writing the answer; a timeout
    # ends the request (handle_one_request catches it).
    timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # else it keeps the socket open after the request
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, REQUEST_TIMEOUT))

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.connection.settimeout(self.timeout)  # the answer's, whatever reading left
        return parsed

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/", "/metrics"):
            self.send_error(404)
            return
        try:
            with cast(_MetricsServer, self.server).render_allowed():
                body = render(self.backends).encode()
        except Exception:  # a bug must not kill the endpoint, nor print a raw traceback
            logger.exception("Metrics endpoint: the exposition failed")
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("Metrics endpoint: " + format, *args)


def parse_address(value: str) -> tuple[str, int]:
    """``PORT`` (on loopback: the endpoint has no authentication), ``HOST:PORT`` or
    ``[IPv6]:PORT``, as ``--metrics-port`` takes it; port 0 picks a free one. Raises
    ValueError for anything else."""
    host, _, port = value.rpartition(":")
    number = int(port)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not 0 <= number <= 65535 or (host and not host.strip()) or "[" in host or "]" in host:
        raise ValueError(value)
    return host or "127.0.0.1", number


class _MetricsServer(ThreadingHTTPServer):
    """A thread per request, at most MAX_REQUEST_THREADS at once: a connection that
    comes when they are all busy is closed at once, so that no number of clients can
    make the process grow."""

    daemon_threads = True
    # Connections the kernel holds until accepted: past Python's default of 5, a burst
    # of clients makes the next ones (a scraper's too) retry their connect a second later.
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_REQUEST_THREADS)
        # Renders in hand, and whether a fork holds new ones off (hold_requests).
        self.renders = threading.Condition()
        self.rendering = 0
        self.forking = False
        super().__init__(*args, **kwargs)

    @contextlib.contextmanager
    def render_allowed(self) -> Iterator[None]:
        """Around a render, which takes locks (a Redis client's): not while a fork is
        under way; the request waits for it."""
        with self.renders:
            self.renders.wait_for(lambda: not self.forking)
            self.rendering += 1
        try:
            yield
        finally:
            with self.renders:
                self.rendering -= 1
                self.renders.notify_all()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            logger.debug("Metrics endpoint: busy; a connection from %s closed", client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the thread
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            connections.close_all()  # this thread's, opened to read the outbox
            self.slots.release()

    def hold_requests(self) -> None:
        """Wait for the renders in hand to end, and start no new one: before the pool
        forks a worker, so that no lock a render holds (a Redis client's, for one) is
        copied, held, into the child, which would wait on it for ever. Connections are
        still accepted and read meanwhile; their renders wait."""
        with self.renders:
            self.forking = True
            self.renders.wait_for(lambda: self.rendering == 0)

    def serve_requests(self) -> None:
        """Render again (after hold_requests)."""
        with self.renders:
            self.forking = False
            self.renders.notify_all()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hung up first (BrokenPipeError) is no error of ours; the
        # default prints a raw traceback, which would break a JSON log stream.
        logger.debug("Metrics endpoint: a request from %s failed", client_address, exc_info=True)


class _MetricsServer6(_MetricsServer):
    address_family = socket.AF_INET6


def serve(address: tuple[str, int], backends: Sequence[RedisQueueBackend]) -> _MetricsServer:
    """Serve ``/metrics`` of ``backends`` on ``address`` from a daemon thread, for
    ``runworker --metrics-port``; ``shutdown()`` the server returned to stop it."""
    handler = type("MetricsHandler", (_MetricsHandler,), {"backends": tuple(backends)})
    server_class = _MetricsServer6 if ":" in address[0] else _MetricsServer
    server = server_class(address, handler)
    thread = threading.Thread(target=server.serve_forever, name="redisqueue-metrics", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    logger.info("Metrics served on http://%s:%s/metrics", host, port)
    return server
