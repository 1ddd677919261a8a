"""Connections lent one call at a time, without the connection pool: the pool takes a
lock and looks at the connection it lends on every call, system calls that cost an
enqueue a tenth of its client's time and hand the GIL to other threads
(docs/architecture.md, "Connections")."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Held = TypeVar("Held")


class Spares(Generic[Held]):
    """Things that each hold a connection (pinned brokers), lent to one call at a time:
    a spare one, else a new one from ``make``; as many as calls at once, not one a
    thread. ``make`` returns None where nothing can be held (then ``lend`` gives
    ``fallback``, which goes through the pool). ``close`` gives one's connection back
    to the pool: when the owner is done or gone (``close_all``), or this is garbage."""

    def __init__(
        self, make: Callable[[], Held | None], close: Callable[[Held], None], fallback: Held
    ) -> None:
        self._make = make
        self._close = close
        self._fallback = fallback
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._spare: list[Held] = []
        self._made: list[Held] = []
        # A thread's backend (and so its spares) goes with the thread: its connections
        # go back to a pool other threads share (a cache's), not held for good.
        self._finalizer = weakref.finalize(self, _close_all, self._made, self._close, self._pid)

    @contextlib.contextmanager
    def lend(self) -> Iterator[Held]:
        """One held by no other call until this one ends."""
        if self._pid != os.getpid():
            # A child process: the connections are the parent's, to neither use nor
            # close. Asked at each call, not only in Python's fork hooks, which a fork
            # in C skips (uWSGI's workers, unless py-call-uwsgi-fork-hooks is set).
            self._finalizer.detach()
            self._start()
        spare = self._spare  # close_all() replaces it: this lend is then of the past
        try:
            held = spare.pop()  # atomic: no lock, no system call
        except IndexError:
            made = self._make()
            if made is None:
                yield self._fallback
                return
            held = made
            self._made.append(held)
        try:
            yield held
        finally:
            if self._spare is spare:
                spare.append(held)
            else:  # closed while lent: given back now that its call has ended
                self._close(held)

    def close_all(self) -> None:
        """Give every connection back: the spare ones now, one lent now as its call
        ends (given back under a call in flight, the pool's next user would read that
        call's reply)."""
        spare, pid = self._spare, self._pid
        self._finalizer.detach()
        self._start()
        if pid == self._pid:  # not in a child (forked in C): the parent's are its own
            for held in spare:
                self._close(held)


def _close_all(made: list[Held], close: Callable[[Held], None], pid: int) -> None:
    if os.getpid() == pid:  # a child (forked in C) exits: the parent's are its own
        for held in made:
            close(held)
    made.clear()
