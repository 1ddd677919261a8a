"""The test matrix: ``nox`` runs ruff and mypy once, then on every supported (Python,
Django) pair the test suite and Django's own ``tests/tasks/`` against this backend (on
the newest pair also the failover tests, and the core suites on a Redis Cluster);
``nox -s tests-3.11`` runs one pair, ``nox -s lint`` ruff and mypy.

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

# Left out on the middle pair: the browser tests compare the oldest and newest Django's
# admin, and the protocol models test the Lua scripts, which no Django version changes.
MIDDLE_PAIR_SKIPS = [
    "tests/test_browser.py",
    "tests/test_protocol_model.py",
    "tests/test_periodic_model.py",
]

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
]

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
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
    """ruff (lint and format check) and mypy on the package, once: django-stubs describe
    django.tasks, which the backport mirrors, so one Python is enough."""
    session.install("-e", f".[{MATRIX[0][2]}]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # redis-py's annotations differ between versions: check the newest and the oldest
    # that pyproject.toml accepts.
    session.install("--upgrade", "redis")
    session.run("mypy")
    session.install("redis==5.0.*")
    session.run("mypy")


@nox.session(python=[python for python, _, _ in MATRIX])
def tests(session: nox.Session) -> None:
    """On one (Python, Django) pair: the test suite, then Django's own tests/tasks/
    against RedisQueueBackend (from the sdist of the Django installed, downloaded once
    into .nox/django-suite-cache; see docs/conformance.md), each with a private
    redis-server. Arguments after ``--`` go to pytest."""
    django, extras = next((d, e) for p, d, e in MATRIX if p == session.python)
    session.install("-e", f".[{extras}]", f"django~={django}.0")
    session.run("python", "-m", "django", "--version")
    newest = session.python == MATRIX[-1][0]
    # The failover tests (Sentinel and Cluster chaos) and the long ones take minutes: on
    # the newest pair.
    # The model-based tests run their full number of examples there too; a third of it
    # on the older pairs, which share the protocol (its Lua) with the newest.
    middle = session.python not in (MATRIX[0][0], MATRIX[-1][0])
    session.run(
        "pytest",
        # One process per core (pytest-xdist), each with a redis-server of its own.
        "--numprocesses=auto",
        *(() if newest else ("-m", "not failover and not long")),
        *(f"--ignore={path}" for path in MIDDLE_PAIR_SKIPS if middle),
        *session.posargs,
        env={
            # The browser tests' screenshots of every page, light and dark, per Django.
            "REDISQUEUE_SCREENSHOTS": "test-artifacts/screenshots",
            **(
                {}
                if newest
                else {"REDISQUEUE_MODEL_EXAMPLES": "100", "REDISQUEUE_PERIODIC_EXAMPLES": "80"}
            ),
        },
    )
    if newest and not session.posargs:
        # The core, scheduler and admin tests again, on a Redis Cluster of 3 masters and
        # 3 replicas (tests/topology.py).
        session.run(
            "pytest",
            "--numprocesses=auto",
            *CLUSTER_TESTS,
            env={"REDISQUEUE_TEST_TOPOLOGY": "cluster"},
        )
    session.run("python", "-m", "tests.django_suite")
