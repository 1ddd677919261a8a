import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.test import override_settings

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


class RedisServer:
    """A private redis-server on a free loopback port, with its own directory."""

    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="redisqueue-test-")
        self.port = free_port()
        self.extra = extra
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, message="redis-server to answer")

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def redis_server() -> Iterator[RedisServer]:
    if not shutil.which("redis-server"):
        pytest.exit("redis-server is not installed: apt-get install redis-server", 2)
    server = RedisServer()
    server.start()
    os.environ["REDISQUEUE_TEST_URL"] = server.url
    from django.conf import settings

    tasks = {alias: dict(conf) for alias, conf in settings.TASKS.items()}
    tasks["default"]["OPTIONS"] = {"URL": server.url}
    caches = {"default": {**settings.CACHES["default"], "LOCATION": server.url}}
    with override_settings(TASKS=tasks, CACHES=caches):
        yield server
    server.stop()


@pytest.fixture(autouse=True)
def r(redis_server: RedisServer) -> redis.Redis:
    """A client of the private server, emptied before each test."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushall()
    return client


@pytest.fixture
def backend():
    from django_redisqueue.compat import task_backends

    return task_backends["default"]


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


def start_manage(*args: str) -> subprocess.Popen:
    """Start ``python -m django ARGS`` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
