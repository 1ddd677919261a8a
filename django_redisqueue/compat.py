"""Django's tasks framework: ``django.tasks`` on Django 6.x, the ``django-tasks``
backport package on Django 5.2."""

# ruff: noqa: F401
try:
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks import task as django_task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
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
    from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
