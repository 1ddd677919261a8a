"""The example project's background tasks, at three priorities."""

import asyncio
import random
import time
from datetime import timedelta

from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.utils import timezone

from django_redisqueue import JobContext, task

from . import logs
from .models import LogChunk, LogRun, Report


@task(queue_name="high", priority=10)
def send_welcome_email(user_id: int) -> str:
    user = User.objects.get(pk=user_id)
    send_mail(
        "Welcome!",
        f"Hello {user.username}, thanks for signing up.",
        "shop@example.com",
        [user.email],
    )
    return user.email


@task(retries=3, retry_backoff=2.0)
def send_tips_email(user_id: int) -> str:
    """Sent a little after signing up (the view enqueues it with a delay); retried with
    backoff if the mail server fails."""
    user = User.objects.get(pk=user_id)
    send_mail(
        "Three tips to get started", "1. ... 2. ... 3. ...", "shop@example.com", [user.email]
    )
    return user.email


@task(takes_context=True)
def build_report(context: JobContext, report_id: int) -> int:
    """Count the primes below the report's limit (slowly on purpose) and save it. It
    reports how far its sieve is: a large limit runs long enough to watch it, or to
    abort it, on its page in the dashboard."""
    report = Report.objects.get(pk=report_id)
    sieve = bytearray([1]) * report.limit
    sieve[0] = sieve[1] = 0
    last = int(report.limit**0.5)
    for n in range(2, last + 1):
        context.set_progress(n, last, "sieving")
        if sieve[n]:
            sieve[n * n :: n] = bytes(len(range(n * n, report.limit, n)))
    report.primes = sum(sieve)
    report.finished_at = timezone.now()
    report.save(update_fields=["primes", "finished_at"])
    return report.primes


@task(queue_name="imports")
def import_row(customer: str, row: int) -> str:
    """One row of a customer's import. The imports queue is fair: enqueued with the
    customer as its fairness key, each customer's rows take turns with the others'."""
    time.sleep(0.01)  # stands for: parse the row, save it
    return f"{customer} row {row}"


@task(queue_name="low")
def tidy_up(batch: int) -> str:
    return f"tidied batch {batch}"


@task(queue_name="low", retries=2, retry_backoff=1.0, timeout=10)
async def sync_inventory(batch: int) -> str:
    """Talks to a flaky supplier: fails now and then, is retried, sometimes for good.
    Async: it awaits the supplier on the worker's event loop, beside the other jobs."""
    await asyncio.sleep(0.2)  # stands for: await client.post(supplier_url, timeout=5)
    if random.random() < 0.4:
        raise ConnectionError(f"supplier timed out on batch {batch}")
    return f"synced batch {batch}"


@task(takes_context=True)
def analyse_chunk(context: JobContext, run_id: int, index: int) -> dict:
    """One member of a log run's group: the counts of its chunk. It reports the lines
    counted as it goes: its job's page in the dashboard shows them, and the group's
    page sums its members'."""
    chunk = LogChunk.objects.get(run_id=run_id, index=index)
    return logs.count(chunk.text, progress=context.set_progress)


@task
def summarise_log(chunk_counts: list[dict | None], run_id: int) -> int:
    """The group's callback, queued once every chunk was analysed: ``chunk_counts`` holds
    each chunk's counts (None for a chunk whose job failed). Writes the merged summary
    and the failures to the run, deletes the chunks; returns the lines counted."""
    summary = logs.merge(counts for counts in chunk_counts if counts is not None)
    LogRun.objects.filter(pk=run_id).update(
        summary=summary, failed_chunks=chunk_counts.count(None), finished_at=timezone.now()
    )
    LogChunk.objects.filter(run_id=run_id).delete()
    return summary["lines"]


@task(queue_name="low")
def purge_old_logs(days: int) -> int:
    """Periodic (settings.TASKS["default"]["OPTIONS"]["PERIODIC"]): delete the log runs
    older than ``days``, their chunks with them; return how many runs went."""
    cutoff = timezone.now() - timedelta(days=days)
    _, by_model = LogRun.objects.filter(created_at__lt=cutoff).delete()
    return by_model.get(LogRun._meta.label, 0)
