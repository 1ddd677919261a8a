"""A pytest fixture for the tests of a project using this app. Enable it in the
project's top ``conftest.py``::

    pytest_plugins = ["django_redisqueue.pytest_plugin"]

then ask for ``run_jobs`` in a test: ``django_redisqueue.testing.run_jobs``, to call
when the test has enqueued its jobs. Loading the plugin imports nothing of Django's:
the fixture does, once Django is set up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_redisqueue.core.tasks import RedisTaskResult


@pytest.fixture
def run_jobs() -> Callable[..., list[RedisTaskResult]]:
    """``django_redisqueue.testing.run_jobs``: run the jobs queued, and those delayed
    within its horizon, on the test's thread and database."""
    from django_redisqueue.testing import run_jobs as run

    return run
