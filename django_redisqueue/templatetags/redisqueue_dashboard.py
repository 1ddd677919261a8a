"""Template tags of the queue dashboard: ``{% load redisqueue_dashboard %}``."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_redisqueue.dashboard.rows import relative

register = template.Library()


@register.simple_tag(takes_context=True)
def moment(context: template.Context, value: object, empty: str = "\u2013") -> SafeString | str:
    """``value`` (a datetime) as people say it, "3 seconds ago" or "in 59 minutes", in a
    ``<time>`` whose title holds the exact time in the current time zone; ``empty`` for
    anything else. Relative to ``now`` in the context (Redis's clock, which the times
    shown were taken by), else to this host's."""
    if not isinstance(value, datetime):
        return empty
    now = context.get("now")
    if not isinstance(now, datetime):
        now = timezone.now()
    try:
        local = timezone.localtime(value)
    except (OverflowError, ValueError):  # the year 9999 ends past midnight elsewhere
        local = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        format_date(local, "Y-m-d H:i:s T"),
        relative(value, now),
    )
