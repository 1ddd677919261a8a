from django.apps import AppConfig


class RedisQueueConfig(AppConfig):
    name = "django_redisqueue"
    verbose_name = "Redis queue"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_redisqueue import checks

        checks.register()
