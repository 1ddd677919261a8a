"""The test matrix: ``nox`` runs ruff and mypy once, then on every supported (Python,
Django) pair the test suite and Django's own ``tests/tasks/`` against this backend;
``nox -s tests-3.11`` runs one of them, ``nox -s django-suite-3.13`` Django's tests on
one pair, ``nox -s lint`` ruff and mypy.

The ``tests`` and ``django-suite`` sessions need ``redis-server`` on the PATH: each
starts its own.
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

nox.options.sessions = ["lint", "tests", "django-suite"]
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
    session.run("mypy")


@nox.session(python=[python for python, _, _ in MATRIX])
def tests(session: nox.Session) -> None:
    """The test suite on one (Python, Django) pair, against a private redis-server."""
    django, extras = next((d, e) for p, d, e in MATRIX if p == session.python)
    session.install("-e", f".[{extras}]", f"django~={django}.0")
    session.run("python", "-m", "django", "--version")
    session.run("pytest", *session.posargs)


@nox.session(name="django-suite", python=[python for python, _, _ in MATRIX])
def django_suite(session: nox.Session) -> None:
    """Django's own tests/tasks/ against RedisQueueBackend, on one (Python, Django) pair.

    Taken from the sdist of the Django installed (downloaded once into
    .nox/django-suite-cache); see tests/django_suite and docs/conformance.md. On Django
    5.2 it says why there is nothing to run."""
    django, extras = next((d, e) for p, d, e in MATRIX if p == session.python)
    extras = ",".join(extra for extra in extras.split(",") if extra != "dev")
    session.install("-e", f".[{extras}]", f"django~={django}.0")
    session.run("python", "-m", "tests.django_suite", *session.posargs)
