"""OpenTelemetry for the example project, when its packages are installed (``make demo``
installs them): a span per request, per enqueue and per job's attempt, printed one line
each by the console exporter (docs/howto/tracing.md)."""

from __future__ import annotations

import os


def one_line(span) -> str:  # type: ignore[no-untyped-def]
    """A span as one line: its trace, its id, its parent, what it is."""
    context, parent = span.get_span_context(), span.parent
    attributes = span.attributes or {}
    shown = ", ".join(
        f"{name}={attributes[name]}"
        for name in ("messaging.message.id", "redisqueue.job.attempt", "redisqueue.job.outcome")
        if name in attributes
    )
    return (
        f"span trace={context.trace_id:032x} id={context.span_id:016x} "
        f"parent={f'{parent.span_id:016x}' if parent else '-'} {span.kind.name} "
        f"{span.name!r} {shown}\n"
    )


def set_up_tracing(service: str = "mysite") -> None:
    """Trace this process, if the OpenTelemetry SDK is installed (else nothing)."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # Each span printed as it ends, so that Ctrl-C loses none: a demo's choice. A site
    # exports in batches (BatchSpanProcessor), off its requests' path.
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=one_line)))
    trace.set_tracer_provider(provider)
    try:
        from opentelemetry.instrumentation.django import DjangoInstrumentor
    except ImportError:  # no span per request, but the jobs' spans still
        return
    DjangoInstrumentor().instrument()
