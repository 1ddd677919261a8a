"""Background tasks for Django on Redis: a backend for Django's tasks framework,
a worker (``manage.py runworker``) and an admin dashboard."""

from .base import RedisTask, RedisTaskResult, task
from .exceptions import RedisQueueError, ResultTimeout, TaskFailed
from .workflows import GroupResult, Job, broadcast, chain, group

__all__ = [
    "GroupResult",
    "Job",
    "RedisQueueError",
    "RedisTask",
    "RedisTaskResult",
    "ResultTimeout",
    "TaskFailed",
    "broadcast",
    "chain",
    "group",
    "task",
]
