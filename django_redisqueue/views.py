"""Views to include in a project's URLs (the dashboard's are the admin's, in admin.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_redisqueue.backends.redis import redisqueue_backends
from django_redisqueue.observe.metrics import CONTENT_TYPE, render


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics of every RedisQueueBackend in settings.TASKS.

    Open to whoever can reach it: protect it as the project's other internal endpoints
    (``login_required``, a check of the scraper's token, or the proxy's rules)."""
    return HttpResponse(render(redisqueue_backends()), content_type=CONTENT_TYPE)
