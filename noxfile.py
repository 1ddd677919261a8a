"""The test matrix, what ``make check`` runs after ``make test``: ``nox`` runs mypy
against the oldest redis-py that pyproject.toml accepts (``make test`` ran ruff, the
import layers and mypy with the newest), then on each supported (Python, Django) pair
what ``make test`` did not run there. ``make test`` runs the suite in .venv, on the
oldest pair, but for the browser, failover and long tests and with the model-based tests
at a third of their examples; so the oldest pair's session runs the model-based tests at
their full examples and the browser tests. On the pair between, the suites where
Django's version shows (its tasks API and the backport, the admin's markup, the checks);
on the newest pair those Django suites again, the suites where Python's version shows
(processes, signals, threads: the pool, reload, the metrics server, the demo), the
browser, failover and long tests, and the core suites again on a Redis Cluster. On every pair,
Django's own ``tests/tasks/`` against this backend. The suites that test Redis and the
Lua scripts alone (the protocol models, Redis errors, faults, fuzzing of what Redis
holds), which no Django or Python version changes, run on the oldest pair only, and so
do the suites where the server shows, again on Redis 6.2 and on Valkey 8.1.
``nox -s tests-3.11`` runs one pair, ``nox -s lint`` the type check.

The ``tests`` sessions need ``redis-server`` on the PATH: the suites start their own.
"""

from __future__ import annotations

import glob
import os

import nox

# (Python, Django, extras): Django 5.2 has no django.tasks; the backport provides it.
MATRIX = [
    ("3.11", "5.2", "dev,django52,hiredis"),
    ("3.12", "6.0", "dev,hiredis"),
    ("3.13", "6.1", "dev,hiredis"),
]

# The suites of Redis and the Lua scripts alone: on the oldest pair only.
REDIS_SUITES = [
    "tests/test_protocol_model.py",
    "tests/test_periodic_model.py",
    "tests/test_redis_errors.py",
    "tests/test_faults.py",
    "tests/test_fanout_faults.py",
    "tests/test_fuzz.py",
    "tests/test_fuzz_dashboard.py",
    "tests/test_replication.py",
    "tests/test_topology_servers.py",
    "tests/test_limits.py",
    "tests/test_unique.py",
    "tests/test_broker.py",
    "tests/test_queries.py",
    "tests/test_lua_facts.py",
]
# On the pair between the oldest and the newest: where Django's version shows (the
# tasks API and its backport, results and signals, the admin's markup, the checks, the
# docs' samples and the testing helpers).
DJANGO_SUITES = [
    "tests/test_conformance.py",
    "tests/test_enqueue.py",
    "tests/test_immediate.py",
    "tests/test_on_commit.py",
    "tests/test_checks.py",
    "tests/test_worker.py",
    "tests/test_admin.py",
    "tests/test_admin_lists.py",
    "tests/test_admin_queues.py",
    "tests/test_admin_fanout.py",
    "tests/test_admin_periodic.py",
    "tests/test_readme.py",
    "tests/test_docs.py",
    "tests/test_testing.py",
]
# The browser tests compare the oldest and the newest Django's admin.
BROWSER = "tests/test_browser.py"
# On the newest pair, besides DJANGO_SUITES: where Python's version shows, and the
# failover tests (Sentinel and Cluster chaos).
NEWEST_SUITES = [
    *DJANGO_SUITES,
    "tests/test_worker_ops.py",
    "tests/test_metrics.py",
    "tests/test_queuehealth.py",
    "tests/test_example_project.py",
    "tests/test_failover.py",
    BROWSER,
]
# What the oldest pair's session adds to ``make test``, which ran the rest on that pair.
OLDEST_REST = ["tests/test_protocol_model.py", "tests/test_periodic_model.py", BROWSER]

# On the oldest pair, again on each server a package of the dev extra ships
# (REDISQUEUE_TEST_SERVER, tests/support/servers.py): Redis 6.2, which has no Functions (the
# scripts by EVALSHA) and words its errors its own way, and Valkey 8.1. What the server
# decides: how the scripts are called, every script (the broker's suite), enqueue, the
# workers' and the scheduler's blocking waits, the hand-off, the slots' own claims, and
# the protocol model at a few examples.
SERVERS = ["redis-6.2", "valkey-8.1"]
SERVER_TESTS = [
    "tests/test_script_calls.py",
    "tests/test_broker.py",
    "tests/test_lua_facts.py",
    "tests/test_enqueue.py",
    "tests/test_worker.py",
    "tests/test_scheduler.py",
    "tests/test_handoff.py",
    "tests/test_fair.py",
    "tests/test_entries.py",
    "tests/test_slots.py",
    "tests/test_protocol_model.py",
    "tests/test_faults.py::test_redis_loading_its_data_is_a_refusal_that_workers_wait_out",
]
SERVER_MODEL_EXAMPLES = "20"

# The suites that run a second time on a Redis Cluster.
CLUSTER_TESTS = [
    "tests/test_broker.py",
    "tests/test_enqueue.py",
    "tests/test_on_commit.py",
    "tests/test_worker.py",
    "tests/test_scheduler.py",
    "tests/test_admin.py",
    "tests/test_admin_lists.py",
    "tests/test_fanout.py",
    "tests/test_handoff.py",
    "tests/test_fair.py",
    "tests/test_entries.py",
]

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
# uv builds each session's virtualenv in seconds (pip took most of a minute).
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True


def _find_pyenv_interpreters() -> None:
    """Put pyenv's installed Pythons on the PATH, ahead of its shims.

    A shim answers only for the versions ``pyenv global`` names; the others are
    installed but would look missing.
    """
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    dirs = []
    for python, _, _ in MATRIX:
        dirs += sorted(glob.glob(os.path.join(root, "versions", f"{python}.*", "bin")))[-1:]
    if dirs:
        os.environ["PATH"] = os.pathsep.join([*dirs, os.environ.get("PATH", "")])


_find_pyenv_interpreters()


@nox.session(python=MATRIX[0][0])
def lint(session: nox.Session) -> None:
    """mypy with the oldest redis-py that pyproject.toml accepts: redis-py's annotations
    differ between versions, and ``make test`` checked the newest. django-stubs describe
    django.tasks, which the backport mirrors, so one Python is enough."""
    session.install("-e", f".[{MATRIX[0][2]}]", "redis==5.0.*")
    session.run("mypy")


def long_tests(session: nox.Session) -> list[str]:
    """The ids of the tests marked long, in any file."""
    listed = session.run("pytest", "--collect-only", "-q", "-m", "long", silent=True)
    return [line for line in str(listed).splitlines() if "::" in line]


@nox.session(python=[python for python, _, _ in MATRIX])
def tests(session: nox.Session) -> None:
    """On one (Python, Django) pair: the test suite, then Django's own tests/tasks/
    against RedisQueueBackend (from the sdist of the Django installed, downloaded once
    into .nox/django-suite-cache; see docs/explanation/conformance.md), each with a private
    redis-server. Arguments after ``--`` go to pytest."""
    django, extras = next((d, e) for p, d, e in MATRIX if p == session.python)
    # pip: tests.django_suite downloads Django's sdist with it (uv's venvs have none).
    session.install("-e", f".[{extras}]", f"django~={django}.0", "pip")
    session.run("python", "-m", "django", "--version")
    oldest, newest = session.python == MATRIX[0][0], session.python == MATRIX[-1][0]
    if session.posargs:
        chosen: list[str] = []
    else:
        chosen = OLDEST_REST if oldest else NEWEST_SUITES if newest else DJANGO_SUITES
    if newest and not session.posargs:
        # The long runs (a minute or more each), wherever they are, first among the rest:
        # a run of their own would leave a core idle while its one test waits.
        chosen = [*long_tests(session), *chosen]
    session.run(
        "pytest",
        *chosen,
        # One process per core (pytest-xdist), each with a redis-server of its own.
        "--numprocesses=auto",
        # The failover tests (Sentinel and Cluster chaos) and the long runs take minutes:
        # newest pair only.
        *(() if newest else ("-m", "not failover and not long")),
        *(() if oldest else (f"--ignore={path}" for path in REDIS_SUITES)),
        *session.posargs,
        # The browser tests' screenshots of every page, light and dark, per Django.
        env={"REDISQUEUE_SCREENSHOTS": "test-artifacts/screenshots"},
    )
    if newest and not session.posargs:
        # The core, scheduler, admin, hand-off, fair-queue and entry tests again, on a
        # Redis Cluster of 3 masters and 3 replicas (tests/support/topology.py).
        session.run(
            "pytest",
            "--numprocesses=auto",
            *CLUSTER_TESTS,
            env={"REDISQUEUE_TEST_TOPOLOGY": "cluster"},
        )
    if oldest and not session.posargs:
        for server in SERVERS:
            session.run(
                "pytest",
                "--numprocesses=auto",
                "-m",
                "not failover and not long",
                *SERVER_TESTS,
                env={
                    "REDISQUEUE_TEST_SERVER": server,
                    "REDISQUEUE_MODEL_EXAMPLES": SERVER_MODEL_EXAMPLES,
                },
            )
    session.run("python", "-m", "tests.django_suite")
