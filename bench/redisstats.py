"""What the redis-server did over part of a workload: the commands it executed and the
CPU it used, from two snapshots of ``INFO commandstats cpu``.

Commands are counted as ``INFO commandstats`` counts them: a script (EVALSHA, FCALL)
counts once itself and once for each command it runs. The snapshots' own INFO calls
are left out: each snapshot is one INFO call, counted by Redis after it has run, so the
later snapshot sees exactly one of ours (the earlier one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

OWN_CALLS = {"cmdstat_info": 1}  # the earlier snapshot's INFO, seen by the later one


@dataclass(frozen=True, slots=True)
class Snapshot:
    calls: dict[str, int]  # by INFO's field name, cmdstat_<command>
    cpu: float  # seconds, used_cpu_sys + used_cpu_user (the whole server process)


@dataclass(frozen=True, slots=True)
class Usage:
    commands: int
    cpu: float  # seconds

    def per_job(self, jobs: int) -> tuple[float, float]:
        """Commands per job, and CPU microseconds per job."""
        return self.commands / jobs, self.cpu / jobs * 1e6


def snapshot(client: redis.Redis) -> Snapshot:
    info: dict[str, Any] = client.execute_command("INFO", "commandstats", "cpu")
    calls = {key: stat["calls"] for key, stat in info.items() if key.startswith("cmdstat_")}
    return Snapshot(calls, info["used_cpu_sys"] + info["used_cpu_user"])


def between(before: Snapshot, after: Snapshot) -> Usage:
    """What the server did from ``before`` to ``after``, less the snapshots' own calls."""
    commands = sum(
        calls - before.calls.get(key, 0) - OWN_CALLS.get(key, 0)
        for key, calls in after.calls.items()
    )
    return Usage(commands, after.cpu - before.cpu)
