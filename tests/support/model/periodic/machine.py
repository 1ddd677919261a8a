"""The periodic model's state machine: the model's state, and the areas of the model
mixed in, one module each (the package's docstring lists them)."""

from __future__ import annotations

from typing import Any

from django_redisqueue.core.schedules import Schedule
from django_redisqueue.runtime.periodic import PeriodicStep
from tests.support.model.harness import ModelMachine
from tests.support.model.periodic.calls import CheckedCalls, ModelBroker
from tests.support.model.periodic.invariants import InvariantChecks
from tests.support.model.periodic.model import PeriodicModel
from tests.support.model.periodic.schedules import SCHEDULERS
from tests.support.model.periodic.steps import PeriodicSteps
from tests.support.model.periodic.trouble import RedisTrouble


class PeriodicMachine(
    PeriodicSteps, CheckedCalls, PeriodicModel, RedisTrouble, InvariantChecks, ModelMachine
):
    """Periodic jobs' model: its state is here, its moves, checks, steps and invariants
    in the mixins."""

    def __init__(self, env: dict) -> None:
        super().__init__(env)
        self.broker: ModelBroker
        self.broker.model = self
        self.oom = False  # Redis is out of memory (maxmemory 1)
        self.failure: AssertionError | None = None  # a script call that went wrong
        self.rogue = False  # a caller sends occurrences that are not due
        # The model of Redis.
        self.names: set[str] | None = set()  # None: the key is spoilt (a string)
        self.states: dict[str, dict[str, Any] | str] = {}  # a string: spoilt
        self.jobs: dict[str, dict[str, Any]] = {}  # stored by the scripts
        self.ended: set[str] = set()  # among them, those a worker ran (TTL)
        # Unique keys: the job holding each, and whether the key has a TTL (a window).
        self.unique: dict[str, tuple[str, bool]] = {}
        # Per schedule, the occurrences skipped while its unique key was held.
        self.overlapping: dict[str, set[int]] = {}
        self.taken: dict[str, dict[str, str]] = {}  # finished jobs written by hand
        self.queues: dict[str, dict[str, int]] = {}  # queue -> {job id: score}
        self.wakes: set[str] = set()
        self.known_queues: set[str] = set()
        # Limit keys' rate windows (lib/limits.lua's rate_window): the largest rate and the
        # longest period of the jobs with a rate stored; they expire.
        self.windows: dict[str, tuple[int, int]] = {}
        self.seq = 0
        # Each scheduler's settings (a rolling deploy gives some of them new ones), the
        # scheduler making the call in hand, per name the schedule of the sync Redis
        # holds (the one in force) and when its timetable was registered, and per "all"
        # schedule the start of the span (base, last] in which every occurrence has a job.
        self.settings: list[dict[str, Schedule]] = [{} for _ in range(SCHEDULERS)]
        self.caller = 0
        self.in_force: dict[str, Schedule] = {}
        self.registered: dict[str, int] = {}
        self.steppers = [PeriodicStep(self.backend) for _ in range(SCHEDULERS)]
        self.ticks: list[int | None] = [None] * SCHEDULERS
        self.base: dict[str, int] = {}
        self.reset: set[str] = set()  # names whose base is their new last, once settled
