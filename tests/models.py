from django.db import models


class Report(models.Model):
    """A row a job reads: the on-commit tests commit it before the worker looks."""

    title = models.CharField(max_length=100)
