"""The public path of the immediate backend, for tests: ``TASKS["BACKEND"]`` names it."""

from django_redisqueue.backends.immediate import ImmediateBackend

__all__ = ["ImmediateBackend"]
