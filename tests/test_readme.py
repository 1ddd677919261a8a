"""The README's install steps, as a user follows them: a project fresh from
``django-admin startproject``, the README's settings appended to it as they are written
(only the Redis URL made the test's own), then ``check``, ``migrate``, a job enqueued and
run by ``runworker --burst``."""

import os
import re
import subprocess
import sys
from pathlib import Path

import django
import pytest

from tests.conftest import ROOT
from tests.topology import ON_CLUSTER

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="the README's settings name one server")

README = ROOT / "README.md"
# The Redis URL the README's settings name, which the test's own replaces.
README_URL = "redis://127.0.0.1:6379/0"
# The line users uncomment on Django 5.2, as the README's settings say.
BACKPORT = '# "django_tasks",'
# A tiny app of the project, with a task.
TASKS_MODULE = """\
from django_redisqueue import task


@task
def add(a, b):
    return a + b
"""


def settings_block(marker: str) -> str:
    """The Python block that follows ``<!-- marker -->`` in the README."""
    found = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", README.read_text(), re.S)
    assert found, f"no {marker} block in README.md"
    return found[1]


def new_project(folder: Path, *blocks: str) -> dict[str, str]:
    """A project made by ``startproject`` in ``folder``, its settings followed by
    ``blocks``, and an app with a task; the environment to run its ``manage.py`` in."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.pop("PYTHONPATH", None)
    made = subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    settings = folder / "mysite" / "settings.py"
    added = "\n".join(blocks)
    assert README_URL in added and BACKPORT in added
    added = added.replace(README_URL, os.environ["REDISQUEUE_TEST_URL"])
    if django.VERSION < (6, 0):
        added = added.replace(BACKPORT, BACKPORT.removeprefix("# "))
    settings.write_text(settings.read_text() + "\n" + added + '\nINSTALLED_APPS += ["jobs"]\n')
    (folder / "jobs").mkdir()
    (folder / "jobs" / "__init__.py").write_text("")
    (folder / "jobs" / "tasks.py").write_text(TASKS_MODULE)
    return env


def manage(folder: Path, env: dict[str, str], *args: str) -> str:
    """Run the project's ``manage.py ARGS``; its output, once it succeeded."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout + done.stderr


ENQUEUE = "from jobs.tasks import add; print('job', add.enqueue(2, 3).id)"
RESULT = (
    "from django_redisqueue.compat import task_backends; "
    "r = task_backends['default'].get_result('{id}'); print('result', r.status, r.return_value)"
)


@pytest.mark.parametrize(
    "markers",
    [["install-settings"], ["install-settings", "install-settings-connection"]],
    ids=["url", "connection"],
)
def test_the_install_settings_work_in_a_new_project(tmp_path, markers):
    env = new_project(tmp_path, *map(settings_block, markers))
    assert "no issues" in manage(tmp_path, env, "check")
    manage(tmp_path, env, "migrate")
    job_id = re.search(r"^job (\S+)$", manage(tmp_path, env, "shell", "-c", ENQUEUE), re.M)[1]
    manage(tmp_path, env, "runworker", "--burst")
    manage(tmp_path, env, "runscheduler", "--burst")
    result = manage(tmp_path, env, "shell", "-c", RESULT.format(id=job_id))
    assert re.search(r"^result (.*)$", result, re.M)[1] == "SUCCESSFUL 5"
