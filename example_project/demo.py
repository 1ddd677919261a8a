"""Run the example project: Redis (started here if none answers), the web server, a
worker and the scheduler, together. Ctrl-C stops them all. The worker runs with
``--reload``: edit example_project/shop/tasks.py and it restarts with the new code.

    python example_project/demo.py      (the README's `make demo` does the setup first)
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

HERE = Path(__file__).resolve().parent
REDIS_URL = os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
ADDRESS = os.environ.get("DEMO_ADDRESS", "127.0.0.1:8000")


def redis_answers() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def start_redis() -> subprocess.Popen[bytes] | None:
    """Start a redis-server for REDIS_URL, keeping nothing on disk, unless one answers
    there already."""
    if redis_answers():
        print(f"demo: using the Redis at {REDIS_URL}")
        return None
    url = urlparse(REDIS_URL)
    if url.hostname not in ("127.0.0.1", "localhost"):
        sys.exit(f"demo: no Redis answers at {REDIS_URL}; start it, or unset REDIS_URL.")
    if not shutil.which("redis-server"):
        sys.exit(
            f"demo: no Redis answers at {REDIS_URL} and redis-server is not installed.\n"
            "Install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: "
            "brew install redis) or point REDIS_URL at a running Redis."
        )
    port = str(url.port or 6379)
    print(f"demo: starting redis-server on port {port}")
    keep_nothing = ["--save", "", "--appendonly", "no"]
    server = subprocess.Popen(
        ["redis-server", "--port", port, "--bind", "127.0.0.1", *keep_nothing],
        stdout=subprocess.DEVNULL,
        process_group=0,
    )
    deadline = time.monotonic() + 10
    while not redis_answers():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            sys.exit(f"demo: redis-server did not start on port {port}")
        time.sleep(0.05)
    return server


def manage(*args: str) -> list[str]:
    return [sys.executable, str(HERE / "manage.py"), *args]


def main() -> None:
    server = start_redis()
    subprocess.run(manage("migrate", "--noinput", "-v0"), check=True)
    # A local-only admin account, so that the queue dashboard can be opened at once.
    subprocess.run(
        manage("createsuperuser", "--noinput", "--username", "admin", "--email", "a@example.com"),
        env={**os.environ, "DJANGO_SUPERUSER_PASSWORD": "admin"},
        capture_output=True,  # "already taken" on later runs: fine
    )
    # Each in a process group of its own: a terminal's Ctrl-C reaches only this script,
    # which stops each process once (a second SIGTERM would give the worker's running
    # job back to its queue).
    processes = [
        subprocess.Popen(command, process_group=0)
        for command in (
            manage("runserver", ADDRESS, "--noreload"),
            # Four slots: its email jobs (threads) and supplier jobs (async, on the
            # process's event loop) mostly wait.
            manage("runworker", "--reload", "--threads", "4"),
            manage("runscheduler"),
        )
    ]
    print(
        f"demo: open http://{ADDRESS}/ (queue dashboard: http://{ADDRESS}/admin/, user admin, "
        "password admin); edit shop/tasks.py and the worker restarts with it; press Ctrl-C "
        "here to stop everything"
    )

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Set them explicitly: a shell that starts us in the background ignores SIGINT. A
    # closed terminal's SIGHUP no longer reaches the other process groups: stop them.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        while all(p.poll() is None for p in processes):
            time.sleep(0.2)
        print("demo: a process exited; stopping the others")
    except KeyboardInterrupt:
        print("\ndemo: stopping")
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # the worker finishes its job first
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
