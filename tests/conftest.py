import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from unittest.mock import patch

import pytest
import redis
from django.test import override_settings

from django_redisqueue.store.gateway import Gateway
from tests.support.servers import RedisServer, server_program
from tests.support.topologies import RedisClusterGroup
from tests.support.topology import (
    CLUSTER_ENV,
    ON_CLUSTER,
    keys_server,
    make_client,
)

ROOT = Path(__file__).resolve().parent.parent

# The suites start hundreds of Python processes (workers, schedulers, manage.py), each of
# which imports Django: in about 1 s from compiled files, in 3 s from source. An
# environment that forbids writing compiled files (PYTHONDONTWRITEBYTECODE, as uv also
# installs without them) would have every process compile Django again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def wait_until(predicate, timeout: float = 10.0, message: str = "condition"):
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(0.01)


def _utf8(text: str) -> str:
    """``text`` with lone surrogates escaped: fuzz tests log them, and pytest-xdist
    cannot send them from its workers."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@contextmanager
def clock_at(moment: datetime | int) -> Iterator[int]:
    """Redis's clock as this process reads it (``Gateway.clock_ms``: a dashboard page's
    "now", the periodic page's next runs, queuehealth's ages) stopped at ``moment`` (a
    datetime or ms); yields it in ms. Scripts still read Redis's own clock."""
    at_ms = moment if isinstance(moment, int) else int(moment.timestamp() * 1000)
    with patch.object(Gateway, "clock_ms", return_value=at_ms):
        yield at_ms


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.sections = [(title, _utf8(content)) for title, content in report.sections]
    if report.longrepr is not None:
        longrepr = str(report.longrepr)
        if _utf8(longrepr) != longrepr:
            report.longrepr = _utf8(longrepr)


# The longest tests, first: started last, one of them would keep one process busy
# while the others idle at the end of a parallel run.
LONGEST_FIRST = ("test_protocol_model.py", "test_periodic_model.py", "test_faults.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)


FIGURES: list[str] = []


@pytest.fixture
def report():
    """Record a line of figures; they are printed at the end of the run."""
    return FIGURES.append


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@contextmanager
def use_redis(url: str, *, cluster: bool = False) -> Iterator[None]:
    """Point every task backend, and the processes the tests start, at ``url`` (with
    ``cluster``, a node of a Redis Cluster)."""
    from django.conf import settings

    tasks = {alias: dict(conf) for alias, conf in settings.TASKS.items()}
    for alias in [alias for alias in tasks if "URL" in tasks[alias]["OPTIONS"]]:
        options = {k: v for k, v in tasks[alias]["OPTIONS"].items() if k != "CLUSTER"}
        tasks[alias]["OPTIONS"] = {**options, "URL": url, **({"CLUSTER": True} if cluster else {})}
    caches = {"default": {**settings.CACHES["default"], "LOCATION": url}}
    previous = {name: os.environ.get(name) for name in ("REDISQUEUE_TEST_URL", CLUSTER_ENV)}
    os.environ["REDISQUEUE_TEST_URL"] = url
    os.environ.pop(CLUSTER_ENV, None)
    if cluster:
        os.environ[CLUSTER_ENV] = "1"
    try:
        with override_settings(TASKS=tasks, CACHES=caches):
            yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def private_redis(*args: str) -> Iterator[RedisServer]:
    """A redis-server of the test's own (``args`` passed on), which every backend and
    process the test starts uses, so that the test may kill, restart or spoil it."""
    server = RedisServer(*args)
    server.start()
    try:
        with use_redis(server.url):
            yield server
    finally:
        server.stop()


not_on_cluster = pytest.mark.skipif(ON_CLUSTER, reason="needs a single redis-server")


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    """Keep the test database's name as tests/support/settings.py gives it: already one file per
    pytest-xdist worker, and the workers the tests start must find it by that name
    (pytest-django would add a ``_gw0`` suffix)."""


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | RedisClusterGroup]:
    try:
        server_program()
    except RuntimeError as exc:
        pytest.exit(str(exc), 2)
    server: RedisServer | RedisClusterGroup = RedisClusterGroup() if ON_CLUSTER else RedisServer()
    server.start()
    with use_redis(server.url, cluster=ON_CLUSTER):
        yield server
    server.stop()


@pytest.fixture(autouse=True)
def r(request: pytest.FixtureRequest) -> redis.Redis | None:
    """A client of the private server, emptied before each test; None for a test
    marked ``pure``, which needs no Redis (none is started for it)."""
    if request.node.get_closest_marker("pure"):
        return None
    redis_server = request.getfixturevalue("redis_server")
    client = make_client(redis_server.url, decode_responses=True)
    client.flushall()
    return client


@pytest.fixture
def raw(redis_server) -> redis.Redis:
    """A client of the private server that reads and writes bytes, as hostile data
    (tests/support/fuzzing.py) may be any."""
    return redis.Redis.from_url(redis_server.url)


@pytest.fixture
def registered() -> frozenset[str]:
    """The task paths registered, the fuzzing's safe tasks among them."""
    from django_redisqueue.core.registry import registry
    from tests.support.fuzzing import SAFE_TASKS

    for path in SAFE_TASKS:
        assert registry.get(path) is not None, path
    return frozenset(registry.paths())


@pytest.fixture
def backend():
    from django_redisqueue.compat import task_backends

    return task_backends["default"]


def account(name, *perms, **flags):
    """A new user, password "pw", with the app's permissions ``perms``."""
    from django.contrib.auth.models import Permission, User

    created = User.objects.create_user(name, password="pw", **flags)
    for codename in perms:
        created.user_permissions.add(Permission.objects.get(codename=codename))
    return created


def user(name, *perms, **flags):
    """A test client logged in as a new user with the app's permissions ``perms``."""
    from django.test import Client

    client = Client()
    client.force_login(account(name, *perms, **flags))
    return client


@pytest.fixture
def viewer():
    return user("viewer", "view_dashboard", is_staff=True)


@pytest.fixture
def manager():
    return user("manager", "view_dashboard", "manage_queues", is_staff=True)


def run_worker_here(backend, **options):
    """Run a burst worker in this process, and return it. Inside a test's transaction
    the worker must not close the database connection between jobs, as Django's test
    client does not between requests."""
    from django_redisqueue.runtime.worker import Worker

    with patch("django_redisqueue.runtime.worker.close_old_connections"):
        worker = Worker(backend, burst=True, **options)
        worker.run()
    return worker


def blocked_clients(client: redis.Redis) -> list[dict]:
    """The connections blocked in BLPOP now: idle workers and sleeping schedulers.

    ``cmd`` is a connection's last command, blocked or not; flag ``b`` says it waits.
    """
    return [
        c
        for c in keys_server(client).client_list()
        if c.get("cmd") == "blpop" and "b" in c.get("flags", "")
    ]


def manage(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -m django ARGS`` with the test settings and wait for it."""
    kwargs.setdefault("timeout", 60)
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        **kwargs,
    )


class ManagedProcess(subprocess.Popen):
    """A background process whose output (stdout and stderr) a thread reads as it comes:
    a busy worker logs two lines a job, and would block on a full pipe nobody read."""

    def __init__(self, args: list[str], **kwargs) -> None:
        super().__init__(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
        )
        self._chunks: list[str] = []
        self._grown = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.stdout:  # until the pipe's last writer has closed it
            with self._grown:
                self._chunks.append(line)
                self._grown.notify_all()

    @property
    def output(self) -> str:
        """All the process printed so far."""
        with self._grown:
            return "".join(self._chunks)

    def expect(self, text: str, timeout: float) -> None:
        """Wait until the output holds ``text``."""
        deadline = time.monotonic() + timeout
        with self._grown:
            while text not in "".join(self._chunks):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no {text!r} in {''.join(self._chunks)!r}"
                assert self._reader.is_alive(), f"the process ended without printing {text!r}"
                self._grown.wait(min(remaining, 0.5))

    def communicate(self, input=None, timeout=None):
        """Wait for the process to end (TimeoutExpired after ``timeout``); return its
        whole output, as Popen's does with stdout piped."""
        self.wait(timeout)
        # Children of the process that outlive it (a pool's) may hold the pipe a moment.
        self._reader.join(timeout=10)
        return self.output, None


def start_manage(*args: str) -> ManagedProcess:
    """Start ``python -m django ARGS`` in the background, in its own process group."""
    return ManagedProcess(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=child_env(),
        start_new_session=True,
    )


def child_env() -> dict[str, str]:
    """The environment of the processes the tests start: the test settings, with the
    SQLite database only unless the test set REDISQUEUE_TEST_SQLITE_ONLY to ''."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "PYTHONPATH": str(ROOT),
        "REDISQUEUE_TEST_SQLITE_ONLY": os.environ.get("REDISQUEUE_TEST_SQLITE_ONLY", "1"),
    }


@pytest.fixture
def every_database_in_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes this test starts have PostgreSQL and MariaDB too
    (tests/support/settings.py)."""
    monkeypatch.setenv("REDISQUEUE_TEST_SQLITE_ONLY", "")


@pytest.fixture
def outbox_backends(settings) -> None:
    """An outbox backend for every database, "outbox-<alias>", as "outbox-default" is
    (tests/support/settings.py)."""
    base = settings.TASKS["outbox-default"]
    settings.TASKS = {
        **settings.TASKS,
        **{
            f"outbox-{alias}": {**base, "OPTIONS": {**base["OPTIONS"], "OUTBOX": alias}}
            for alias in settings.DATABASES
        },
    }


class Processes:
    """Background ``manage.py`` processes, each in its own process group."""

    def __init__(self):
        self.running = []

    def expect(self, process, text, timeout=30):
        """Read the process's output until ``text`` appears."""
        process.expect(text, timeout)

    def start(self, *args):
        process = start_manage(*args)
        self.running.append(process)
        return process

    def kill(self, process):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self.running.remove(process)

    def stop(self, process, signal_first=True):
        """SIGTERM, wait, and return the whole output."""
        if signal_first:
            process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
        self.running.remove(process)
        return output

    def stop_all(self):
        return [self.stop(p) for p in list(self.running)]


@pytest.fixture
def procs():
    processes = Processes()
    yield processes
    for process in processes.running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
