"""The README's quick start and the tutorial, as a new user follows them: a project
fresh from ``django-admin startproject``, its apps from ``startapp``, the page's code
blocks written into it as the page says (``<!-- file: PATH -->`` is a file's whole
content, ``<!-- append: PATH -->`` goes at its end, ``<!-- alternative append: PATH
-->`` in a second run), only the Redis URL made the test's own; then ``check``,
``migrate``, a request to the page's view, ``runworker --burst`` and
``runscheduler --burst``, the job's result through the view and on the dashboard, and a
404 from the view for a job id Redis does not know."""

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import django
import pytest

from tests.support.doc_samples import DOCS, README, Block, blocks
from tests.support.topology import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="the pages' settings name one server")

TUTORIAL = DOCS / "tutorial.md"
# The Redis URL the pages' settings name, which the test's own replaces.
PAGE_URL = "redis://127.0.0.1:6379/0"
# The line users uncomment on Django 5.2, as the pages say.
BACKPORT = '# "django_tasks",'
PROJECT_MARKERS = re.compile(r"^(?P<how>file|append|alternative append): (?P<path>\S+)$")


def project_blocks(page: Path, *, alternative: bool) -> list[tuple[Block, str, str]]:
    """The blocks of ``page`` that make the project, as (block, how, path)."""
    chosen = []
    for block in blocks(page):
        marked = PROJECT_MARKERS.fullmatch(block.marker)
        if marked and (alternative or marked["how"] != "alternative append"):
            chosen.append((block, marked["how"], marked["path"]))
    assert chosen, f"no project blocks in {page}"
    return chosen


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.pop("PYTHONPATH", None)
    return env


def run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the project's ``manage.py ARGS`` and wait for it."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def manage(folder: Path, *args: str) -> str:
    """Run the project's ``manage.py ARGS``; its output, once it succeeded."""
    done = run(folder, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout + done.stderr


def new_project(
    folder: Path, page: Path, *, alternative: bool = False, redis_url: str | None = None
) -> None:
    """A project made by ``startproject mysite`` in ``folder``, with an app for each
    folder the page writes into, and the page's blocks written into it; the page's
    Redis URL replaced by ``redis_url`` (default: the test's own Redis)."""
    made = subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(folder)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    chosen = project_blocks(page, alternative=alternative)
    # The apps first, as the page has them made before the settings name them.
    for app in sorted({(folder / path).parent for _, _, path in chosen}):
        if not app.exists():
            manage(folder, "startapp", app.name)
    for block, how, path in chosen:
        target = folder / path
        code = block.code.replace(PAGE_URL, redis_url or os.environ["REDISQUEUE_TEST_URL"])
        if django.VERSION < (6, 0):
            code = code.replace(BACKPORT, BACKPORT.removeprefix("# "))
            code = code.replace("django.tasks", "django_tasks")
        if how == "file":
            target.write_text(code)
        else:
            target.write_text(target.read_text() + "\n" + code)


# Requests through the project's own URLs, with Django's test client, in its shell: one
# shell for several, as each start of Django costs seconds. Each prints one JSON line.
REQUESTS = """
import json
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
from django.urls import reverse
setup_test_environment()
client = Client()
for url in {urls!r}:
    response = client.get(url)
    assert response.status_code == 200, (url, response)
    print("json", json.dumps(response.json()))
for url in {missing!r}:
    response = client.get(url)
    print("json", json.dumps(response.status_code))
for job_id in {dashboard!r}:
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    page = client.get(reverse("admin:redisqueue_job", args=["default", job_id]))
    assert page.status_code == 200, page
    print("json", json.dumps("SUCCESSFUL" in page.content.decode()))
"""


def get(
    folder: Path, *urls: str, missing: tuple[str, ...] = (), dashboard: tuple[str, ...] = ()
) -> list:
    """The JSON of each of ``urls``; then the status code of each of ``missing``; then,
    for each job of ``dashboard``, whether its page on the dashboard shows it
    SUCCESSFUL."""
    requests = REQUESTS.format(urls=urls, missing=missing, dashboard=dashboard)
    output = manage(folder, "shell", "-c", requests)
    return [json.loads(line) for line in re.findall(r"^json (.*)$", output, re.M)]


def run_workers(folder: Path) -> None:
    manage(folder, "runworker", "--burst")
    manage(folder, "runscheduler", "--burst")


@pytest.mark.parametrize("alternative", [False, True], ids=["url", "connection"])
def test_the_readme_quick_start_works_in_a_new_project(tmp_path, alternative):
    readme = README.read_text()
    assert PAGE_URL in readme and BACKPORT in readme
    new_project(tmp_path, README, alternative=alternative)
    assert "no issues" in manage(tmp_path, "check")
    manage(tmp_path, "migrate")
    # The request and the answer the README shows.
    assert "/count/?text=hello+world" in readme and '"words": 2' in readme
    [started] = get(tmp_path, "/count/?text=hello+world")
    assert started["status"] == "READY"
    run_workers(tmp_path)
    finished = get(
        tmp_path,
        f"/jobs/{started['job']}/",
        missing=(f"/jobs/{uuid.uuid4()}/", "/jobs/no-such-job/"),
        dashboard=(started["job"],),
    )
    assert finished == [{"status": "SUCCESSFUL", "words": 2}, 404, 404, True]


def test_the_tutorial_works_in_a_new_project(tmp_path):
    tutorial = TUTORIAL.read_text()
    new_project(tmp_path, TUTORIAL)
    assert "no issues" in manage(tmp_path, "check")
    manage(tmp_path, "migrate")
    for url in ("/greet/?name=Ada", "/greet/?name=R2-D2"):
        assert url in tutorial
    greeted, failed = get(tmp_path, "/greet/?name=Ada", "/greet/?name=R2-D2")
    # Step 6: a job for later, typed in the project's shell.
    later = next(block for block in blocks(TUTORIAL) if block.marker == "shell")
    manage(tmp_path, "shell", "-c", later.code)
    run_workers(tmp_path)
    assert '{"status": "SUCCESSFUL", "greeting": "Hello, Ada!"}' in tutorial
    greeting, failure, unknown = get(
        tmp_path,
        f"/jobs/{greeted['job']}/",
        f"/jobs/{failed['job']}/",
        missing=(f"/jobs/{uuid.uuid4()}/",),
    )
    assert greeting == {"status": "SUCCESSFUL", "greeting": "Hello, Ada!"}
    assert unknown == 404
    assert failure == {"status": "FAILED", "greeting": None}
    stats = manage(tmp_path, "queuestats", "--json")
    assert '"delayed": 1' in stats, stats


# Mistakes in the quick start's settings, each a line at the end of mysite/settings.py,
# with the system check that reports it and a piece of its hint.
MISTAKES = {
    "typo": ('TASKS["default"]["OPTIONS"]["URLL"] = "redis://"', "E004", "Known options are"),
    "url-scheme": (
        'TASKS["default"]["OPTIONS"]["URL"] = "http://127.0.0.1:6379/0"',
        "E006",
        "Use e.g. 'redis://127.0.0.1:6379/0'",
    ),
    "cron-without-extra": (
        # As without the cron extra: cronsim cannot be imported.
        'import sys; sys.modules["cronsim"] = None\n'
        'TASKS["default"]["OPTIONS"]["PERIODIC"] = '
        '{"nightly": {"task": "words.tasks.count_words", "cron": "0 3 * * *"}}',
        "E009",
        "pip install 'django-redisqueue[cron]'",
    ),
    # A new project's CACHES: Django's local-memory cache.
    "connection-not-redis": (
        'TASKS["default"]["OPTIONS"] = {"CONNECTION": "default"}',
        "E007",
        "Name a CACHES alias whose BACKEND is",
    ),
    "queues-not-a-list": (
        'TASKS["default"]["QUEUES"] = "default"',
        "E001",
        "List them in priority order",
    ),
}


@pytest.fixture(scope="module")
def quick_start_project(tmp_path_factory) -> Path:
    """The README's quick start, as written (its settings name the page's Redis URL,
    which no check asks)."""
    folder = tmp_path_factory.mktemp("quickstart")
    new_project(folder, README, redis_url=PAGE_URL)
    return folder


@pytest.mark.pure
@pytest.mark.parametrize("mistake", MISTAKES)
def test_check_reports_each_wrong_setting_of_the_quick_start_with_its_hint(
    quick_start_project, mistake
):
    """``check`` imports the URLconf, hence the view and the task it enqueues: the
    task's module is imported with the wrong settings, and the check still reports
    them, with their hint, as the README promises."""
    assert "python manage.py check            # reports wrong settings, with a hint" in (
        README.read_text()
    )
    line, check_id, hint = MISTAKES[mistake]
    settings = quick_start_project / "mysite" / f"settings_{mistake.replace('-', '_')}.py"
    settings.write_text(f"from mysite.settings import *  # noqa: F403\n{line}\n")
    done = run(quick_start_project, "check", "--settings", f"mysite.{settings.stem}")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert f"(django_redisqueue.{check_id})" in output
    assert f"HINT: {hint}" in output
    assert output.count("(django_redisqueue.") == 1, output


def test_every_python_block_of_the_readme_is_in_the_quick_start():
    python = [block for block in blocks(README) if block.language == "python"]
    assert all(PROJECT_MARKERS.fullmatch(block.marker) for block in python), [
        str(block) for block in python if not PROJECT_MARKERS.fullmatch(block.marker)
    ]
