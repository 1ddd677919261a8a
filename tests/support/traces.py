"""Spans for the traces' tests (tests/test_tracing.py): recorded in memory in this
process, and by the processes a test starts into a file, one JSON object per line
(tests/support/settings.py sets that up when REDISQUEUE_TEST_SPANS names the file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as the SDK writes it in JSON: name, kind, context, parent_id,
    links, attributes, status, events."""
    return json.loads(span.to_json())


def export_spans_to(path: str) -> None:
    """Make this process's tracer provider write every span to ``path`` as it ends
    (synchronously: a process killed a moment later has written it)."""
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    exporter = ConsoleSpanExporter(out=out, formatter=lambda s: json.dumps(span_dict(s)) + "\n")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
