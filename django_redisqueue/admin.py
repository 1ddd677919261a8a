"""The queue dashboard, inside the Django admin.

An unmanaged model (``models.Dashboard``) puts it on the admin index; its pages are
extra admin URLs wrapped in ``admin_site.admin_view``. Looking needs
``django_redisqueue.view_dashboard``; acting needs ``django_redisqueue.manage_queues``.
Actions are POST with CSRF; destructive ones are confirmed on a page of their own.
No page may be framed (X-Frame-Options: DENY), with or without the project's
XFrameOptionsMiddleware.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

import django
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, register_converter, reverse
from django.utils.encoding import escape_uri_path
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext
from django.views.decorators.clickjacking import xframe_options_deny
from django.views.decorators.http import require_GET, require_POST

from django_redisqueue.backends.redis import RedisQueueBackend, our_backends
from django_redisqueue.compat import task_backends
from django_redisqueue.core.jobs import JOB_ID_RE, from_ms
from django_redisqueue.dashboard import actions
from django_redisqueue.dashboard.reads import FILTER_SCAN_LIMIT, FailedScan
from django_redisqueue.dashboard.reads import Dashboard as DashboardData
from django_redisqueue.dashboard.rows import (
    MENU_QUEUES,
    PAGE_SIZE,
    JobRow,
    Page,
    is_path,
    page_number,
)
from django_redisqueue.models import Dashboard
from django_redisqueue.observe.metrics import QUEUE_SERIES_LIMIT
from django_redisqueue.store.gateway import REDIS_ERRORS

VIEW = "django_redisqueue.view_dashboard"
MANAGE = "django_redisqueue.manage_queues"
# How often a dashboard page fetches its live part again.
REFRESH_SECONDS = 5
# Jobs one action on a selection may name: those of one page.
SELECTION_LIMIT = PAGE_SIZE
# Django 6.1's admin marks breadcrumbs up as a list, and styles only that.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)


class JobIdConverter:
    """Any job or group id, as Redis may hold any member in a queue or a group's field:
    empty, or with slashes."""

    regex = r"[\s\S]*"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(JobIdConverter, "drq_job_id")


def choices(seen: list[tuple[str, int]], chosen: str) -> list[tuple[str, int]]:
    """A filter's choices: the values ``seen``, with how many jobs each, and the one
    ``chosen`` even if it was not seen."""
    if chosen and chosen not in dict(seen):
        return [*seen, (chosen, 0)]
    return seen


@dataclass(frozen=True)
class Crumb:
    label: str
    url: str = ""  # '' for the page itself


def allowed(request: HttpRequest, permission: str) -> bool:
    """Whether the user of ``request`` has ``permission`` (any user model of the admin)."""
    return bool(getattr(request.user, "has_perm", lambda _: False)(permission))


def redisqueue_aliases() -> list[str]:
    """The TASKS aliases served by this app, in settings order."""
    return [alias for alias, _ in our_backends()]


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return allowed(request, VIEW)

    def has_view_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return allowed(request, VIEW)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        def page(function: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            # No page may be framed (clickjacking: a click on an action or a confirm
            # page's button), whether or not the project has XFrameOptionsMiddleware.
            return xframe_options_deny(self.admin_site.admin_view(function))

        def view(function: Callable[..., HttpResponse], route: str, name: str) -> URLPattern:
            return path(route, page(function), name=f"redisqueue_{name}")

        return [
            # The admin index links to the model's "changelist": the overview.
            path("", page(self.index_view), name="django_redisqueue_dashboard_changelist"),
            view(self.overview_view, "<str:alias>/", "overview"),
            view(self.queue_view, "<str:alias>/queue/<str:queue>/", "queue"),
            view(self.delayed_index_view, "<str:alias>/delayed/", "delayed_index"),
            view(self.delayed_view, "<str:alias>/delayed/<str:queue>/", "delayed"),
            view(self.running_view, "<str:alias>/running/", "running"),
            view(self.failed_index_view, "<str:alias>/failed/", "failed_index"),
            view(self.failed_view, "<str:alias>/failed/<str:queue>/", "failed"),
            view(self.job_lookup_view, "<str:alias>/job/", "job_lookup"),
            view(self.job_view, "<str:alias>/job/<drq_job_id:job_id>/", "job"),
            view(self.groups_view, "<str:alias>/groups/", "groups"),
            view(self.group_view, "<str:alias>/group/<drq_job_id:group_id>/", "group"),
            view(self.broadcasts_view, "<str:alias>/broadcasts/", "broadcasts"),
            view(self.schedules_view, "<str:alias>/schedules/", "schedules"),
            view(self.confirm_view, "<str:alias>/confirm/<str:action>/", "confirm"),
            view(self.action_view, "<str:alias>/act/<str:action>/", "act"),
            view(self.selection_view, "<str:alias>/selected/", "selected"),
        ]

    # Helpers

    def _backend(self, request: HttpRequest, alias: str) -> RedisQueueBackend:
        if not allowed(request, VIEW):
            raise PermissionDenied
        if alias not in redisqueue_aliases():
            raise Http404(f"No django_redisqueue backend {alias!r} in settings.TASKS")
        return cast(RedisQueueBackend, task_backends[alias])

    def _render(
        self,
        request: HttpRequest,
        template: str,
        alias: str,
        title: str,
        *,
        live: bool = True,
        overview: bool = False,
        served: list[str] | None = None,
        **context: object,
    ) -> TemplateResponse:
        """Render a dashboard page, or with ``?partial=1`` only its live part.

        A ``live`` page has a ``<name>_live.html`` part that the page's script fetches
        again every ``REFRESH_SECONDS``. A page that is not live (one holding a form to
        fill in) never refreshes, and has no part to ask for: ``?partial=1`` is a 404.
        ``served``: the queues served, when the view has read them already.
        """
        backend = cast(RedisQueueBackend, task_backends[alias])
        if served is None:
            served = backend.served_queues()
        # The menu names the first MENU_QUEUES queues, and the page's own.
        menu = served[:MENU_QUEUES]
        queue = context.get("queue")
        if isinstance(queue, str) and queue and queue not in menu:
            menu.append(queue)
        partial = bool(request.GET.get("partial"))
        query = request.GET.copy()
        query.pop("partial", None)
        aliases = redisqueue_aliases()
        overview_url = reverse("admin:redisqueue_overview", args=[alias])
        dashboard = "Queue dashboard" + (f" ({alias})" if len(aliases) > 1 else "")
        crumbs = [
            Crumb(gettext("Home"), reverse("admin:index")),
            Crumb(
                str(self.model._meta.app_config.verbose_name),
                reverse("admin:app_list", args=[self.model._meta.app_label]),
            ),
            Crumb(dashboard, "" if overview else overview_url),
            *([] if overview else [Crumb(title)]),
        ]
        pager_query = query.copy()
        pager_query.pop("page", None)
        base = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "alias": alias,
            "aliases": aliases,
            "crumbs": crumbs,
            "breadcrumbs_as_list": BREADCRUMBS_AS_LIST,
            # Redis's clock, which the times shown were taken by: "3 seconds ago" of it.
            "now": from_ms(backend.broker.clock_ms()),
            "queues": menu,
            "more_queues": len(served) - len(menu),
            "can_manage": allowed(request, MANAGE),
            "refresh_seconds": REFRESH_SECONDS if live else 0,
            # Where an action goes back to: this page, also when only its part is rendered.
            "here": escape_uri_path(request.path) + (f"?{query.urlencode()}" if query else ""),
            # What the pager's links keep of this page's query (its filters).
            "pager_query": pager_query.urlencode(),
        }
        name = f"admin/django_redisqueue/{template}"
        if partial:
            if not live:
                raise Http404("This page has no part that refreshes.")
            name = name.removesuffix(".html") + "_live.html"
        return TemplateResponse(request, name, {**base, **context})

    def _next_url(self, request: HttpRequest, alias: str, target: str) -> str:
        """Where to go back to after an action: ``target`` if it is a URL of this site.

        Anything else (another host, a ``javascript:`` URL, ...) gives the overview. Used
        both for the confirm page's links and for the action's redirect.
        """
        target = target.strip()
        if target and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return target
        return reverse("admin:redisqueue_overview", args=[alias])

    @staticmethod
    def _page_number(request: HttpRequest) -> int:
        try:
            return int(request.GET.get("page", 1))
        except ValueError:
            return 1

    def _queue(self, backend: RedisQueueBackend, queue: str) -> str:
        if not backend.serves(queue):
            raise Http404(f"No queue {queue!r} in backend {backend.alias!r}")
        return queue

    # Pages

    def index_view(self, request: HttpRequest) -> HttpResponse:
        if not allowed(request, VIEW):
            raise PermissionDenied
        aliases = redisqueue_aliases()
        if not aliases:
            raise Http404("settings.TASKS has no django_redisqueue backend")
        return HttpResponseRedirect(reverse("admin:redisqueue_overview", args=[aliases[0]]))

    def overview_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        """The overview: a page of the queues (``?page=``), or of those whose name
        holds ``?q=``, with the workers, schedulers and limits of the backend."""
        backend = self._backend(request, alias)
        data = DashboardData(backend)
        search = request.GET.get("q", "").strip()
        page = data.queue_page(self._page_number(request), search)
        whole = page.total == len(data.queues) and page.pages == 1
        return self._render(
            request,
            "overview.html",
            alias,
            "Queue dashboard",
            overview=True,
            served=data.queues,
            page=page,
            search=search,
            queue_count=len(data.queues),
            **data.overview(None if whole else page.rows),
        )

    def queue_view(self, request: HttpRequest, alias: str, queue: str) -> HttpResponse:
        backend = self._backend(request, alias)
        self._queue(backend, queue)
        data = DashboardData(backend)
        page = data.waiting(queue, self._page_number(request))
        paused = backend.queries.counts([queue])[queue].paused
        # A fair queue's keys with their backlogs; no command for another queue.
        fair = data.fair_keys(queue) if queue in backend.config.fair_queues else None
        return self._render(
            request,
            "queue.html",
            alias,
            f"Queue {queue}",
            queue=queue,
            page=page,
            paused=paused,
            fair=fair,
            selection_actions=actions.SELECTION_ACTIONS["waiting"],
        )

    def delayed_index_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        return self._first_queue_with(request, alias, "delayed")

    def delayed_view(self, request: HttpRequest, alias: str, queue: str) -> HttpResponse:
        backend = self._backend(request, alias)
        self._queue(backend, queue)
        page = DashboardData(backend).delayed(queue, self._page_number(request))
        return self._render(
            request,
            "delayed.html",
            alias,
            f"Delayed jobs: {queue}",
            queue=queue,
            page=page,
            selection_actions=actions.SELECTION_ACTIONS["delayed"],
        )

    def running_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        backend = self._backend(request, alias)
        rows = DashboardData(backend).running()
        return self._render(request, "running.html", alias, "Running jobs", rows=rows)

    def failed_index_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        return self._first_queue_with(request, alias, "failed")

    def _first_queue_with(self, request: HttpRequest, alias: str, kind: str) -> HttpResponse:
        """The ``kind`` page (failed, delayed) of the first queue that has such jobs, or
        of the first queue if none has; among as many queues as the metrics show."""
        backend = self._backend(request, alias)
        counts = backend.queries.counts(backend.served_queues()[:QUEUE_SERIES_LIMIT])
        if not counts:
            return HttpResponseRedirect(reverse("admin:redisqueue_overview", args=[alias]))
        queue = next((q for q, row in counts.items() if getattr(row, kind)), next(iter(counts)))
        return HttpResponseRedirect(reverse(f"admin:redisqueue_{kind}", args=[alias, queue]))

    def failed_view(self, request: HttpRequest, alias: str, queue: str) -> HttpResponse:
        """The failed jobs of a queue, the latest first; with ``?task=`` or
        ``?exception=`` (dotted paths; anything else is ignored, and said so) only those
        among the newest FILTER_SCAN_LIMIT, which also give the filters' choices."""
        backend = self._backend(request, alias)
        self._queue(backend, queue)
        data = DashboardData(backend)
        number = self._page_number(request)
        given = {name: request.GET.get(name, "").strip() for name in ("task", "exception")}
        task, exception = (value if is_path(value) else "" for value in given.values())
        scan: FailedScan | None = None
        if task or exception:
            scan = data.failed_scan(queue, task, exception)
            matching = len(scan.matching)
            page: Page[JobRow] = Page(number=page_number(number, matching), total=matching)
            page.rows = scan.matching[page.offset : page.offset + page.size]
        else:
            page = data.failed(queue, number)
            if not request.GET.get("partial"):  # the choices are outside the live part
                scan = data.failed_scan(queue)
        return self._render(
            request,
            "failed.html",
            alias,
            f"Failed jobs: {queue}",
            queue=queue,
            page=page,
            scan=scan,
            task=task,
            exception=exception,
            task_choices=choices(scan.tasks if scan else [], task),
            exception_choices=choices(scan.exceptions if scan else [], exception),
            filtered=bool(task or exception),
            ignored=[name for name, value in given.items() if value and not is_path(value)],
            scan_limit=FILTER_SCAN_LIMIT,
            selection_actions=actions.SELECTION_ACTIONS["failed"],
        )

    def job_lookup_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        self._backend(request, alias)
        job_id = request.GET.get("id", "").strip()
        if not job_id or "/" in job_id:
            messages.error(request, "Paste a job id to look it up.")
            return HttpResponseRedirect(reverse("admin:redisqueue_overview", args=[alias]))
        return HttpResponseRedirect(reverse("admin:redisqueue_job", args=[alias, job_id]))

    def job_view(self, request: HttpRequest, alias: str, job_id: str) -> HttpResponse:
        backend = self._backend(request, alias)
        job = DashboardData(backend).job(job_id)
        response = self._render(request, "job.html", alias, f"Job {job_id}", job=job)
        if not job.exists:
            response.status_code = 404
        return response

    def groups_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        backend = self._backend(request, alias)
        page = DashboardData(backend).groups(self._page_number(request))
        return self._render(request, "groups.html", alias, "Groups", page=page)

    def group_view(self, request: HttpRequest, alias: str, group_id: str) -> HttpResponse:
        backend = self._backend(request, alias)
        detail = DashboardData(backend).group(group_id, self._page_number(request))
        response = self._render(
            request,
            "group.html",
            alias,
            f"Group {group_id}",
            detail=detail,
            group=detail.group,
            page=detail.members,
        )
        if not detail.exists:
            response.status_code = 404
        return response

    def broadcasts_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        backend = self._backend(request, alias)
        page = DashboardData(backend).broadcasts(self._page_number(request))
        return self._render(request, "broadcasts.html", alias, "Broadcasts", page=page)

    def schedules_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        backend = self._backend(request, alias)
        rows = DashboardData(backend).schedules()
        return self._render(request, "schedules.html", alias, "Periodic jobs", rows=rows)

    # Actions

    def confirm_view(self, request: HttpRequest, alias: str, action: str) -> HttpResponse:
        return require_GET(self._confirm)(request, alias, action)

    def _confirm(self, request: HttpRequest, alias: str, action: str) -> HttpResponse:
        backend = self._backend(request, alias)
        if not allowed(request, MANAGE):
            raise PermissionDenied
        spec = actions.ACTIONS.get(action)
        if spec is None or spec.needs_schedule:  # a schedule's actions ask nothing first
            raise Http404(f"No action {action!r} to confirm")
        queue = self._action_queue(backend, spec, request.GET)
        job_id = request.GET.get("job_id", "")
        group_id = request.GET.get("group_id", "") if spec.needs_group else ""
        if spec.needs_group and backend.queries.group(group_id) is None:
            raise Http404(f"No group {group_id!r} (or it expired)")
        return self._render(
            request,
            "confirm.html",
            alias,
            f"{spec.label}?",
            action=action,
            action_label=spec.label,
            queue=queue,
            job_id=job_id,
            group_id=group_id,
            next=self._next_url(request, alias, request.GET.get("next", "")),
            live=False,
        )

    def action_view(self, request: HttpRequest, alias: str, action: str) -> HttpResponse:
        return require_POST(self._act)(request, alias, action)

    def _act(self, request: HttpRequest, alias: str, action: str) -> HttpResponse:
        backend = self._backend(request, alias)
        if not allowed(request, MANAGE):
            raise PermissionDenied
        spec = actions.ACTIONS.get(action)
        if spec is None:
            raise Http404(f"No action {action!r}")
        queue = self._action_queue(backend, spec, request.POST)
        job_id = request.POST.get("job_id", "")
        group_id = request.POST.get("group_id", "")
        if spec.needs_job and not job_id:
            messages.error(request, f"{spec.label}: which job?")
        elif spec.needs_group and not group_id:
            messages.error(request, f"{spec.label}: which group?")
        elif spec.destructive and request.POST.get("confirmed") != "yes":
            messages.error(request, f"{spec.label}: not confirmed, nothing done.")
        else:
            with _redis_failures_told(request, spec.label):
                if spec.needs_group:
                    told = actions.cancel_group(backend, group_id)
                elif spec.needs_schedule:
                    schedule = request.POST.get("schedule", "")
                    try:
                        told = actions.act_on_schedule(backend, action, schedule)
                    except LookupError as exc:
                        raise Http404(str(exc)) from exc
                else:
                    told = actions.apply(backend, action, queue, job_id)
                _tell(request, told)
        return HttpResponseRedirect(self._next_url(request, alias, request.POST.get("next", "")))

    def selection_view(self, request: HttpRequest, alias: str) -> HttpResponse:
        return require_POST(self._act_on_selection)(request, alias)

    def _act_on_selection(self, request: HttpRequest, alias: str) -> HttpResponse:
        """An action on the jobs selected in a list: POST ``action``, ``queue`` and one
        ``job_id`` per job (at most SELECTION_LIMIT, each a job id, or nothing is done).
        A destructive action first answers a page listing the jobs, asking to confirm,
        as the admin's "delete selected" does."""
        backend = self._backend(request, alias)
        if not allowed(request, MANAGE):
            raise PermissionDenied
        queue = self._queue(backend, request.POST.get("queue", ""))
        next_url = self._next_url(request, alias, request.POST.get("next", ""))
        action = request.POST.get("action", "")
        job_ids = list(dict.fromkeys(request.POST.getlist("job_id")))
        label = actions.SELECTION_LABELS.get(action)
        if label is None:
            messages.error(request, "Choose an action for the selected jobs: nothing done.")
        elif not job_ids:
            messages.error(request, "Select the jobs to act on: nothing done.")
        elif len(job_ids) > SELECTION_LIMIT:
            messages.error(
                request, f"At most {SELECTION_LIMIT} jobs at once (one page): nothing done."
            )
        elif not all(JOB_ID_RE.fullmatch(job_id) for job_id in job_ids):
            messages.error(request, "Some selected values are not job ids: nothing done.")
        elif actions.ACTIONS[action].destructive and request.POST.get("confirmed") != "yes":
            return self._render(
                request,
                "confirm.html",
                alias,
                f"{label}?",
                live=False,
                action=action,
                action_label=label,
                queue=queue,
                selected=DashboardData(backend).jobs(job_ids),
                next=next_url,
            )
        else:
            with _redis_failures_told(request, label):
                _tell(request, actions.apply_to_selection(backend, action, queue, job_ids))
        return HttpResponseRedirect(next_url)

    def _action_queue(
        self, backend: RedisQueueBackend, spec: actions.Action, data: Mapping[str, str]
    ) -> str:
        """The queue an action acts on ('' for a group's or a schedule's)."""
        if spec.needs_group or spec.needs_schedule:
            return ""
        return self._queue(backend, data.get("queue", ""))


def _tell(request: HttpRequest, told: list[actions.Told]) -> None:
    for level, text in told:
        messages.add_message(request, level, text)


@contextlib.contextmanager
def _redis_failures_told(request: HttpRequest, label: str) -> Iterator[None]:
    """An action Redis refused (a key of another type written by hand, out of memory)
    or did not answer is told on the page it returns to, not answered with an error
    page. Each script is atomic: what the message names as done, is."""
    try:
        yield
    except REDIS_ERRORS as exc:
        messages.error(
            request,
            f"{label}: Redis refused it or did not answer ({type(exc).__name__}: {exc}); "
            "nothing more was done.",
        )
