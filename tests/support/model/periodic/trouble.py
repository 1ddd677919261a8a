"""Redis trouble in the periodic model: an error before a script call (nothing
changes), its reply lost after it ran (the model moves, the caller does not learn), a
real out-of-memory Redis, and SCRIPT FLUSH."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.support.model.harness import INJECTED, RUN, forget_scripts
from tests.support.model.periodic.schedules import POOL, SCHEDULERS, variants


class RedisTrouble:
    """The step in which Redis, or the way to it, fails."""

    @rule(
        trouble=st.sampled_from(["lost reply", "out of memory", "script flush", *INJECTED]),
        operation=st.integers(0, 5),
        s=st.integers(0, SCHEDULERS - 1),
        name=st.sampled_from(list(POOL)),
        pick=st.integers(0, 1 << 16),
    )
    def redis_trouble(self, trouble, operation, s, name, pick):
        """A Redis error before the next script call (nothing changes), its reply lost
        after it ran (the model moves, the caller does not learn), a real OOM
        (maxmemory below what is used: a script is refused before its first write, or
        runs whole), or SCRIPT FLUSH and FUNCTION FLUSH (the broker loads its scripts again)."""
        if trouble == "script flush":
            forget_scripts(self.r)
            return
        ops: list[Callable[[], Any]] = [
            lambda: self.op_call(s, name, bool(pick % 2), False, ""),
            lambda: self.op_step(s, bool(pick % 2), True),
            lambda: self.op_sync(variants(pick), s, bool(pick % 2), False),
            lambda: self.op_pause(name, True),
            lambda: self.op_pause(name, False),
            lambda: self.op_run_now(name, None, False),
        ]
        if trouble == "out of memory":
            self.r.config_set("maxmemory", 1)
            self.oom = True
            try:
                ops[operation]()
            except redis.exceptions.ResponseError as exc:
                assert "maxmemory" in str(exc), exc
                RUN["refused when out of memory"] += 1
            finally:
                self.oom = False
                self.r.config_set("maxmemory", 0)
            return
        exc = INJECTED["connection"]() if trouble == "lost reply" else INJECTED[trouble]()
        if trouble == "lost reply":
            self.client.lose_reply = exc
        else:
            self.client.fault = exc
        try:
            with contextlib.suppress(type(exc)):
                ops[operation]()
        finally:
            self.client.fault = self.client.lose_reply = None  # not used: no call made
