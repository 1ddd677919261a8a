"""``manage.py queuehealth``: each failing condition gives its exit code and says why,
Redis errors of every kind count as Redis unhealthy without a traceback, and
``Queries.head_waits`` reads whatever a queue and its jobs hold without raising.

Most tests register workers and schedulers through the broker's own heartbeat and
tick (by Redis's clock) and probe in this process; one runs real ``runworker`` and
``runscheduler`` processes."""

import json
import socket
from io import StringIO
from unittest.mock import patch

import pytest
import redis
from django.core.management import CommandError, call_command
from hypothesis import given
from hypothesis import strategies as st

from django_redisqueue.compat import task_backends
from django_redisqueue.management.commands import queuehealth
from django_redisqueue.store.queries import SCHEDULER_ALIVE_MS, WORKER_ALIVE_MS, Queries
from tests.conftest import clock_at, manage, not_on_cluster, private_redis, wait_until
from tests.support import tasks
from tests.support.entries import as_hash
from tests.support.fuzzing import FRAGMENTS, TIMES, TRIED, counted, envelopes, fuzz
from tests.support.servers import free_port

QUEUES = ("high", "default", "low")
PAUSE_MS = 1000  # a stall: longer than twice the --timeout the probe is given


def probe(*args: str) -> tuple[int, str]:
    """Run the command here: its exit code and what it printed."""
    out = StringIO()
    try:
        call_command("queuehealth", *args, stdout=out)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


def worker(backend, worker_id: str = "w1", queues: str = "", host: str = "elsewhere") -> None:
    """Register a worker as its heartbeat does, now by Redis's clock."""
    backend.broker.heartbeat(worker_id, {"queues": queues, "host": host}, {})


def scheduler(backend, scheduler_id: str = "elsewhere:1:ab") -> None:
    """Register a scheduler as its step does, now by Redis's clock."""
    backend.broker.tick(scheduler_id, list(QUEUES), batch=1, lost_limit=2, lost_error="")


def age(r, backend, key: str, member: str, ms: int) -> None:
    """Make a worker or scheduler last seen ``ms`` ago by Redis's clock."""
    r.zadd(key, {member: backend.broker.clock_ms() - ms})


def healthy(backend) -> None:
    worker(backend)
    scheduler(backend)


def test_a_healthy_backend_exits_0_with_a_line_per_check(backend):
    healthy(backend)
    tasks.noop.enqueue()

    code, out = probe()

    assert code == queuehealth.HEALTHY, out
    lines = out.splitlines()
    assert lines == [
        lines[0],
        *(f"OK   workers[{q}]: 1 live worker(s) serve it" for q in QUEUES),
        lines[4],
        "OK   wait[high]: empty",
        lines[6],
        "OK   wait[low]: empty",
    ]
    assert lines[0].startswith("OK   redis: answered and accepts writes in ")
    assert lines[4].startswith("OK   scheduler: 1 live scheduler(s), the last step ")
    assert lines[6].startswith("OK   wait[default]: the next of 1 ready job(s) has waited ")


def test_a_queue_no_live_worker_serves_exits_4(r, backend):
    worker(backend, "w1", "high,default")
    worker(backend, "w2", "low")
    age(r, backend, backend.keys.workers, "w2", WORKER_ALIVE_MS + 1000)  # dead
    scheduler(backend)

    code, out = probe()

    assert code == queuehealth.NO_LIVE_WORKER
    assert "OK   workers[default]: 1 live worker(s) serve it" in out
    assert (
        "FAIL workers[low]: no live worker serves it; 1 live worker(s) serve other queues"
    ) in out.splitlines()
    # Only the queues asked about.
    assert probe("--queue", "high", "--queue", "default")[0] == queuehealth.HEALTHY
    assert probe("--no-workers")[0] == queuehealth.HEALTHY


def test_a_worker_whose_record_expired_is_not_live(r, backend):
    healthy(backend)
    r.delete(backend.keys.worker("w1"))  # its heartbeat is recent, its record gone
    assert probe()[0] == queuehealth.NO_LIVE_WORKER


def test_no_live_scheduler_exits_5(r, backend):
    worker(backend)
    scheduler(backend)
    age(r, backend, backend.keys.schedulers, "elsewhere:1:ab", SCHEDULER_ALIVE_MS + 1000)

    code, out = probe()

    assert code == queuehealth.NO_SCHEDULER
    assert "FAIL scheduler: no live scheduler (none stepped in the last 15 s)" in out
    assert probe("--no-scheduler")[0] == queuehealth.HEALTHY


def test_a_job_waiting_longer_than_max_wait_exits_6(r, backend):
    healthy(backend)
    job = tasks.noop.using(queue_name="low").enqueue()
    with clock_at(backend.broker.clock_ms()) as now:
        r.hset(as_hash(r, backend.keys, job.id), "enqueued_at", now - 400_000)

        code, out = probe()

        assert code == queuehealth.WAITED_TOO_LONG
        [line] = [line for line in out.splitlines() if line.startswith("FAIL")]
        assert line == (
            "FAIL wait[low]: the next of 1 ready job(s) has waited 400.0 s, over --max-wait 300 s"
        )
        assert probe("--max-wait", "500")[0] == queuehealth.HEALTHY
        assert probe("--max-wait", "0")[0] == queuehealth.HEALTHY  # no wait check
        assert "wait[" not in probe("--max-wait", "0")[1]


def test_several_failures_are_all_printed_and_the_lowest_code_wins(r, backend):
    job = tasks.noop.enqueue()
    with clock_at(backend.broker.clock_ms()) as now:
        r.hset(as_hash(r, backend.keys, job.id), "enqueued_at", now - 400_000)
        code, out = probe()
        json_code, json_out = probe("--json")

    assert code == queuehealth.NO_LIVE_WORKER
    failed = [line.split(":")[0] for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == [
        *(f"FAIL workers[{q}]" for q in QUEUES),
        "FAIL scheduler",
        "FAIL wait[default]",
    ]

    assert json_code == queuehealth.NO_LIVE_WORKER
    report = json.loads(json_out)
    assert (report["backend"], report["healthy"], report["exit_code"]) == ("default", False, 4)
    by_name = {(c["name"], c["queue"]): c for c in report["checks"]}
    assert by_name[("redis", None)]["ok"] is True
    assert by_name[("workers", "low")] == {
        "name": "workers",
        "ok": False,
        "message": "no live worker serves it",
        "queue": "low",
        "figures": {"live_workers": 0, "ready": 0, "paused": False},
    }
    assert by_name[("scheduler", None)]["figures"] == {"live_schedulers": 0}
    wait = by_name[("wait", "default")]
    assert wait["ok"] is False
    assert wait["figures"]["waited"] == 400
    assert (wait["figures"]["max_wait"], wait["figures"]["ready"]) == (300, 1)


def test_a_paused_queue_is_reported_but_does_not_fail(r, backend):
    worker(backend, "w1", "high,default")
    scheduler(backend)
    job = tasks.noop.using(queue_name="low").enqueue()
    with clock_at(backend.broker.clock_ms()) as now:
        r.hset(as_hash(r, backend.keys, job.id), "enqueued_at", now - 400_000)
        assert probe()[0] == queuehealth.NO_LIVE_WORKER

        backend.broker.operate("pause", "low")
        code, out = probe()

    assert code == queuehealth.HEALTHY, out
    assert "OK   workers[low]: no live worker serves it (paused: not failing)" in out
    assert out.rstrip().endswith(
        "OK   wait[low]: the next of 1 ready job(s) has waited 400.0 s, over --max-wait 300 s"
        " (paused: not failing)"
    )


def test_this_host_counts_only_the_workers_and_schedulers_of_this_host(backend):
    healthy(backend)  # on another host
    assert probe("--this-host")[0] == queuehealth.NO_LIVE_WORKER
    assert "no live worker on this host serves it" in probe("--this-host")[1]

    worker(backend, "w2", host=socket.gethostname())
    assert probe("--this-host")[0] == queuehealth.NO_SCHEDULER
    scheduler(backend, f"{socket.gethostname()}:2:cd")
    assert probe("--this-host")[0] == queuehealth.HEALTHY


def test_with_any_queue_valid_a_worker_given_no_queue_serves_every_queue_used():
    backend = task_backends["anyqueue"]
    assert probe("--backend", "anyqueue")[1].splitlines()[1] == (
        "OK   workers: no queue used yet; 0 live worker(s)"
    )
    tasks.noop.using(backend="anyqueue", queue_name="reports").enqueue()
    assert probe("--backend", "anyqueue", "--no-scheduler")[0] == queuehealth.NO_LIVE_WORKER

    worker(backend)  # no queue named: every queue used
    assert probe("--backend", "anyqueue", "--no-scheduler")[0] == queuehealth.HEALTHY
    assert probe("--backend", "anyqueue", "--queue", "x.y-z_1", "--no-scheduler")[0] == 0


def test_unknown_or_invalid_queue_names_are_a_command_error():
    with pytest.raises(CommandError, match="Queue 'nope' is not one of backend 'default'"):
        probe("--queue", "nope")
    with pytest.raises(CommandError, match="Queue 'a b' is not a queue name"):
        probe("--backend", "anyqueue", "--queue", "a b")
    with pytest.raises(CommandError, match="No task backend 'missing'"):
        probe("--backend", "missing")


SPOILABLE = {
    "queue": lambda keys: keys.queue("default"),
    "delayed": lambda keys: keys.delayed("default"),
    "failed": lambda keys: keys.failed("default"),
    "paused": lambda keys: keys.paused,
    "workers": lambda keys: keys.workers,
    "worker": lambda keys: keys.worker("w1"),
    "schedulers": lambda keys: keys.schedulers,
    "metrics": lambda keys: keys.metrics,
    "known_queues": lambda keys: keys.known_queues,
}


@pytest.mark.parametrize("spoilt", SPOILABLE)
@pytest.mark.parametrize("holding", ["string", "list"])
def test_a_key_of_another_type_is_no_redis_failure(r, backend, spoilt, holding):
    """Spoilt by hand: the probe reads it as empty, as the dashboard does."""
    for alias in ("default", "anyqueue"):  # anyqueue: every queue used is known
        spoilt_backend = task_backends[alias]
        healthy(spoilt_backend)
        tasks.noop.using(backend=alias).enqueue()
        key = SPOILABLE[spoilt](spoilt_backend.keys)
        r.delete(key)
        if holding == "string":
            r.set(key, "spoilt")
        else:
            r.rpush(key, "spoilt")

        code, out = probe("--backend", alias)

        assert code != queuehealth.REDIS_UNHEALTHY, out
        assert out.startswith("OK   redis: answered and accepts writes in "), out
        assert "Redis" not in out.partition("\n")[2], out


@not_on_cluster
def test_unreachable_redis_exits_3_without_a_traceback(backend):
    with private_redis() as server:
        server.kill()
        code, out = probe()
        done = manage("queuehealth", "--json")
    assert code == queuehealth.REDIS_UNHEALTHY
    assert out.startswith("FAIL redis: unhealthy: ConnectionError: ")
    assert f":{server.port}" in out
    assert len(out.splitlines()) == 1  # nothing else can be read
    assert done.returncode == queuehealth.REDIS_UNHEALTHY
    assert done.stderr == ""
    report = json.loads(done.stdout)
    assert report["exit_code"] == 3
    assert report["checks"][0]["figures"]["error"] == "ConnectionError"


@not_on_cluster
def test_redis_out_of_memory_or_read_only_exits_3(backend):
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        healthy(task_backends["default"])
        assert probe()[0] == queuehealth.HEALTHY

        admin.config_set("maxmemory", 1)  # noeviction, the default: writes refused
        code, out = probe()
        assert code == queuehealth.REDIS_UNHEALTHY
        assert out.startswith("FAIL redis: unhealthy: OutOfMemoryError: command not allowed")
        admin.config_set("maxmemory", 0)

        admin.replicaof("127.0.0.1", free_port())  # a replica of a master that is gone
        code, out = probe()
        assert code == queuehealth.REDIS_UNHEALTHY
        assert out.startswith("FAIL redis: unhealthy: ReadOnlyError: ")
        admin.replicaof("NO", "ONE")
        assert probe()[0] == queuehealth.HEALTHY


@not_on_cluster
def test_a_redis_that_stalls_fails_within_the_timeout(backend):
    with private_redis() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")  # every command held
        code, out = probe("--timeout", "0.2")
        assert code == queuehealth.REDIS_UNHEALTHY
        assert out.startswith("FAIL redis: unhealthy: TimeoutError: ")

        # Held after the ping answered: the deadline cuts the reads off.
        admin.ping()  # returns once the pause is over
        ping = Queries.ping

        def ping_then_stall(queries, timeout, **kwargs):
            ping(queries, timeout, **kwargs)
            admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")

        with patch.object(Queries, "ping", ping_then_stall):
            code, out = probe("--timeout", "0.2")
        assert code == queuehealth.REDIS_UNHEALTHY
        assert out == (
            "FAIL redis: unhealthy: ProbeTimeout: Redis took over 0.4 s to answer the probe\n"
        )


def test_a_real_worker_and_scheduler_pass_the_probe_and_a_stopped_worker_fails_it(procs):
    working = procs.start("runworker")
    procs.start("runscheduler")
    last: list[str] = []

    def passes() -> bool:
        code, out = probe()
        last[:] = [out]
        return code == queuehealth.HEALTHY

    try:
        wait_until(passes, 30, "a healthy probe")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last probe printed:\n{last[0]}") from None
    job = tasks.add.enqueue(2, 3)
    assert job.wait(timeout=10) == 5

    procs.stop(working)  # SIGTERM: it unregisters as it exits

    done = manage("queuehealth", "--no-scheduler")
    assert done.returncode == queuehealth.NO_LIVE_WORKER, done.stdout + done.stderr
    assert "FAIL workers[high]: no live worker serves it" in done.stdout
    assert done.stdout.startswith("OK   redis: ")


# head_waits


def test_head_waits_counts_from_the_latest_of_enqueue_run_after_and_last_attempt(r, backend):
    queries = backend.queries
    jobs = {q: tasks.noop.using(queue_name=q).enqueue() for q in ("default", "low")}
    before = queries.clock_ms()
    fields = {
        "default": {"enqueued_at": before - 50_000, "last_attempted_at": before - 20_000},
        "low": {
            "enqueued_at": before - 50_000,
            "payload": json.dumps({"v": 1, "task": "t", "run_after": (before - 30_000) / 1000}),
        },
    }
    for queue, values in fields.items():
        r.hset(as_hash(r, backend.keys, jobs[queue].id), mapping=values)

    waits = queries.head_waits(QUEUES)
    after = queries.clock_ms()

    assert waits["high"] is None
    assert 20 <= waits["default"] <= 20 + (after - before) / 1000
    assert 30 <= waits["low"] <= 30 + (after - before) / 1000
    assert list(waits) == list(QUEUES)
    assert queries.head_waits([]) == {}
    # By a clock read before (queuehealth's, which a test pins): from that reading.
    assert queries.head_waits(QUEUES, before) == {"high": None, "default": 20.0, "low": 30.0}


hostile_fields = st.dictionaries(
    st.sampled_from(["enqueued_at", "last_attempted_at", "payload", "status"]),
    st.one_of(st.sampled_from(FRAGMENTS + TIMES), envelopes(("run_after",)), st.binary()),
    max_size=4,
)


@pytest.fixture
def fuzzing(report):
    with counted("head_waits", report):
        yield


@fuzz(150)
@given(
    queues=st.dictionaries(
        st.sampled_from(QUEUES),
        st.one_of(
            hostile_fields.map(lambda fields: ("hash", fields)),
            st.sampled_from([("string", {}), ("none", {})]),
        ),
        max_size=3,
    ),
    member=st.one_of(st.just("job1"), st.binary(max_size=200)),
    spoilt_queue=st.booleans(),
)
def test_fuzz_head_waits_never_raises_on_what_redis_holds(
    r, backend, fuzzing, queues, member, spoilt_queue
):
    TRIED["head_waits"] += 1
    r.flushall()
    keys = backend.keys
    for queue, (kind, fields) in queues.items():
        job_id = member + (queue.encode() if isinstance(member, bytes) else queue)
        r.zadd(keys.queue(queue), {job_id: 1})
        if isinstance(job_id, bytes):  # as the broker reads it
            job_id = job_id.decode("utf-8", "replace")
        job_key = keys.job(job_id)
        if kind == "hash" and fields:
            r.hset(job_key, mapping=fields)
        elif kind == "string":
            r.set(job_key, "not a hash")
    if spoilt_queue:
        r.set(keys.queue("high"), "not a sorted set")

    waits = backend.queries.head_waits(QUEUES)

    assert list(waits) == list(QUEUES)
    for queue, waited in waits.items():
        if queue in queues and not (spoilt_queue and queue == "high"):
            assert isinstance(waited, float) and 0 <= waited < 1e12
        else:
            assert waited is None
