"""The documentation's code samples and reference, checked against the code: every Python
block of docs/ runs against the tests' Redis, or is checked as settings, or says why it
is not run (docs/development.md, "Code samples are tests"); every ``manage.py`` line
parses; every option, check and command flag of the code is in the reference; the
README's links lead somewhere."""

from __future__ import annotations

import io
import re
import shlex
import sys
import tomllib
import types
import unittest
from pathlib import Path

import django
import pytest
from django.conf import global_settings
from django.core.management import load_command_class
from django.core.management.base import BaseCommand, CommandError
from django.test import override_settings
from django.utils.module_loading import import_string
from packaging.requirements import Requirement

from django_redisqueue.backend import RedisQueueBackend
from django_redisqueue.core.conf import OPTION_NAMES, PERIODIC_FIELDS, validate
from tests.conftest import ROOT, run_worker_here
from tests.support.doc_samples import DOCS, README, Block, blocks, headings, pages, slug
from tests.support.topology import ON_CLUSTER

RUN, RUN_AFTER_WORKER, SETTINGS = "run", "run after worker", "settings"
NOT_RUN = re.compile(r"not run: \S.*")
# The tutorial's project blocks, which tests/test_readme.py follows.
PROJECT = re.compile(r"(file|append|alternative append): \S+|shell")
COMMANDS = ("runworker", "runscheduler", "queuehealth", "queuestats")
REFERENCE = DOCS / "reference"

DOC_PAGES = [page for page in pages() if page != README]
PYTHON = [block for page in DOC_PAGES for block in blocks(page) if block.language == "python"]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_every_python_block_says_how_it_is_tested():
    unmarked = [
        f"{block} {block.marker!r}"
        for block in PYTHON
        if block.marker not in (RUN, RUN_AFTER_WORKER, SETTINGS)
        and not NOT_RUN.fullmatch(block.marker)
        and not (block.page == DOCS / "tutorial.md" and PROJECT.fullmatch(block.marker))
    ]
    assert not unmarked, "Mark each with <!-- run -->, <!-- settings -->... " + str(unmarked)


def source_for_this_django(code: str) -> str:
    """On Django 5.2 the tasks framework is the backport, as the pages tell readers."""
    return code if django.VERSION >= (6, 0) else code.replace("django.tasks", "django_tasks")


# A settings module as ``startproject`` begins it, for the blocks that add to it.
NEW_PROJECT = {"INSTALLED_APPS": list(global_settings.INSTALLED_APPS)}


@pytest.mark.parametrize("block", [b for b in PYTHON if b.marker == SETTINGS], ids=str)
def test_the_settings_samples_pass_the_checks(block):
    namespace = {"__name__": "settings", **NEW_PROJECT}
    exec(block.compiled(), namespace)
    assert namespace.get("TASKS"), f"{block} sets no TASKS"
    # A block without CACHES has a new project's: Django's local-memory cache.
    caches = namespace.get("CACHES", global_settings.CACHES)
    with override_settings(CACHES=caches):
        for alias, params in namespace["TASKS"].items():
            backend = import_string(params["BACKEND"])
            if issubclass(backend, RedisQueueBackend):
                assert validate(alias, params) == [], str(block)


def run_test_cases(module: types.ModuleType, done: set[type]) -> None:
    """Run the unittest test cases the page's blocks defined, once each."""
    for case in list(vars(module).values()):
        if (
            isinstance(case, type)
            and issubclass(case, unittest.TestCase)
            and case.__module__ == module.__name__
            and case not in done
        ):
            done.add(case)
            output = io.StringIO()
            suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
            outcome = unittest.TextTestRunner(stream=output, verbosity=2).run(suite)
            assert outcome.wasSuccessful(), output.getvalue()
            assert outcome.testsRun, f"{case.__name__} has no test"


RUNNABLE = [p for p in DOC_PAGES if any(b.marker in (RUN, RUN_AFTER_WORKER) for b in blocks(p))]
# The OPTIONS a page's samples assume of the default backend, beyond the tests'.
PAGE_OPTIONS = {
    DOCS / "howto" / "outbox.md": {"OUTBOX": True},
    DOCS / "howto" / "tasks.md": {"FAIR_QUEUES": ["low"]},
}


@pytest.mark.skipif(ON_CLUSTER, reason="the samples' tests run one worker")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", RUNNABLE, ids=page_id)
def test_the_samples_of_a_page_run(page, settings):
    """The page's blocks in order, in one module of the page's own (its tasks have a
    module path that the worker can find); a worker and a scheduler run what is queued
    before each ``run after worker`` block."""
    from django_redisqueue.compat import task_backends
    from django_redisqueue.runtime.scheduler import Scheduler

    if page in PAGE_OPTIONS:
        default = settings.TASKS["default"]
        options = {**default["OPTIONS"], **PAGE_OPTIONS[page]}
        settings.TASKS = {**settings.TASKS, "default": {**default, "OPTIONS": options}}
    backend = task_backends["default"]
    name = "docs_sample_" + re.sub(r"\W", "_", str(page.relative_to(DOCS).with_suffix("")))
    module = types.ModuleType(name)
    module.__file__ = str(page)
    sys.modules[name] = module
    done: set[type] = set()
    try:
        for block in blocks(page):
            if block.marker == RUN_AFTER_WORKER:
                Scheduler(backend, burst=True).run()
                run_worker_here(backend)
            if block.marker in (RUN, RUN_AFTER_WORKER):
                exec(block.compiled(source_for_this_django(block.code)), vars(module))
                run_test_cases(module, done)
    finally:
        del sys.modules[name]


def manage_lines(block: Block) -> list[list[str]]:
    """The ``manage.py`` command lines of a shell, systemd or Procfile block, split as
    the shell does (comments dropped), from the command's name on."""
    found = []
    for line in block.code.splitlines():
        words = shlex.split(
            line.partition("=")[2] if line.startswith("ExecStart=") else line, comments=True
        )
        for at, word in enumerate(words[:-1]):
            if word.endswith("manage.py") and words[at + 1] in COMMANDS:
                found.append(words[at + 1 :])
    return found


MANAGE_LINES = [
    pytest.param(words, id=f"{block}:{' '.join(words)}")
    for page in pages()
    for block in blocks(page)
    if block.language in ("sh", "ini", "")
    for words in manage_lines(block)
]


@pytest.mark.pure
@pytest.mark.parametrize("words", MANAGE_LINES)
def test_every_command_line_in_the_pages_parses(words):
    command, *arguments = words
    parser = load_command_class("django_redisqueue", command).create_parser("manage.py", command)
    try:
        parser.parse_args(arguments)
    except CommandError as exc:
        pytest.fail(f"manage.py {' '.join(words)}: {exc}")


def flags(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.pure
def test_every_flag_of_every_command_is_in_the_reference():
    commands = (REFERENCE / "commands.md").read_text()
    django_flags = flags(BaseCommand().create_parser("manage.py", "any"))
    missing = [
        f"{command} {flag}"
        for command in COMMANDS
        for flag in flags(
            load_command_class("django_redisqueue", command).create_parser("m", command)
        )
        - django_flags
        if f"`{flag}" not in commands
    ]
    assert not missing


@pytest.mark.pure
def test_every_option_and_schedule_key_is_in_the_settings_reference():
    settings = (REFERENCE / "settings.md").read_text()
    assert not [name for name in OPTION_NAMES if f"`{name}`" not in settings]
    assert not [key for key in PERIODIC_FIELDS if f"`{key}`" not in settings]


@pytest.mark.pure
def test_every_system_check_is_in_the_reference():
    code = "".join(
        (ROOT / "django_redisqueue" / path).read_text()
        for path in ("checks.py", "core/conf.py", "backend.py")
    )
    ids = set(re.findall(r'"([EW]\d{3})"', code)) | set(re.findall(r"\.([EW]\d{3})\"", code))
    assert len(ids) >= 12
    documented = headings(REFERENCE / "checks.md")
    assert not sorted(i for i in ids if i.lower() not in documented)


@pytest.mark.pure
def test_the_readme_links_lead_to_pages_and_their_headings():
    text = README.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else README
        if not page.exists() or (anchor and anchor not in headings(page)):
            broken.append(target)
    assert not broken
    assert slug("`REPLICA_ACKS`") == "replica_acks"  # how pages name their anchors


@pytest.mark.pure
def test_the_django52_extra_keeps_django_5_2_as_the_readme_says():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = [Requirement(line) for line in project["optional-dependencies"]["django52"]]
    [django_pin] = [r.specifier for r in extra if r.name == "django"]
    assert django_pin.contains("5.2.19") and not django_pin.contains("6.0")
    assert {r.name for r in extra} == {"django", "django-tasks"}
    assert "`django>=5.2,<6`" in README.read_text()
