"""The backend's settings: ``TASKS[alias]["QUEUES"]`` and ``["OPTIONS"]``.

``validate()`` is the one set of rules: the system checks (``checks.py``) report what it
finds with an ID and a hint, and ``parse_options()`` raises with the same words, IDs
included, when a backend with wrong settings is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_redisqueue.compat import DEFAULT_TASK_QUEUE_NAME
from django_redisqueue.core.jobs import QUEUE_NAME_RE, ensure_json_arguments
from django_redisqueue.exceptions import ConfigurationError

DEFAULT_URL = "redis://127.0.0.1:6379/0"


# The caches whose connection pool CONNECTION shares: Django's own and django-redis's.
DJANGO_CACHE = "django.core.cache.backends.redis.RedisCache"
DJANGO_REDIS_CACHE = "django_redis.cache.RedisCache"


@dataclass(frozen=True, slots=True)
class Options:
    """Everything a backend reads from its settings, with defaults."""

    queues: tuple[str, ...]  # empty: any queue name is valid
    connection: str | None = None  # a CACHES alias: Django's Redis cache or django-redis's
    url: str | None = None
    key_prefix: str = ""
    result_ttl: int = 24 * 3600  # seconds a finished job's result is kept
    lease: float = 60.0  # seconds a worker holds a job without a heartbeat
    max_payload_bytes: int = 512 * 1024
    max_recoveries: int = 2  # times a job whose worker was lost is queued again
    enqueue_on_commit: bool = False  # enqueue() waits for the transaction to commit
    sentinels: tuple[tuple[str, int], ...] = ()  # Redis Sentinel: (host, port) of each
    service_name: str = ""  # the master's name that the sentinels monitor
    sentinel_kwargs: Mapping[str, Any] | None = None  # for the sentinels (password...)
    client_kwargs: Mapping[str, Any] | None = None  # for the Redis servers (password, db...)
    cluster: bool = False  # URL names a node of a Redis Cluster
    cluster_nodes: tuple[tuple[str, int], ...] = ()  # a cluster's startup nodes
    replica_acks: int = 0  # replicas that must have a write before it counts as done
    replica_acks_timeout: float = 1.0  # seconds to wait for them
    periodic: Mapping[str, Mapping[str, Any]] | None = None  # name -> schedule (core/schedules.py)
    metrics: bool = True  # workers count jobs for the Prometheus metrics (observe/metrics.py)
    # The databases whose transactions enqueue() writes jobs into (outbox.py); the first
    # is the one joined when no database is named. Empty: no outbox.
    outbox: tuple[str, ...] = ()
    # The queues that serve their jobs' fairness keys in turn (docs/howto/tasks.md,
    # "Share a queue fairly"); the others serve their jobs in order.
    fair_queues: frozenset[str] = frozenset()

    @property
    def redis_url(self) -> str:
        return self.url or DEFAULT_URL


OPTION_NAMES = {
    "CONNECTION": "connection",
    "URL": "url",
    "KEY_PREFIX": "key_prefix",
    "RESULT_TTL": "result_ttl",
    "LEASE": "lease",
    "MAX_PAYLOAD_BYTES": "max_payload_bytes",
    "MAX_RECOVERIES": "max_recoveries",
    "ENQUEUE_ON_COMMIT": "enqueue_on_commit",
    "SENTINELS": "sentinels",
    "SERVICE_NAME": "service_name",
    "SENTINEL_KWARGS": "sentinel_kwargs",
    "CLIENT_KWARGS": "client_kwargs",
    "CLUSTER": "cluster",
    "CLUSTER_NODES": "cluster_nodes",
    "REPLICA_ACKS": "replica_acks",
    "REPLICA_ACKS_TIMEOUT": "replica_acks_timeout",
    "PERIODIC": "periodic",
    "METRICS": "metrics",
    "OUTBOX": "outbox",
    "FAIR_QUEUES": "fair_queues",
}

# Whole-number options and their least value.
WHOLE_NUMBERS = {
    "RESULT_TTL": 1,
    "MAX_PAYLOAD_BYTES": 1,
    "MAX_RECOVERIES": 0,
    "REPLICA_ACKS": 0,
}
# The ways to name the Redis to use; a backend sets at most one of them.
CONNECTION_OPTIONS = ("CONNECTION", "URL", "SENTINELS", "CLUSTER_NODES")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a backend's settings; ``code`` is its system check ID's
    suffix (``E004`` is ``django_redisqueue.E004``)."""

    code: str
    msg: str
    hint: str

    @property
    def check_id(self) -> str:
        return f"django_redisqueue.{self.code}"

    def __str__(self) -> str:
        """As ``manage.py check`` shows it, on one line."""
        return f"({self.check_id}) {self.msg} HINT: {self.hint}"


def validate(alias: str, params: Mapping[str, Any]) -> list[Problem]:
    """Return every problem with ``TASKS[alias]``; an empty list means it is usable."""
    where = f"TASKS[{alias!r}]"
    problems = _queue_problems(where, _queues(params))
    raw = params.get("OPTIONS") or {}
    if not isinstance(raw, Mapping):
        return [
            *problems,
            Problem("E006", f"{where}['OPTIONS'] is {raw!r}.", "Make it a dict of options."),
        ]
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        problems.append(
            Problem(
                "E004",
                f"{where}['OPTIONS'] has unknown option(s) {', '.join(unknown)}.",
                f"Known options are {', '.join(sorted(OPTION_NAMES))}.",
            )
        )
    problems += _value_problems(f"{where}['OPTIONS']", raw)
    return problems + _fair_queue_problems(f"{where}['OPTIONS']", raw, _queues(params))


def _queue_problems(where: str, queues: Any) -> list[Problem]:
    if isinstance(queues, str) or not isinstance(queues, Sequence):
        return [
            Problem(
                "E001",
                f"{where}['QUEUES'] must be a list of queue names; got {queues!r}.",
                "List them in priority order, e.g. ['high', 'default', 'low'].",
            )
        ]
    problems = [
        Problem(
            "E002",
            f"{where}['QUEUES'] has an invalid queue name {name!r}.",
            "Use 1 to 64 letters, digits, '_', '.' or '-': a queue name is part of "
            "Redis keys and of runworker's arguments.",
        )
        for name in queues
        if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name)
    ]
    if len(set(map(repr, queues))) != len(queues):  # repr: a wrong entry may be a list
        problems.append(
            Problem(
                "E003",
                f"{where}['QUEUES'] lists a queue twice: {list(queues)!r}.",
                "List each queue once; the order is the priority order.",
            )
        )
    return problems


def _value_problems(where: str, raw: Mapping[str, Any]) -> list[Problem]:
    problems = _type_problems(where, raw)
    if raw.get("URL") is not None:
        problems += _url_problems(where, raw["URL"])
    chosen = [name for name in CONNECTION_OPTIONS if raw.get(name)]
    if len(chosen) > 1:
        problems.append(
            Problem(
                "E005",
                f"{where} sets {'both ' if len(chosen) == 2 else ''}"
                f"{', '.join(chosen[:-1])} and {chosen[-1]}.",
                "Keep one of them: CONNECTION reuses a Redis cache's connection pool "
                "(Django's, or django-redis's, which may itself use Sentinel), URL names "
                "one server (or, with CLUSTER, a node of a cluster), SENTINELS names the "
                "sentinels of a master, CLUSTER_NODES names nodes of a cluster.",
            )
        )
    elif raw.get("CONNECTION") is not None:
        problems += _connection_problems(where, raw["CONNECTION"])
    problems += _topology_problems(where, raw)
    if raw.get("PERIODIC") is not None:
        problems += _periodic_problems(f"{where}['PERIODIC']", raw["PERIODIC"])
    return problems + _outbox_problems(where, raw)


def _wrong(where: str, raw: Mapping[str, Any], name: str, hint: str) -> Problem:
    return Problem("E006", f"{where}[{name!r}] is {raw[name]!r}.", hint)


def _type_problems(where: str, raw: Mapping[str, Any]) -> list[Problem]:
    """The options that must be a number, a flag, a string or a dict."""
    problems = []

    def wrong(name: str, hint: str) -> None:
        problems.append(_wrong(where, raw, name, hint))

    for name, least in WHOLE_NUMBERS.items():
        value = raw.get(name, least)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            wrong(name, f"Use a whole number >= {least}.")
    lease = raw.get("LEASE", 60)
    if not isinstance(lease, int | float) or isinstance(lease, bool) or lease < 1:
        wrong("LEASE", "Use a number of seconds, at least 1.")
    for name in ("ENQUEUE_ON_COMMIT", "METRICS"):
        if not isinstance(raw.get(name, False), bool):
            wrong(name, "Use True or False.")
    if not isinstance(raw.get("KEY_PREFIX", ""), str):
        wrong("KEY_PREFIX", "Use a string.")
    timeout = raw.get("REPLICA_ACKS_TIMEOUT", 1)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        wrong("REPLICA_ACKS_TIMEOUT", "Use a number of seconds greater than 0.")
    for name in ("SENTINEL_KWARGS", "CLIENT_KWARGS"):
        if not isinstance(raw.get(name, {}), Mapping):
            wrong(name, "Use a dict of redis-py keyword arguments, e.g. {'password': '...'}.")
    if not isinstance(raw.get("CLUSTER", False), bool):
        wrong("CLUSTER", "Use True or False.")
    return problems


def _outbox_problems(where: str, raw: Mapping[str, Any]) -> list[Problem]:
    databases = outbox_databases(raw.get("OUTBOX", False))
    if databases is None:
        hint = "Use True (the 'default' database), a database alias, or a list of them."
        return [_wrong(where, raw, "OUTBOX", hint)]
    if missing := _unknown_databases(databases):
        hint = (
            f"DATABASES has no {' nor '.join(map(repr, missing))}: name an alias of "
            "DATABASES (the outbox's table lives in that database), or set OUTBOX to False."
        )
        return [_wrong(where, raw, "OUTBOX", hint)]
    return []


def _fair_queue_problems(where: str, raw: Mapping[str, Any], queues: Any) -> list[Problem]:
    fair = raw.get("FAIR_QUEUES", ())
    if isinstance(fair, str) or not isinstance(fair, Sequence):
        return [_wrong(where, raw, "FAIR_QUEUES", "Use a list of queue names.")]
    unknown = [
        name
        for name in fair
        if not (isinstance(name, str) and QUEUE_NAME_RE.fullmatch(name))
        or (isinstance(queues, list | tuple) and queues and name not in queues)
    ]
    if unknown:
        hint = "Name queues of QUEUES." if queues else "Use valid queue names."
        return [_wrong(where, raw, "FAIR_QUEUES", f"{hint} Not: {unknown!r:.200}.")]
    return []


def _unknown_databases(aliases: Sequence[str]) -> list[str]:
    from django.conf import settings

    databases = getattr(settings, "DATABASES", {})
    return [alias for alias in aliases if alias not in databases]


def outbox_databases(value: Any) -> tuple[str, ...] | None:
    """OUTBOX as the databases it names (False: none, True: 'default'); None if it is
    none of what OUTBOX may be."""
    if isinstance(value, bool):
        return (DEFAULT_DB_ALIAS,) if value else ()
    if isinstance(value, str):
        value = [value]
    if (
        isinstance(value, Sequence)
        and value
        and all(isinstance(alias, str) and alias for alias in value)
        and len(set(value)) == len(value)
    ):
        return tuple(value)
    return None


def _topology_problems(where: str, raw: Mapping[str, Any]) -> list[Problem]:
    """Address lists that are not (host, port) pairs, and options that do not fit
    together: SENTINELS without SERVICE_NAME (or the reverse), SENTINEL_KWARGS without
    SENTINELS, CLUSTER with SENTINELS or CONNECTION, CLIENT_KWARGS with CONNECTION."""
    problems = []
    sentinels = raw.get("SENTINELS")
    for name, example in (("SENTINELS", 26379), ("CLUSTER_NODES", 7000)):
        if raw.get(name) is not None and not _addresses(raw[name]):
            problems.append(
                Problem(
                    "E006",
                    f"{where}[{name!r}] is {raw[name]!r}.",
                    f"List them as (host, port) pairs, e.g. [('10.0.0.1', {example}), "
                    f"('10.0.0.2', {example}), ('10.0.0.3', {example})].",
                )
            )
    service = raw.get("SERVICE_NAME")
    if sentinels and not (isinstance(service, str) and service):
        problems.append(
            Problem(
                "E008",
                f"{where} sets SENTINELS but SERVICE_NAME is {service!r}.",
                "Set SERVICE_NAME to the master's name in the sentinels' configuration "
                "('sentinel monitor <name> ...'), e.g. 'mymaster'.",
            )
        )
    elif service is not None and not sentinels:
        problems.append(
            Problem(
                "E008",
                f"{where} sets SERVICE_NAME without SENTINELS.",
                "List the sentinels in SENTINELS, or remove SERVICE_NAME.",
            )
        )
    if raw.get("SENTINEL_KWARGS") is not None and not sentinels:
        problems.append(
            Problem(
                "E008",
                f"{where} sets SENTINEL_KWARGS without SENTINELS.",
                "List the sentinels in SENTINELS, or remove SENTINEL_KWARGS.",
            )
        )
    if raw.get("CLUSTER") and (sentinels or raw.get("CONNECTION")):
        problems.append(
            Problem(
                "E008",
                f"{where} sets CLUSTER with {'SENTINELS' if sentinels else 'CONNECTION'}.",
                "A Redis Cluster is named by URL (any one of its nodes); a cluster has no "
                "sentinels, and neither Django's Redis cache nor django-redis serves one.",
            )
        )
    if raw.get("CLIENT_KWARGS") and raw.get("CONNECTION"):
        problems.append(
            Problem(
                "E008",
                f"{where} sets CLIENT_KWARGS with CONNECTION.",
                "Set the connection's options in the CACHES entry that CONNECTION names.",
            )
        )
    return problems


# Periodic jobs (core/schedules.py): PERIODIC is {name: {"task": "app.tasks.f", "cron": "0 3 * * *"
# or "every": seconds, "args": [...], "kwargs": {...}, "catch_up": "latest" or "all"}}.
PERIODIC_FIELDS = ("task", "cron", "every", "args", "kwargs", "catch_up")
# How a schedule catches up on the occurrences it missed: one job, or one each.
CATCH_UP = ("latest", "all")
# An interval's bounds (seconds): the scheduler's finest step, and a year.
MIN_EVERY_SECONDS = 1
MAX_EVERY_SECONDS = 366 * 86400


def _periodic_problems(where: str, periodic: Any) -> list[Problem]:
    """E009: what is wrong with PERIODIC. Whether each task can be imported is checked
    at use, and by the W003 system check."""
    if not isinstance(periodic, Mapping):
        return [
            Problem(
                "E009",
                f"{where} is {periodic!r}.",
                "Make it a dict: schedule name -> {'task': 'app.tasks.f', 'cron': '0 3 * * *'}.",
            )
        ]
    problems = []
    for name, spec in periodic.items():
        if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
            problems.append(
                Problem(
                    "E009",
                    f"{where} has an invalid schedule name {name!r}.",
                    "Use 1 to 64 letters, digits, '_', '.' or '-': it is part of Redis keys "
                    "and job ids.",
                )
            )
        elif not isinstance(spec, Mapping):
            problems.append(
                Problem(
                    "E009",
                    f"{where}[{name!r}] is {spec!r}.",
                    "Make it a dict, e.g. {'task': 'app.tasks.f', 'every': 60}.",
                )
            )
        else:
            problems += [
                Problem("E009", f"{where}[{name!r}] {msg}", hint)
                for msg, hint in _schedule_problems(spec)
            ]
    return problems


def _schedule_problems(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with one schedule, as (message, hint) pairs."""
    problems = []
    unknown = sorted(map(str, set(spec) - set(PERIODIC_FIELDS)))
    if unknown:
        problems.append(
            (f"has unknown key(s) {', '.join(unknown)}.", f"Known: {', '.join(PERIODIC_FIELDS)}.")
        )
    task = spec.get("task")
    if not isinstance(task, str) or not task:
        problems.append(
            (f"names task {task!r}.", "Give the task's dotted path, e.g. 'shop.tasks.cleanup'.")
        )
    if ("cron" in spec) == ("every" in spec):
        problems.append(
            (
                "needs exactly one of 'cron' and 'every'.",
                "Use 'cron': '0 3 * * *' (minute hour day month weekday, in TIME_ZONE) or "
                "'every': seconds (a number or a timedelta).",
            )
        )
    elif "cron" in spec:
        problems += _cron_problems(spec["cron"])
    else:
        every = spec["every"]
        seconds = every.total_seconds() if isinstance(every, timedelta) else every
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not MIN_EVERY_SECONDS <= seconds <= MAX_EVERY_SECONDS
        ):
            problems.append(
                (
                    f"has 'every' {every!r}.",
                    f"Use a number of seconds ({MIN_EVERY_SECONDS} to {MAX_EVERY_SECONDS:,}: "
                    "a second to a year) or a timedelta.",
                )
            )
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    if not isinstance(args, list | tuple):
        problems.append((f"has 'args' {args!r}.", "Use a list of JSON values."))
    elif not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        problems.append((f"has 'kwargs' {kwargs!r}.", "Use a dict of JSON values, by name."))
    else:
        try:
            ensure_json_arguments(str(task), args, kwargs)
        except (TypeError, ValueError) as exc:
            problems.append((f"has arguments that JSON cannot carry: {exc}", "Pass JSON values."))
    if spec.get("catch_up", "latest") not in CATCH_UP:
        problems.append(
            (
                f"has 'catch_up' {spec['catch_up']!r}.",
                "Use 'latest' (one job for the missed occurrences) or 'all' (one each).",
            )
        )
    return problems


def _cron_problems(cron: Any) -> list[tuple[str, str]]:
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        return [
            (
                "has a 'cron' schedule, which needs cronsim.",
                "pip install 'django-redisqueue[cron]', or use 'every'.",
            )
        ]
    from datetime import UTC, datetime

    try:
        if not isinstance(cron, str):
            raise CronSimError("not a string")
        # Five fields: cronsim also reads a seconds field, for which it applies no
        # daylight-saving rule (a run could happen twice, or not at all).
        if len(cron.split()) != 5:
            raise CronSimError(f"{len(cron.split())} fields, not 5")
        # One that never matches (cronsim looks 50 years ahead) would stop the scheduler.
        next(CronSim(cron, datetime.now(UTC)))
    except StopIteration:
        return [
            (
                f"has 'cron' {cron!r}, which never matches.",
                "Use an expression with a run in the next fifty years.",
            )
        ]
    except CronSimError as exc:
        return [
            (
                f"has 'cron' {cron!r}, which cron cannot read ({exc}).",
                "Use five fields: minute hour day-of-month month day-of-week, "
                "e.g. '*/15 * * * *' or '0 3 * * mon-fri'.",
            )
        ]
    return []


def _addresses(value: Any) -> bool:
    """True for a non-empty list of (host, port) pairs."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        return False
    return all(
        isinstance(pair, Sequence)
        and not isinstance(pair, str)
        and len(pair) == 2
        and isinstance(pair[0], str)
        and isinstance(pair[1], int)
        and not isinstance(pair[1], bool)
        and 0 < pair[1] < 65536
        for pair in value
    )


def _url_problems(where: str, url: Any) -> list[Problem]:
    from redis.connection import parse_url

    try:
        if not isinstance(url, str):
            raise ValueError("not a string")
        parse_url(url)
    except ValueError as exc:
        return [
            Problem(
                "E006",
                f"{where}['URL'] is {url!r}, not a Redis URL ({exc}).",
                "Use e.g. 'redis://127.0.0.1:6379/0' (rediss:// for TLS, unix:// for a socket).",
            )
        ]
    return []


def _connection_problems(where: str, alias: Any) -> list[Problem]:
    from django.conf import settings
    from django.utils.module_loading import import_string

    caches = getattr(settings, "CACHES", {})
    hint = (
        f"Name a CACHES alias whose BACKEND is {DJANGO_CACHE!r} (Django's) or "
        f"{DJANGO_REDIS_CACHE!r} (django-redis), or set URL instead."
    )
    if not isinstance(alias, str) or alias not in caches:
        return [Problem("E007", f"{where}['CONNECTION'] {alias!r} is not in CACHES.", hint)]
    backend = caches[alias].get("BACKEND", "")
    try:
        cache_class = import_string(backend)
        redis_caches = tuple(map(import_string, (DJANGO_CACHE, DJANGO_REDIS_CACHE)))
        if isinstance(cache_class, type) and issubclass(cache_class, redis_caches):
            return []
    except ImportError:
        pass
    return [
        Problem(
            "E007",
            f"{where}['CONNECTION'] is {alias!r}, a {backend!r} cache: not a Redis one "
            "(Django's or django-redis's).",
            hint,
        )
    ]


def parse_options(alias: str, params: Mapping[str, Any]) -> Options:
    """Return the options of ``TASKS[alias]``; raise ConfigurationError if they are wrong,
    with every problem the system checks report, a line each."""
    problems = validate(alias, params)
    if problems:
        raise ConfigurationError("\n".join(map(str, problems)))
    raw = params.get("OPTIONS") or {}
    values: dict[str, Any] = {OPTION_NAMES[name]: value for name, value in raw.items()}
    values.setdefault("key_prefix", f"drq:{alias}")
    for name in ("sentinels", "cluster_nodes"):
        if name in values:
            values[name] = tuple((host, port) for host, port in values[name])
    values["outbox"] = outbox_databases(values.get("outbox", False))
    values["fair_queues"] = frozenset(values.get("fair_queues", ()))
    return Options(queues=tuple(_queues(params)), **values)


def _queues(params: Mapping[str, Any]) -> Any:
    """QUEUES as given; ["default"] when it is not given. An empty list, as in Django,
    means that any queue name is valid."""
    queues = params.get("QUEUES")
    return [DEFAULT_TASK_QUEUE_NAME] if queues is None else queues
