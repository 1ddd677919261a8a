from django.contrib import messages
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_redisqueue.compat import TaskResultDoesNotExist, task_backends

from .models import Report
from .tasks import build_report, send_tips_email, send_welcome_email, sync_inventory, tidy_up


def index(request: HttpRequest) -> HttpResponse:
    backend = task_backends["default"]
    queues = {name: backend.broker.queue_length(name) for name in backend.queue_names}
    queues["delayed"] = backend.broker.delayed_count(backend.queue_names)
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
    user = User.objects.create_user(username, email=f"{username}@example.com")
    result = send_welcome_email.enqueue(user.pk)  # high queue: runs before anything else
    send_tips_email.using(delay=20).enqueue(user.pk)  # runscheduler queues it in 20 s
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
