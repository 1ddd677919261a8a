from django.db import models


class Report(models.Model):
    """A slow computation a user asks for; a background job fills in the result."""

    limit = models.PositiveIntegerField()
    primes = models.PositiveIntegerField(null=True)
    job_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"primes below {self.limit}"
