"""No tables: an unmanaged model gives the dashboard its place in the admin and its
two permissions, granted through the admin's users and groups."""

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
