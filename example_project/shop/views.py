from contextlib import suppress
from functools import partial

from django.contrib import messages
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from django_redisqueue import group
from django_redisqueue.compat import TaskResultDoesNotExist, task_backends

from . import logs
from .models import LogChunk, LogRun, Report
from .tasks import (
    analyse_chunk,
    build_report,
    import_row,
    send_tips_email,
    send_welcome_email,
    summarise_log,
    sync_inventory,
    tidy_up,
)

MAX_LOG_LINES = 200_000  # 400 chunks: plenty for a demo


def index(request: HttpRequest) -> HttpResponse:
    backend = task_backends["default"]
    queues = {name: backend.queries.queue_length(name) for name in backend.queue_names}
    queues["delayed"] = backend.queries.delayed_count(backend.queue_names)
    reports = Report.objects.order_by("-created_at")[:10]
    return render(
        request,
        "shop/index.html",
        {"queues": queues, "reports": reports, "users": User.objects.order_by("-id")[:5]},
    )


@require_POST
def signup(request: HttpRequest) -> HttpResponse:
    username = request.POST.get("username", "").strip()
    if not username or User.objects.filter(username=username).exists():
        messages.error(request, "Pick a new, non-empty user name.")
        return redirect("index")
    # The user and the jobs commit together: the jobs are written to the outbox in this
    # transaction (OUTBOX), and relayed to Redis once it commits.
    with transaction.atomic():
        user = User.objects.create_user(username, email=f"{username}@example.com")
        result = send_welcome_email.enqueue(user.pk)  # high queue: runs before the rest
        send_tips_email.using(delay=20).enqueue(user.pk)  # due in 20 s
    messages.success(request, f"Welcome email queued as job {result.id}; tips in 20 s.")
    return redirect("index")


@require_POST
def request_report(request: HttpRequest) -> HttpResponse:
    limit = min(max(int(request.POST.get("limit") or 1_000_000), 2), 50_000_000)
    with transaction.atomic():
        report = Report.objects.create(limit=limit)
        # Queued once the row is committed, so that the worker finds it; the id is
        # known at once.
        report.job_id = build_report.enqueue_on_commit(report.pk).id
        report.save(update_fields=["job_id"])
    messages.success(request, f"Report #{report.pk} requested.")
    return redirect("index")


# A customer with a big import, and three with small ones, queued after it.
IMPORTS = {"acme": 1000, "globex": 3, "initech": 3, "umbrella": 3}


@require_POST
def start_imports(request: HttpRequest) -> HttpResponse:
    for customer, rows in IMPORTS.items():
        import_row.using(fair_key=customer).enqueue_many(
            [((customer, row), {}) for row in range(rows)]
        )
    messages.success(
        request,
        "1,000 rows for acme, then 3 each for globex, initech and umbrella, on the fair "
        "queue imports: the small imports are done within the first dozen rows.",
    )
    return redirect("index")


@require_POST
def tidy(request: HttpRequest) -> HttpResponse:
    for batch in range(20):
        tidy_up.enqueue(batch)
        sync_inventory.enqueue(batch)
    messages.success(request, "40 low-priority jobs queued (some inventory syncs will fail).")
    return redirect("index")


def job_status(request: HttpRequest, job_id: str) -> JsonResponse:
    try:
        result = task_backends["default"].get_result(job_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": "no such job"}, status=404)
    return JsonResponse(
        {
            "id": result.id,
            "task": result.task.module_path,
            "status": result.status,
            "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
            "errors": [error.traceback for error in result.errors],
        }
    )


def log_runs(request: HttpRequest) -> HttpResponse:
    runs = LogRun.objects.order_by("-created_at")[:10]
    return render(request, "shop/logs.html", {"runs": runs, "chunk_lines": logs.CHUNK_LINES})


@require_POST
def upload_log(request: HttpRequest) -> HttpResponse:
    upload = request.FILES.get("log")
    if upload is None:
        messages.error(request, "Choose a log file to upload.")
        return redirect("log-runs")
    return _fan_out(request, upload.name, upload.read().decode("utf-8", errors="replace"))


@require_POST
def generate_log(request: HttpRequest) -> HttpResponse:
    lines = min(max(int(request.POST.get("lines") or 3000), 1), MAX_LOG_LINES)
    return _fan_out(request, "sample", logs.sample_log(lines))


def _fan_out(request: HttpRequest, name: str, text: str) -> HttpResponse:
    """Store the log in chunks and, once they are committed, queue a group that
    analyses one chunk per job, with ``summarise_log`` as its callback."""
    lines = logs.log_lines(text)
    if not 0 < len(lines) <= MAX_LOG_LINES:
        messages.error(request, f"A log needs 1 to {MAX_LOG_LINES} lines, not {len(lines)}.")
        return redirect("log-runs")
    with transaction.atomic():
        run = LogRun.objects.create(name=name[:200], lines=len(lines))
        pieces = logs.chunks(lines)
        LogChunk.objects.bulk_create(
            LogChunk(run=run, index=index, text=piece) for index, piece in enumerate(pieces)
        )
        transaction.on_commit(partial(_analyse, run.pk, len(pieces)))
    return redirect("log-run", run.pk)


def _analyse(run_id: int, chunk_count: int) -> None:
    members = [analyse_chunk.job(run_id, index) for index in range(chunk_count)]
    result = group(members, callback=summarise_log.job(run_id)).enqueue()
    LogRun.objects.filter(pk=run_id).update(group_id=result.id)


def log_run(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(LogRun, pk=run_id)
    progress = None
    if run.group_id:
        # Gone once the group's record expired; the summary, if written, stays on the run.
        with suppress(TaskResultDoesNotExist):
            progress = task_backends["default"].get_group(run.group_id).progress
    return render(request, "shop/log_run.html", {"run": run, "progress": progress})
