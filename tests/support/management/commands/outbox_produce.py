"""``python -m django outbox_produce BACKEND FIRST COUNT LEDGER_URL``: what a view does
with the outbox, COUNT times: in one transaction of the backend's outbox database, a
row of ``tests.support.models.Committed`` and a job that appends the same number to the
ledger; every tenth transaction rolls back. For tests/test_outbox_faults.py, which
kills it at any moment."""

from django.core.management.base import BaseCommand
from django.db import transaction

from django_redisqueue.compat import task_backends
from tests.support import tasks
from tests.support.models import Committed

ROLLED_BACK_EVERY = 10


class RollBack(Exception):
    pass


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("backend")
        parser.add_argument("first", type=int)
        parser.add_argument("count", type=int)
        parser.add_argument("ledger_url")

    def handle(self, backend, first, count, ledger_url, **options):
        database = task_backends[backend].config.outbox[0]
        task = tasks.ledger_at.using(backend=backend)
        for number in range(first, first + count):
            try:
                with transaction.atomic(using=database):
                    Committed.objects.using(database).create(number=number)
                    task.enqueue(ledger_url, number, 0)
                    if number % ROLLED_BACK_EVERY == ROLLED_BACK_EVERY - 1:
                        raise RollBack
            except RollBack:
                pass
        self.stdout.write(f"produced {first}..{first + count - 1}")
