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


class LogRun(models.Model):
    """A log fanned out to a group of jobs, one per chunk; the group's callback merges
    their counts into ``summary`` and deletes the chunks."""

    name = models.CharField(max_length=200)
    lines = models.PositiveIntegerField()
    group_id = models.CharField(max_length=64, blank=True)
    summary = models.JSONField(null=True)
    failed_chunks = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"log {self.name} ({self.lines} lines)"


class LogChunk(models.Model):
    """A slice of a run's log, read by the job that analyses it; gone once summarised."""

    run = models.ForeignKey(LogRun, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="one_chunk_per_index")
        ]
