"""The public path of the Redis backend: ``TASKS["BACKEND"]`` names it."""

from django_redisqueue.backends.redis import RedisQueueBackend

__all__ = ["RedisQueueBackend"]
