"""``python -m tests.django_suite [-v N] [LABEL ...]``: run Django's ``tests/tasks/``,
from the source release of the Django installed here, against RedisQueueBackend.

Exit status: 0 when every test passed or is listed as not applicable (or when this
Django has no ``tests/tasks/`` to run: Django 5.2 and the backport), 1 when a test
failed, 2 when the harness could not run (no sdist, a stale not-applicable list).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DJANGO_SUITE_CACHE") or ROOT / ".nox" / "django-suite-cache")


class HarnessError(Exception):
    """The harness cannot run the suite; the message says why."""


def sdist(project: str, version: str) -> Path:
    """The source distribution of ``project==version``, from the package index with
    ``pip download``, kept in CACHE."""
    folder = CACHE / "sdists" / f"{project}-{version}"
    found = sorted(folder.glob("*.tar.gz"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    download = Path(tempfile.mkdtemp(prefix="download-", dir=CACHE))
    try:
        print(f"Downloading the sdist of {project}=={version} into {folder}", flush=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{project}=={version}",
            "--dest",
            str(download),
        ]
        if subprocess.run(command).returncode != 0:
            raise HarnessError(f"pip could not download the sdist of {project}=={version}")
        found = sorted(download.glob("*.tar.gz"))
        if len(found) != 1:
            raise HarnessError(f"pip download of {project}=={version} gave {found}, not one sdist")
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        download.rename(folder)
        return folder / found[0].name
    finally:
        shutil.rmtree(download, ignore_errors=True)


def members_under(archive: Path, *parts: str) -> list[tarfile.TarInfo]:
    """The files and folders of an sdist under ``parts`` (below its top folder)."""
    with tarfile.open(archive) as tar:
        return [
            m
            for m in tar.getmembers()
            if m.name.split("/")[1 : 1 + len(parts)] == list(parts) and (m.isfile() or m.isdir())
        ]


def django_tests(version: str) -> Path:
    """Django's ``tests/`` folder holding ``tasks/`` (only that package is extracted),
    from the sdist of Django ``version``."""
    target = CACHE / f"django-{version}"
    if (target / "tests" / "tasks" / "__init__.py").is_file():
        return target / "tests"
    archive = sdist("django", version)
    members = members_under(archive, "tests", "tasks")
    if not members:
        raise HarnessError(f"the sdist of Django {version} ({archive.name}) has no tests/tasks/")
    extracted = Path(tempfile.mkdtemp(prefix="extract-", dir=CACHE))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(extracted, members=members, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        (extracted / members[0].name.split("/")[0]).rename(target)
    finally:
        shutil.rmtree(extracted, ignore_errors=True)
    return target / "tests"


def backport() -> int:
    """Django 5.2 has no ``django.tasks`` and so no ``tests/tasks/``; its tests would
    come with the ``django-tasks`` backport. Run nothing unless its sdist carries them."""
    try:
        version = installed_version("django-tasks")
    except PackageNotFoundError:
        raise HarnessError(
            "Django 5.2 without the django-tasks backport: there is no tasks framework"
        ) from None
    tests = [m.name for m in members_under(sdist("django-tasks", version), "tests") if m.isfile()]
    if tests:
        raise HarnessError(
            f"the sdist of django-tasks {version} now carries tests ({len(tests)} files under "
            "tests/): teach tests/django_suite to run them on Django 5.2"
        )
    print(
        f"Django {_django_version()} + django-tasks {version}: SKIPPED, nothing to run. "
        f"Django {_django_version()} has no tests/tasks/ (django.tasks came in 6.0) and the "
        f"django-tasks {version} sdist on PyPI ships no tests."
    )
    return 0


def _django_version() -> str:
    import django

    return django.get_version()


def run(labels: list[str], verbosity: int) -> int:
    import django

    if django.VERSION < (6, 0):
        return backport()
    version = django.get_version()
    tests = django_tests(version)
    sys.path.insert(0, str(tests))  # Django's tests import their package as "tasks"

    from tests.support.servers import RedisServer

    with RedisServer() as server:
        os.environ["DJANGO_SUITE_REDIS_URL"] = server.url
        os.environ["DJANGO_SUITE_VERBOSITY"] = str(verbosity)
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_suite.settings"
        django.setup()

        from .backends import route_to_redisqueue
        from .runner import OUTCOMES, ListError, SuiteRunner

        route_to_redisqueue(server.url)
        runner = SuiteRunner(
            redis_url=server.url,
            django_version=django.VERSION[:2],
            only=labels,
            verbosity=verbosity,
        )
        started = time.monotonic()
        try:
            runner.run_tests(["tasks"])
        except ListError as exc:
            raise HarnessError(str(exc)) from exc
        elapsed = time.monotonic() - started

    assert runner.result is not None
    counts = runner.counts()
    width = max(len(name) for name in counts)
    print(f"\nDjango {version} tests/tasks on RedisQueueBackend ({elapsed:.1f} s):")
    print(f"  {'':<{width}}  " + "  ".join(f"{o:>6}" for o in OUTCOMES))
    for module in sorted(counts, key=lambda m: (m == "total", m)):
        row = counts[module]
        print(f"  {module:<{width}}  " + "  ".join(f"{row[o]:>6}" for o in OUTCOMES))
    failed = sorted(runner.result.reasons.items())
    if failed:
        print("Failed:")
        for test_id, reason in failed:
            print(f"  {test_id}: {reason[:160]}")
    return 1 if failed or not runner.result.wasSuccessful() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.django_suite", description=__doc__)
    parser.add_argument("labels", nargs="*", help="only tests whose id starts with one of these")
    parser.add_argument("-v", "--verbosity", type=int, default=1, choices=[0, 1, 2, 3])
    args = parser.parse_args(argv)
    try:
        return run(args.labels, args.verbosity)
    except HarnessError as exc:
        print(f"django_suite: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
