from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Not django_redisqueue's worker."

    def handle(self, *args, **options):
        raise CommandError("the shadowing app's runworker ran")
