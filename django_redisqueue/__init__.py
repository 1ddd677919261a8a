"""Background tasks for Django on Redis: a backend for Django's tasks framework,
a worker (``manage.py runworker``) and an admin dashboard."""

from django_redisqueue.core.fanout import GroupResult, broadcast, chain, group
from django_redisqueue.core.progress import JobProgress
from django_redisqueue.core.tasks import Job, JobContext, RedisTask, RedisTaskResult, task
from django_redisqueue.exceptions import RedisQueueError, ResultTimeout, TaskFailed

__all__ = [
    "GroupResult",
    "Job",
    "JobContext",
    "JobProgress",
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
