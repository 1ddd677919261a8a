"""System checks (``manage.py check``), registered by the app's ``ready()``; each ID is
described in docs/reference/checks.md.

W004 (the app is not in ``INSTALLED_APPS``) is the backend's own ``check()``: the checks
registered here run only when the app is installed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from django.apps import AppConfig, apps
from django.core import checks
from django.core.management import find_commands

from django_redisqueue.backends import outbox
from django_redisqueue.backends.redis import RedisQueueBackend, our_backends
from django_redisqueue.core.conf import parse_options, validate

APP = "django_redisqueue"
COMMANDS = ("runworker", "runscheduler")
# Seconds the deploy check waits for Redis: a check must not hang.
PING_TIMEOUT = 2.0


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every problem with the settings of every RedisQueueBackend (E001 to E009)."""
    return [
        checks.Error(problem.msg, hint=problem.hint, id=problem.check_id)
        for alias, params in our_backends()
        for problem in validate(alias, params)
    ]


def check_redis(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W001: each RedisQueueBackend's Redis answers a PING within PING_TIMEOUT."""
    from django_redisqueue.compat import task_backends

    messages: list[checks.CheckMessage] = []
    for alias, params in our_backends():
        if validate(alias, params):
            continue  # the settings errors say what to fix first
        backend = cast(RedisQueueBackend, task_backends[alias])  # our_backends() says so
        try:
            backend.queries.ping(PING_TIMEOUT)
        except Exception as exc:  # any failure to get a PONG back is the finding
            config = backend.config
            if config.connection:
                where = f"CACHES[{config.connection!r}]"
            elif config.sentinels:
                sentinels = ", ".join(f"{host}:{port}" for host, port in config.sentinels)
                where = f"service {config.service_name!r} of the sentinels {sentinels}"
            elif config.cluster_nodes:
                nodes = ", ".join(f"{host}:{port}" for host, port in config.cluster_nodes)
                where = f"cluster nodes {nodes}"
            else:
                where = _safe(config.redis_url)
            messages.append(
                checks.Warning(
                    f"The Redis of TASKS[{alias!r}] did not answer ({where}): {exc}",
                    hint="Start Redis or fix how OPTIONS name it (URL, CONNECTION, SENTINELS, "
                    "CLUSTER_NODES): until it answers, "
                    "enqueueing raises BrokerUnavailable and no job runs.",
                    id=f"{APP}.W001",
                )
            )
    return messages


def _safe(url: str) -> str:
    """The URL without its password, for a message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def check_commands(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W002: ``manage.py runworker`` / ``runscheduler`` run this app's commands."""
    messages: list[checks.CheckMessage] = []
    for command in COMMANDS:
        # Django runs the command of the first app in INSTALLED_APPS that has one.
        owner = next(
            (
                config
                for config in apps.get_app_configs()
                if command in find_commands(os.path.join(config.path, "management"))
            ),
            None,
        )
        if owner is None or owner.name == APP:
            continue
        messages.append(
            checks.Warning(
                f"'manage.py {command}' runs the command of {owner.name!r}, not "
                f"{APP}'s: {owner.name!r} comes first in INSTALLED_APPS.",
                hint=f"List {APP!r} before {owner.name!r} in INSTALLED_APPS (Django runs "
                "the command of the app listed first; Django Channels, for one, has "
                "a runworker).",
                id=f"{APP}.W002",
            )
        )
    return messages


def check_periodic_tasks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W003: each PERIODIC schedule's task can be imported, is a task, and is one its
    backend accepts and its workers know (an installed app's ``tasks`` module)."""
    from django_redisqueue.compat import task_backends
    from django_redisqueue.core.registry import registry
    from django_redisqueue.runtime.periodic import PeriodicTaskError, resolve_task, schedules_of

    messages: list[checks.CheckMessage] = []
    for alias, params in our_backends():
        if validate(alias, params):
            continue  # the settings errors say what to fix first
        backend = cast(RedisQueueBackend, task_backends[alias])
        for schedule in schedules_of(backend):
            try:
                resolve_task(backend, schedule)
            except PeriodicTaskError as exc:
                problem = str(exc)
            else:
                if registry.get(schedule.task_path) is not None:
                    continue
                problem = (
                    f"Periodic job {schedule.name!r}: task {schedule.task_path!r} is in no "
                    "installed app's tasks module, so workers will not run it."
                )
            messages.append(
                checks.Warning(
                    f"TASKS[{alias!r}]['OPTIONS']['PERIODIC']: {problem}",
                    hint="Name a function decorated with @task in an installed app's "
                    "tasks.py, by its dotted path. Until then the scheduler logs this "
                    "error and enqueues nothing for this schedule.",
                    id=f"{APP}.W003",
                )
            )
    return messages


def check_outbox_tables(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """W005: each database of ``databases`` (``check --database``) that an OUTBOX names
    has the outbox's table. A warning, as ``migrate`` runs it too, and must go on to
    create the table; and as a scheduler goes on with its other work meanwhile."""
    from django_redisqueue.compat import task_backends

    outboxes: dict[str, list[str]] = {}  # database -> the backends whose outbox it holds
    for alias, params in our_backends():
        if validate(alias, params):
            continue  # the settings errors say what to fix first
        backend = cast(RedisQueueBackend, task_backends[alias])
        for database in backend.config.outbox:
            if database in (databases or ()):
                outboxes.setdefault(database, []).append(alias)
    messages: list[checks.CheckMessage] = []
    for database, aliases in outboxes.items():
        users = ", ".join(f"TASKS[{alias!r}]" for alias in aliases)
        try:
            if outbox.has_table(database):
                continue
        except outbox.OUTBOX_ERRORS as exc:
            problem = f"cannot be read: {exc}"
            fix = "Start the database, or fix its entry in DATABASES"
        else:
            problem = "has no outbox table (its migration is not applied)"
            fix = f"Run `{outbox.migrate_command(database)}`"
        messages.append(
            checks.Warning(
                f"Database {database!r} {problem}; the OUTBOX of {users} names it.",
                hint=f"{fix}. Until then, enqueue() in a transaction on it raises, and "
                "runscheduler relays nothing from it (its other work goes on).",
                id=f"{APP}.W005",
            )
        )
    return messages


def check_outbox_prefixes(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W006: backends with an OUTBOX keep their relay records under their KEY_PREFIX,
    and each one's runscheduler drops the records of rows its own databases no longer
    hold: two sharing a prefix, their outboxes in different databases, would drop each
    other's (on one Redis; the check cannot tell whether theirs is one)."""
    by_prefix: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for alias, params in our_backends():
        if validate(alias, params):
            continue  # the settings errors say what to fix first
        options = parse_options(alias, params)
        if options.outbox:
            by_prefix.setdefault(options.key_prefix, []).append((alias, frozenset(options.outbox)))
    return [
        checks.Warning(
            f"{' and '.join(f'TASKS[{alias!r}]' for alias, _ in sharing)} have outboxes in "
            f"different databases and share KEY_PREFIX {prefix!r}: on one Redis, each "
            "one's runscheduler would drop the other's relay records, and a row relayed "
            "late could then store its job again.",
            hint="Give each its own KEY_PREFIX (by default 'drq:<alias>'), or its own Redis.",
            id=f"{APP}.W006",
        )
        for prefix, sharing in by_prefix.items()
        if len({databases for _, databases in sharing}) > 1
    ]


def register() -> None:
    """Register the checks; called from ``RedisQueueConfig.ready()``."""
    checks.register(check_settings)
    checks.register(check_periodic_tasks)
    checks.register(check_commands)
    checks.register(check_redis, deploy=True)
    checks.register(check_outbox_tables, checks.Tags.database)
    checks.register(check_outbox_prefixes)
