"""A throw-away ``redis-server`` for tests, benchmarks and demos.

    with RedisServer() as server:      # a free loopback port, a temporary directory
        client = redis.Redis.from_url(server.url)

Fault tests can ``kill()`` it and ``start()`` it again on the same port and directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

import redis


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server on 127.0.0.1, keeping nothing on disk unless asked to."""

    def __init__(self, *extra_args: str, port: int | None = None, directory: str = "") -> None:
        self.port = port or free_port()
        self.own_directory = not directory
        self.directory = directory or tempfile.mkdtemp(prefix="redisqueue-redis-")
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and return once it answers PING."""
        if not shutil.which("redis-server"):
            raise RuntimeError(
                "redis-server is not installed: sudo apt-get install redis-server "
                "(macOS: brew install redis)"
            )
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
                self.directory,
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
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

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
