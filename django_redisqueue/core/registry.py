"""The allow-list of tasks a worker may run.

A task is registered when it is created for a RedisQueueBackend (by
``django_redisqueue.task`` or by Django's ``task``), which happens when the installed
apps' ``tasks`` modules are imported. A worker runs a job only if its task path is
registered here; it never imports a path it reads from Redis.
"""

from __future__ import annotations

from django.utils.module_loading import autodiscover_modules

from django_redisqueue.compat import Task


class TaskRegistry:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._discovered = False

    def register(self, task: Task) -> None:
        """Remember the first Task made for a function; ``using()`` copies share it."""
        self._tasks.setdefault(task.module_path, task)

    def get(self, module_path: str) -> Task | None:
        """Return the registered task; import the apps' tasks modules once if unknown."""
        task = self._tasks.get(module_path)
        if task is None and not self._discovered:
            self.autodiscover()
            task = self._tasks.get(module_path)
        return task

    def paths(self) -> list[str]:
        return sorted(self._tasks)

    def autodiscover(self) -> None:
        """Import the ``tasks`` module of every installed app."""
        autodiscover_modules("tasks")
        self._discovered = True


registry = TaskRegistry()
