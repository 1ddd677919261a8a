"""Background tasks for Django on Redis: a backend for Django's tasks framework,
a worker (``manage.py runworker``) and an admin dashboard."""

from .base import RedisTask, RedisTaskResult, task
from .exceptions import RedisQueueError, ResultTimeout, TaskFailed

__all__ = [
    "RedisQueueError",
    "RedisTask",
    "RedisTaskResult",
    "ResultTimeout",
    "TaskFailed",
    "task",
]
