from django.apps import AppConfig


class RedisQueueConfig(AppConfig):
    name = "django_redisqueue"
    verbose_name = "Redis queue"

    def ready(self) -> None:
        from . import checks

        checks.register()
