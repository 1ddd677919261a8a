"""The Prometheus exposition: it parses with prometheus_client's parser, its gauges are
what Redis holds, its counters count each stored outcome once, and nothing read from
Redis or a backend's name can break it or add series."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import urllib.request
from unittest import mock

import pytest
import redis
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from django_redisqueue.observe import metrics
from django_redisqueue.observe.events import JobEvent
from django_redisqueue.observe.metrics import (
    CONTENT_TYPE,
    MAX_REQUEST_THREADS,
    REQUEST_TIMEOUT,
    UNREGISTERED,
    Exposition,
    Family,
    JobMetrics,
    MetricsRefused,
    parse_address,
    render,
    serve,
)
from django_redisqueue.store.wire import RETRY
from tests.conftest import manage, private_redis, run_worker_here, wait_until
from tests.support import tasks

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the exposition, by name and labels, as the official parser reads
    it (it raises on anything malformed)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found, name, **labels):
    return found[name, frozenset({"backend": "default", **labels}.items())]


def jobs_total(found, queue, task, status):
    return value(
        found,
        "redisqueue_jobs_total",
        queue=queue,
        task=f"tests.support.tasks.{task}",
        status=status,
    )


def test_the_gauges_are_what_redis_holds_and_the_counters_count_each_outcome(backend, r):
    for i in range(3):
        tasks.add.enqueue(i, 1)
    tasks.fail.enqueue("boom")
    tasks.urgent.enqueue("first")
    tasks.add.using(delay=3600).enqueue(1, 2)  # delayed
    run_worker_here(backend, queues=["high", "default"])
    tasks.add.enqueue(5, 5)  # ready, after the worker left
    tasks.record.using(queue_name="low").enqueue("x")
    found = samples(render([backend]))

    assert value(found, "redisqueue_up") == 1
    keys = backend.keys
    for queue in ("high", "default", "low"):
        assert value(found, "redisqueue_queue_jobs", queue=queue, state="ready") == r.zcard(
            keys.queue(queue)
        )
        assert value(found, "redisqueue_queue_jobs", queue=queue, state="delayed") == r.zcard(
            keys.delayed(queue)
        )
    assert value(found, "redisqueue_queue_jobs", queue="default", state="ready") == 1
    assert value(found, "redisqueue_queue_jobs", queue="default", state="delayed") == 1
    assert value(found, "redisqueue_queue_jobs", queue="default", state="failed") == 1
    assert value(found, "redisqueue_queue_jobs", queue="default", state="running") == 0
    assert value(found, "redisqueue_queue_wait_seconds", queue="high") == 0  # empty
    assert value(found, "redisqueue_queue_wait_seconds", queue="low") >= 0

    add = {"queue": "default", "task": "tests.support.tasks.add"}
    assert jobs_total(found, "default", "add", "SUCCESSFUL") == 3
    assert jobs_total(found, "default", "fail", "FAILED") == 1
    assert jobs_total(found, "high", "urgent", "SUCCESSFUL") == 1
    assert value(found, "redisqueue_job_duration_seconds_count", **add) == 3
    assert value(found, "redisqueue_job_duration_seconds_bucket", le="+Inf", **add) == 3
    assert value(found, "redisqueue_job_wait_seconds_count", **add) == 3
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in found.items()
        if name == "redisqueue_job_duration_seconds_bucket"
        and dict(labels)["task"] == "tests.support.tasks.add"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    # Job ids are never labels.
    assert not any("id" in dict(labels) for _, labels in found)


def test_a_worker_counts_only_what_redis_stored_and_sends_it_on_stop(backend, r):
    tasks.fails_once.enqueue("x")  # a retry, then a success
    run_worker_here(backend)
    found = samples(render([backend]))
    labels = {"queue": "default", "task": "tests.support.tasks.fails_once"}
    assert value(found, "redisqueue_jobs_total", status=RETRY, **labels) == 1
    # Waits are counted for first attempts only: a retry waits by design.
    assert value(found, "redisqueue_job_wait_seconds_count", **labels) == 1


def test_payloads_naming_tasks_that_do_not_exist_add_no_series(backend, r):
    keys = backend.keys
    for i in range(20):
        job_id = f"hostile{i}"
        payload = json.dumps({"v": 1, "task": f"made.up.task_{i}"})
        fields = {"payload": payload, "queue": "default", "status": "READY"}
        r.hset(keys.job(job_id), mapping=fields)
        r.zadd(keys.queue("default"), {job_id: i})
    run_worker_here(backend)
    found = samples(render([backend]))
    tasks_seen = {dict(labels).get("task") for name, labels in found if "task" in dict(labels)}
    assert tasks_seen == {UNREGISTERED}
    assert (
        value(found, "redisqueue_jobs_total", queue="default", task=UNREGISTERED, status="FAILED")
        == 20
    )


def test_with_metrics_off_workers_count_nothing(backend, r, settings):
    tasks_setting = {alias: dict(conf) for alias, conf in settings.TASKS.items()}
    tasks_setting["default"]["OPTIONS"] = {**tasks_setting["default"]["OPTIONS"], "METRICS": False}
    from django_redisqueue.compat import task_backends

    with override_settings(TASKS=tasks_setting):
        quiet = task_backends["default"]
        assert quiet.config.metrics is False
        tasks.add.enqueue(1, 1)
        run_worker_here(quiet)
        assert not r.exists(quiet.keys.metrics)
        assert r.zcard(quiet.keys.queue("default")) == 0


def test_live_workers_and_schedulers_are_counted_per_queue(backend):
    backend.broker.heartbeat("w1", {"queues": "high,default"}, {})
    backend.broker.heartbeat("w2", {"queues": ""}, {})  # serves every queue
    found = samples(render([backend]))
    assert value(found, "redisqueue_workers_alive") == 2
    assert value(found, "redisqueue_workers", queue="high") == 2
    assert value(found, "redisqueue_workers", queue="low") == 1
    assert value(found, "redisqueue_schedulers_alive") == 0
    with pytest.raises(KeyError):  # no scheduler ever stepped
        value(found, "redisqueue_scheduler_last_step_age_seconds")


def test_slots_and_busy_slots_are_those_of_the_live_workers(backend, r):
    """Slots as each heartbeat records them (1 when absent or unreadable), busy ones by
    the running jobs each live worker owns, at most its slots."""
    backend.broker.heartbeat("w8", {"slots": 8}, {})
    backend.broker.heartbeat("old", {"pid": 7}, {})  # an older record: one slot
    backend.broker.heartbeat("spoilt", {"slots": "lots"}, {})
    backend.broker.heartbeat("gone", {"slots": 4}, {})
    r.zadd(backend.keys.workers, {"gone": 0})  # silent for too long
    for worker, jobs in (("w8", 3), ("old", 2), ("gone", 1)):
        for i in range(jobs):
            tasks.add.enqueue(i, i)
            backend.broker.claim(["default"], worker)
    found = samples(render([backend]))
    assert value(found, "redisqueue_workers_alive") == 3
    assert value(found, "redisqueue_worker_slots") == 8 + 1 + 1
    assert value(found, "redisqueue_worker_busy_slots") == 3 + 1  # old's 2nd is over its 1
    assert value(found, "redisqueue_queue_jobs", queue="default", state="running") == 6


def test_the_view_serves_the_exposition_and_only_to_get(client):
    tasks.add.enqueue(1, 1)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE
    found = samples(response.content.decode())
    assert value(found, "redisqueue_queue_jobs", queue="default", state="ready") == 1
    assert client.post("/metrics").status_code == 405


@pytest.mark.parametrize("error", ["down", "wrongtype"])
def test_redis_failing_gives_up_zero_not_an_error(client, error):
    with private_redis() as server:
        if error == "down":
            server.stop()
        else:
            from django_redisqueue.compat import task_backends

            keys = task_backends["default"].keys
            spoiler = redis.Redis.from_url(server.url)
            for key in (keys.metrics, keys.failed("low"), keys.paused, keys.workers, keys.running):
                spoiler.set(key, "spoilt")  # keys of another type read as empty
            tasks.add.enqueue(1, 2)
        response = client.get("/metrics")
    assert response.status_code == 200
    found = samples(response.content.decode())
    assert value(found, "redisqueue_up") == (0 if error == "down" else 1)
    if error == "wrongtype":
        assert value(found, "redisqueue_queue_jobs", queue="default", state="ready") == 1
        assert value(found, "redisqueue_queue_jobs", queue="low", state="failed") == 0


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    fields=st.dictionaries(
        st.text(alphabet=st.sampled_from('jobs|duration_sumwait|+Inf0.5\\"\n é'), max_size=30),
        st.one_of(
            st.text(max_size=8),
            st.floats(allow_nan=True).map(str),
            st.integers().map(str),
        ),
        max_size=12,
    )
)
def test_whatever_the_metrics_hash_holds_the_exposition_parses(backend, r, fields):
    r.delete(backend.keys.metrics)
    if fields:
        r.hset(backend.keys.metrics, mapping=fields)
    found = samples(render([backend]))
    assert value(found, "redisqueue_up") == 1


@settings(max_examples=200, deadline=None)
@given(label=st.text(max_size=40), number=st.floats(allow_nan=False))
def test_label_values_and_numbers_survive_the_parser(label, number):
    family = Family("redisqueue_test", "gauge", "A test.")
    family.add({"backend": label}, number)
    parsed = list(text_string_to_metric_families("\n".join(family.lines()) + "\n"))
    [sample] = parsed[0].samples
    assert sample.labels == {"backend": label}
    assert sample.value == number


def test_the_counts_a_worker_holds_survive_redis_refusing_them(backend, r):
    metrics = JobMetrics()
    metrics.record(
        JobEvent("j1", "tests.support.tasks.add", "default", "SUCCESSFUL", 0.2, 1, 0.1), True
    )
    r.set(backend.keys.metrics, "not a hash")
    with pytest.raises(MetricsRefused):
        metrics.send(backend)
    r.delete(backend.keys.metrics)
    metrics.record(
        JobEvent("j2", "tests.support.tasks.add", "default", "SUCCESSFUL", 0.3, 1, None), True
    )
    metrics.send(backend)
    found = samples(render([backend]))
    labels = {"queue": "default", "task": "tests.support.tasks.add"}
    assert value(found, "redisqueue_jobs_total", status="SUCCESSFUL", **labels) == 2
    assert value(found, "redisqueue_job_duration_seconds_sum", **labels) == pytest.approx(0.5)
    assert value(found, "redisqueue_job_wait_seconds_count", **labels) == 1


def test_the_metrics_endpoint_of_a_worker_process(backend):
    port = free_port()
    server = serve(("127.0.0.1", port), [backend])
    try:
        tasks.add.enqueue(1, 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            found = samples(response.read().decode())
        assert value(found, "redisqueue_queue_jobs", queue="default", state="ready") == 1
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_an_empty_exposition_still_parses():
    assert re.search(r"# TYPE redisqueue_up gauge", Exposition().text())
    assert list(text_string_to_metric_families(Exposition().text()))


def test_an_outcome_redis_refused_is_not_counted(backend):
    from django_redisqueue.core.jobs import SUCCESSFUL
    from django_redisqueue.runtime.worker import Finished, Worker
    from django_redisqueue.store.wire import Outcome

    worker = Worker(backend)
    event = JobEvent("j1", "tests.support.tasks.add", "default", SUCCESSFUL, 0.1, 1, 0.0)
    finished = Finished(Outcome("j1", "w/1", SUCCESSFUL, result="2"), event=event)
    worker._report(finished, stored=False)  # fenced out: the job's new owner decides it
    assert not worker.metrics.counts
    worker._report(finished, stored=True)
    assert worker.metrics.counts["jobs|default|tests.support.tasks.add|SUCCESSFUL"] == 1


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("9808", ("127.0.0.1", 9808)),  # loopback unless a host is given
        ("0.0.0.0:9808", ("0.0.0.0", 9808)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("h:1", ("h", 1)),
        ("[::]:9808", ("::", 9808)),
    ],
)
def test_metrics_addresses(given, address):
    assert parse_address(given) == address


@pytest.mark.parametrize("given", ["", "x", "70000", "-1", "host:", " :80", "[::1:80", "[[::]]:1"])
def test_metrics_addresses_refused(given):
    with pytest.raises(ValueError):
        parse_address(given)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return samples(response.read().decode())


def test_runworker_serves_the_metrics_of_its_pool(procs, r, backend):
    port = free_port()
    worker = procs.start("runworker", "--concurrency", "2", "--metrics-port", f"127.0.0.1:{port}")
    procs.expect(worker, f"Metrics served on http://127.0.0.1:{port}/metrics")
    alive: list[float] = []

    def two_alive() -> bool:
        alive.append(value(scrape(port), "redisqueue_workers_alive"))
        return alive[-1] == 2

    try:
        wait_until(two_alive, 30, "2 workers alive")
    except AssertionError as exc:  # say what it saw, which workers Redis knows, the log
        known = r.zrange(backend.keys.workers, 0, -1)
        log = procs.stop(worker)[-3000:]
        raise AssertionError(f"{exc}: saw {alive[-3:]}; workers {known}; log:\n{log}") from exc
    result = tasks.add.enqueue(2, 3)
    wait_until(
        lambda: (
            value(scrape(port), "redisqueue_queue_jobs", queue="default", state="ready") == 0
            and tasks.add.get_result(result.id).status == "SUCCESSFUL"
        ),
        30,
        "the job to run",
    )
    procs.stop(worker)
    with pytest.raises(urllib.error.URLError):  # no child kept the socket open
        scrape(port)


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def closed_by_the_server(connection: socket.socket) -> bool:
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, and nothing sent
    except ConnectionResetError:
        return True


def test_runworker_serves_metrics_on_loopback_unless_told_otherwise(procs):
    port = free_port()
    worker = procs.start("runworker", "--concurrency", "2", "--metrics-port", str(port))
    procs.expect(worker, f"Metrics served on http://127.0.0.1:{port}/metrics")
    assert value(scrape(port), "redisqueue_up") == 1


def test_idle_and_slow_connections_hold_a_few_threads_for_a_few_seconds(procs):
    port = free_port()
    # The pool's supervisor serves the metrics and runs nothing else but its main thread.
    worker = procs.start("runworker", "--concurrency", "2", "--metrics-port", f"127.0.0.1:{port}")
    procs.expect(worker, f"Metrics served on http://127.0.0.1:{port}/metrics")
    before = threads(worker.pid)
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]

    def bounded_and_closed(connections: list[socket.socket]) -> bool:
        now = threads(worker.pid)
        assert now <= before + MAX_REQUEST_THREADS, f"{now} threads, {before} before"
        with contextlib.suppress(OSError):  # once the server closed it
            slow.send(b"G")  # a byte at a time: a request line that never ends
        return all(closed_by_the_server(c) for c in connections)

    try:
        wait_until(lambda: bounded_and_closed(idle), 3 * REQUEST_TIMEOUT, "idle ones closed")
        wait_until(lambda: bounded_and_closed([slow]), 3 * REQUEST_TIMEOUT, "slow one closed")
        assert value(scrape(port), "redisqueue_up") == 1
    finally:
        for connection in [slow, *idle]:
            connection.close()


def test_runworker_refuses_a_port_in_use_or_malformed():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = manage("runworker", "--burst", "--metrics-port", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"Cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    result = manage("runworker", "--burst", "--metrics-port", "nine")
    assert result.returncode == 2
    assert "--metrics-port" in result.stderr


def test_a_whole_sum_after_a_fraction_is_added_once(backend):
    metrics = JobMetrics()
    metrics.record(
        JobEvent("j1", "tests.support.tasks.add", "default", "SUCCESSFUL", 0.25, 1, 0.043), True
    )
    metrics.send(backend)
    metrics.record(
        JobEvent("j2", "tests.support.tasks.add", "default", "SUCCESSFUL", 1.0, 1, 0.0), True
    )
    metrics.send(backend)
    for _ in range(3):  # idle heartbeats send nothing more
        metrics.send(backend)
    found = samples(render([backend]))
    labels = {"queue": "default", "task": "tests.support.tasks.add"}
    assert value(found, "redisqueue_jobs_total", status="SUCCESSFUL", **labels) == 2
    assert value(found, "redisqueue_job_wait_seconds_sum", **labels) == pytest.approx(0.043)
    assert value(found, "redisqueue_job_duration_seconds_sum", **labels) == pytest.approx(1.25)


def test_counts_whose_reply_was_lost_are_not_sent_again(backend, monkeypatch):
    metrics = JobMetrics()
    metrics.record(
        JobEvent("j1", "tests.support.tasks.add", "default", "SUCCESSFUL", 0.1, 1, None), True
    )
    add = backend.broker.add_metrics

    def added_then_reply_lost(counts, sums):
        add(counts, sums)
        raise redis.ConnectionError("the reply was lost")

    monkeypatch.setattr(backend.broker, "add_metrics", added_then_reply_lost)
    with pytest.raises(redis.ConnectionError):
        metrics.send(backend)
    monkeypatch.undo()
    metrics.send(backend)
    found = samples(render([backend]))
    labels = {"queue": "default", "task": "tests.support.tasks.add"}
    assert value(found, "redisqueue_jobs_total", status="SUCCESSFUL", **labels) == 1


def test_a_fork_waits_for_the_scrape_in_hand_and_the_next_scrape_waits_for_the_fork(backend):
    """The pool forks its workers while the endpoint may be answering: a request holds
    locks (a Redis client's) that a child would wait on for ever if it were copied held.
    So a fork waits for the requests in hand to end, and a request that comes during the
    fork waits for it, and is answered."""
    rendering, finish = threading.Event(), threading.Event()

    def slow_render(backends):
        rendering.set()
        finish.wait(10)
        return ""

    server = serve(("127.0.0.1", 0), [backend])
    port = server.server_address[1]
    try:
        with mock.patch.object(metrics, "render", slow_render):
            first = threading.Thread(target=scrape, args=(port,))
            first.start()
            assert rendering.wait(10)
            held = threading.Event()
            fork = threading.Thread(target=lambda: (server.hold_requests(), held.set()))
            fork.start()
            assert not held.wait(0.3)  # the fork waits for the scrape in hand
            finish.set()
            assert held.wait(10)
            second: list[dict] = []
            during = threading.Thread(target=lambda: second.append(scrape(port)))
            during.start()
            during.join(0.3)
            assert during.is_alive()  # waits while the fork holds requests
            server.serve_requests()
            during.join(10)
            assert second == [{}]  # answered, not refused
            first.join(10)
    finally:
        server.shutdown()
        server.server_close()


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(metrics.DURATION_BUCKETS),
        st.sampled_from([b + d for b in metrics.DURATION_BUCKETS for d in (-1e-9, 1e-9)]),
    )
)
def test_a_value_falls_in_the_first_bucket_that_holds_it(value: float) -> None:
    # The bucket a le= line counts: the smallest bound at least the value ("+Inf" past
    # the last, and for what compares with no bound).
    holding = [bound for bound in metrics.DURATION_BUCKETS if value <= bound]
    expected = (
        metrics.BUCKET_NAMES[metrics.DURATION_BUCKETS.index(holding[0])] if holding else "+Inf"
    )
    assert metrics._bucket(value) == expected
