"""OpenTelemetry traces: off unless an OTLP endpoint is configured.

Spans: ``twg.receive`` per fetched batch of one partition (build + decode), ``twg.write``
per raw-lane segment, ``twg.commit`` per commit, and ``flight.<method>`` per Flight call.
Producers' W3C trace context is honoured both ways: a ``traceparent`` record header
becomes a *link* on the receive span of its batch (a batch holds many producers'
records, so it cannot have them all as parents), a ``traceparent`` gRPC header on a
Flight call becomes the call span's parent, and records produced by ``do_put`` carry the
call's ``traceparent`` unless they bring their own.

Each gateway has its own TracerProvider (not the global one), so several gateways in
one process — the tests — keep their spans apart; with tracing off, a no-op tracer makes
every span free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

MAX_LINKS = 32  # per receive span: enough to follow producers, bounded per batch

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """The gateway's tracer, exporting over OTLP/HTTP when ``endpoint`` is set."""

    def __init__(
        self, endpoint: str | None, service_name: str = "thalweg", sample_ratio: float = 1.0
    ) -> None:
        self.enabled = endpoint is not None
        self._provider: Any = None
        if endpoint is None:
            self.tracer: trace.Tracer = trace.NoOpTracer()
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=1000)
        )
        self.tracer = self._provider.get_tracer("thalweg")

    @contextmanager
    def span(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        links: Sequence[Link] = (),
        parent: SpanContext | None = None,
    ) -> Iterator[Span]:
        ctx = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
        with self.tracer.start_as_current_span(
            name, context=ctx, attributes=attributes, links=links
        ) as s:
            yield s

    def shutdown(self) -> None:
        """Export what is pending, then stop (called when the gateway stops)."""
        if self._provider is not None:
            self._provider.shutdown()


def context_from_traceparent(value: str | bytes | None) -> SpanContext | None:
    """The remote span context of a W3C ``traceparent`` value, if it is valid."""
    if value is None:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    ctx = _PROPAGATOR.extract({"traceparent": text})
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return span_ctx if span_ctx.is_valid else None


def links_from_headers(headers: Any, limit: int = MAX_LINKS) -> list[Link]:
    """Links to the producers' spans named by ``traceparent`` record headers.

    ``headers`` is the raw lane's headers column (list<struct<key, value>>) as Python
    values; only called when tracing is on, and stops after ``limit`` links.
    """
    links: list[Link] = []
    for record in headers:
        for h in record or ():
            if h["key"] in (b"traceparent", "traceparent"):
                ctx = context_from_traceparent(h["value"])
                if ctx is not None:
                    links.append(Link(ctx))
                    if len(links) >= limit:
                        return links
    return links


def current_traceparent() -> bytes | None:
    """The ``traceparent`` of the current span (to put on produced records)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    value = carrier.get("traceparent")
    return value.encode() if value else None


def traceparent_of(ctx: SpanContext) -> bytes:
    """The W3C ``traceparent`` header value naming ``ctx``."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()
