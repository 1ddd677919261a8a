"""Django's tasks framework: ``django.tasks`` on Django 6.x, the ``django-tasks``
backport package on Django 5.2. Everything that differs between them is settled here;
the rest of the app imports these names only from this module."""

# ruff: noqa: F401
import inspect
from typing import TYPE_CHECKING

try:
    import django.tasks

    HAS_DJANGO_TASKS = True
except ImportError:
    HAS_DJANGO_TASKS = False

# Type checkers take the first branch: django-stubs describe django.tasks, and the
# backport mirrors it.
if TYPE_CHECKING or HAS_DJANGO_TASKS:
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django.tasks import task as django_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )

    TASKS_PACKAGE = "django.tasks"
else:  # Django 5.2
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            default_task_backend,
            task_backends,
        )
    except ImportError as exc:
        raise ImportError(
            "django_redisqueue needs Django's tasks framework: Django 6.x, or on "
            "Django 5.2 the backport: pip install 'django-redisqueue[django52]' "
            "(or pip install django-tasks)."
        ) from exc
    from django_tasks import task as django_task
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )

    TASKS_PACKAGE = "django_tasks"


# Django's own ``@task(...)`` passes extra keyword arguments (``retries=3``) on to the
# backend's task class from Django 6.1 on, and in the backport; Django 6.0 refuses them.
DJANGO_TASK_TAKES_OPTIONS = any(
    p.kind is inspect.Parameter.VAR_KEYWORD
    for p in inspect.signature(django_task).parameters.values()
)

# Tasks (and so their results) pickle from Django 6.1 on.
TASKS_PICKLE = "_reconstruct" in vars(Task)
