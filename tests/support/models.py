from django.db import models


class Report(models.Model):
    """A row a job reads: the on-commit tests commit it before the worker looks."""

    title = models.CharField(max_length=100)


class Committed(models.Model):
    """A number a transaction committed with a job of that number: the outbox's fault
    test checks that exactly these jobs ran."""

    number = models.IntegerField(unique=True)
