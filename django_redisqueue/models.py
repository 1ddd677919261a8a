"""The app's models: the dashboard's permissions, and the transactional outbox.

``Dashboard`` has no table: an unmanaged model gives the dashboard its place in the
admin and its two permissions, granted through the admin's users and groups.
``OutboxJob`` is a job written in a transaction, waiting to be relayed to Redis once
it commits (``outbox.py``; the guarantee is in docs/explanation/guarantees.md)."""

from __future__ import annotations

from datetime import datetime

from django.db import models


class Dashboard(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboard", "Can see the queue dashboard"),
            ("manage_queues", "Can retry, delete, cancel and pause jobs and queues"),
        ]
        verbose_name = "queue dashboard"
        verbose_name_plural = "queue dashboard"


class OutboxJob(models.Model):
    """A job as the enqueue script takes it (``store.wire.NewJob``), kept in the
    database until it is in Redis. Relayed in the order of ``id``."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    job_id: models.CharField[str, str] = models.CharField(max_length=64, unique=True)
    backend: models.CharField[str, str] = models.CharField(max_length=64)  # the TASKS alias
    queue: models.CharField[str, str] = models.CharField(max_length=64)
    priority: models.IntegerField[int, int] = models.IntegerField(default=0)
    payload: models.TextField[str, str] = models.TextField()  # the JSON envelope
    due_ms: models.BigIntegerField[int, int] = models.BigIntegerField(
        default=0
    )  # 0: ready at once
    after: models.CharField[str, str] = models.CharField(max_length=64, blank=True, default="")
    options: models.TextField[str, str] = models.TextField(
        blank=True, default=""
    )  # unique key and limits, JSON
    created_at: models.DateTimeField[datetime, datetime] = models.DateTimeField()

    class Meta:
        default_permissions = ()
        verbose_name = "outbox job"

    def __str__(self) -> str:
        return f"{self.job_id} ({self.backend}/{self.queue})"
