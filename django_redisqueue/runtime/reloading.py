"""``runworker --reload`` (development): restart the worker when the project's files
change, with Django's own autoreloader (the one ``runserver`` uses).

Two processes. The parent runs the command again as a child until it exits other than
with RELOAD_EXIT_CODE; unlike Django's ``restart_with_reloader`` it forwards SIGTERM
(and Ctrl-C, as SIGTERM), so that stopping the parent stops the worker instead of
orphaning it. The child runs the worker on its main thread, where signals and time
limits work, and the reloader on a daemon thread; a change stops the worker as SIGTERM
does, then the child exits with RELOAD_EXIT_CODE.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from django.utils import autoreload

logger = logging.getLogger(__name__)

# The child's exit code that asks the parent for a new child (as Django's reloader).
RELOAD_EXIT_CODE = 3
# Seconds the job in hand may go on after a change before it is given back.
RELOAD_GRACE = 10.0


def is_reload_child() -> bool:
    """True in the child process of ``--reload``, the one that runs the worker."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def run_reloading_parent() -> int:
    """Run this command again as a child until it exits with something other than
    RELOAD_EXIT_CODE, or this process is told to stop; return the child's exit code."""
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    arguments = autoreload.get_child_arguments()
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        child = subprocess.Popen(arguments, env=env, close_fds=False)
        if stopping:  # a signal that came in before the child was known
            child.send_signal(signal.SIGTERM)
        code = child.wait()
        if code != RELOAD_EXIT_CODE or stopping:
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell says


class ReloadWatcher:
    """In the child: Django's reloader on a daemon thread; on a change, stops what
    runs on the main thread (``attach``) and has the process exit RELOAD_EXIT_CODE."""

    def __init__(self, grace: float = RELOAD_GRACE) -> None:
        self.grace = grace
        self.reloader = autoreload.get_reloader()
        self.changed: Path | None = None
        self._changed_event = threading.Event()
        self._stop: Callable[[], None] | None = None
        self._give_back: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def start_after(self, import_tasks: Callable[[], None]) -> None:
        """Import the tasks modules, then watch every module loaded (so that the first
        look already sees them). If the import fails (a typo in a tasks module), log
        it and wait for a change to the files, the failed one included, then exit
        RELOAD_EXIT_CODE to try again, as ``runserver`` does."""
        # The reloading parent forwards a terminal's Ctrl-C as SIGTERM; the SIGINT
        # itself, sent to the whole process group, must not count as a second one.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            autoreload.check_errors(import_tasks)()  # remembers the file that failed
        except Exception:
            logger.exception("Could not import the tasks modules; waiting for a change")
            self.start()
            self.wait_for_change()
            sys.exit(RELOAD_EXIT_CODE)
        self.start()

    def start(self) -> None:
        """Watch the loaded modules on a daemon thread. "Watching for file changes" is
        logged once the reloader has taken its first look: a change before that goes
        unseen, as it is the reference."""
        autoreload.file_changed.connect(self._on_file_changed, dispatch_uid=id(self))
        ticks = self.reloader.tick

        def tick_and_tell() -> Iterator[None]:
            for number, _ in enumerate(ticks()):
                if number == 0:
                    logger.info("Watching for file changes with %s", type(self.reloader).__name__)
                yield

        setattr(self.reloader, "tick", tick_and_tell)  # noqa: B010 (an instance's method)
        # What reloader.run() does, less its wait for the apps (ready here) and its
        # import of the URLconf: the receivers (templates, translations) run here, and
        # the thread only looks at files. Importing while the pool forks could leave a
        # module's import lock held for ever in a child.
        autoreload.autoreload_started.send(sender=self.reloader)
        thread = threading.Thread(
            target=self.reloader.run_loop, name="redisqueue-reloader", daemon=True
        )
        thread.start()

    def attach(self, stop: Callable[[], None], give_back: Callable[[], None]) -> None:
        """On a change, call ``stop`` (finish the job in hand), and ``give_back`` if
        the job still runs ``grace`` seconds later. Both are called on the reloader's
        thread."""
        with self._lock:
            self._stop, self._give_back = stop, give_back
            changed = self.changed is not None
        if changed:  # a change seen while the worker was being set up
            self._stop_worker()

    def wait_for_change(self) -> None:
        """Block until a watched file changes (after an error at start, say)."""
        self._changed_event.wait()

    def exit_if_changed(self) -> None:
        """After the worker has stopped: exit RELOAD_EXIT_CODE if a change stopped it."""
        if self._timer is not None:
            self._timer.cancel()
        if self.changed is not None:
            sys.exit(RELOAD_EXIT_CODE)

    def _on_file_changed(self, sender: object, file_path: Path, **kwargs: Any) -> bool | None:
        if sender is not self.reloader or handled_by_django(file_path):
            return None
        with self._lock:
            first = self.changed is None
            if first:
                self.changed = file_path
            attached = self._stop is not None
        if first:
            logger.info("Reloading: %s changed", file_path)
            self._changed_event.set()
            if attached:
                self._stop_worker()
        return True  # else Django's reloader would sys.exit(3) on its own thread

    def _stop_worker(self) -> None:
        assert self._stop is not None and self._give_back is not None
        self._stop()
        self._timer = threading.Timer(self.grace, self._give_back_now)
        self._timer.daemon = True
        self._timer.start()

    def _give_back_now(self) -> None:
        logger.warning(
            "Reloading: the job in hand still runs after %.0f s; giving it back to its queue",
            self.grace,
        )
        assert self._give_back is not None
        self._give_back()


def handled_by_django(file_path: Path) -> bool:
    """True for the files Django's own receivers reload in place (templates,
    translations), which need no restart."""
    if file_path.suffix == ".mo":
        return True
    if file_path.suffix == ".py":
        return False
    from django.template.autoreload import get_template_directories

    return any(directory in file_path.parents for directory in get_template_directories())


def give_back_running_job() -> None:
    """What a second SIGTERM does to a single worker: its handler gives the running job
    back (Worker._on_signal raises WorkerShutdown in the task)."""
    os.kill(os.getpid(), signal.SIGTERM)
