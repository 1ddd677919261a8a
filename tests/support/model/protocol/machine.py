"""The protocol model's state machine: the model's state, and the areas of the model
mixed in, one module each (the package's docstring lists them)."""

from __future__ import annotations

from collections import Counter

from django_redisqueue.store.broker import Broker
from django_redisqueue.store.queries import Queries
from tests.support.model.harness import RESULT_TTL, ModelMachine
from tests.support.model.protocol.broadcasts import BroadcastModel
from tests.support.model.protocol.core_model import CoreModel
from tests.support.model.protocol.core_operations import CoreOperations
from tests.support.model.protocol.core_rules import CoreRules
from tests.support.model.protocol.fairness import FairnessModel
from tests.support.model.protocol.fanout import FanOutModel
from tests.support.model.protocol.invariants import InvariantChecks
from tests.support.model.protocol.limits import LimitsModel
from tests.support.model.protocol.records import WORKERS, Group, Job, Message
from tests.support.model.protocol.relays import RelayModel
from tests.support.model.protocol.slots import SlotModel
from tests.support.model.protocol.trouble import RedisTrouble


class ProtocolMachine(
    CoreRules,
    CoreOperations,
    CoreModel,
    FanOutModel,
    BroadcastModel,
    LimitsModel,
    FairnessModel,
    RelayModel,
    RedisTrouble,
    SlotModel,
    InvariantChecks,
    ModelMachine,
):
    """The delivery protocol's model: its state is here, its moves, operations, rules
    and invariants in the mixins."""

    def __init__(self, env: dict) -> None:
        super().__init__(env)
        self.broker: Broker
        self.queries: Queries = env["queries"]
        self.jobs: dict[str, Job] = {}
        self.groups: dict[str, Group] = {}
        self.seq = 0
        self.paused: set[str] = set()
        self.held: dict[str, dict[str, str]] = {w: {} for w in WORKERS}
        self.slots = dict.fromkeys(WORKERS, 1)  # drawn by the first step
        self.forgotten: set[tuple[str, str]] = set()  # (job id, owner) a worker forgot
        self.issued: list[tuple[str, str]] = []  # every (job id, owner token) handed out
        # The hand-off: per worker registered as idle, its registration's order among
        # all and its queues in order; per worker, the job handed to it not yet taken.
        self.idle: dict[str, tuple[int, tuple[str, ...]]] = {}
        # Each worker's queues at its last registration, past those it registers on
        # too; and whether a registration past IDLE_QUEUES set idle-wide.
        self.idle_orders: dict[str, tuple[str, ...]] = {}
        self.idle_wide = False
        self.registrations = 0
        self.handed: dict[str, str] = {}
        self.stop_lists: dict[str, list[str]] = {}  # per worker, the jobs asked to stop
        self.stats: Counter[str] = Counter()
        self.heartbeats: set[str] = set()  # the members of {P}:workers
        self.silent: set[str] = set()  # among them, those last seen a lease ago
        self.records: set[str] = set()  # the workers whose {P}:worker:<id> exists
        self.schedulers: set[str] = set()
        # Broadcast: the last number, the messages, the unread set, the cursors, the
        # wake-up lists; per worker what it took (ever) and what it has yet to report.
        self.last_message = 0
        self.messages: dict[int, Message] = {}
        self.unread: set[int] = set()
        self.cursors: dict[str, int] = {}
        self.message_wakes: set[str] = set()
        self.received: dict[str, set[int]] = {w: set() for w in WORKERS}
        self.to_report: dict[str, list[int]] = {w: [] for w in WORKERS}
        self.lease_ms = self.broker.lease_ms
        self.handed_ms = self.broker.handed_ms
        self.last_clock = 0
        self.last_claim = 0  # Redis's clock after the last claim
        self.init_limits()
        self.init_relays()
        self.init_fairness()
        assert self.backend.config.result_ttl == RESULT_TTL
        self.started = self.clock()
