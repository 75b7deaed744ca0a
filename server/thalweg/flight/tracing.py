"""A span per Flight call, child of the caller's ``traceparent`` header when it sends one.

pyarrow's Flight server is not grpcio, so OpenTelemetry's gRPC instrumentation cannot
hook it; server middleware sees every call instead. The span is not made "current" (a
streaming call can finish on another thread than it started on, and a context must be
detached where it was attached); handlers that need it ask :func:`call_span_context`.
"""

from __future__ import annotations

from typing import Any

import pyarrow.flight as fl
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode

from thalweg.ops.tracing import Tracing, context_from_traceparent

TRACE_KEY = "thalweg-trace"


class _CallSpan(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, span: Span) -> None:
        self.span = span

    def call_completed(self, exception: BaseException | None) -> None:
        if exception is not None:
            self.span.set_status(Status(StatusCode.ERROR, str(exception).split(". Detail:")[0]))
        self.span.end()


class TracingMiddlewareFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, tracing: Tracing) -> None:
        self._tracer = tracing.tracer

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _CallSpan:
        parent = None
        for value in headers.get("traceparent", []):
            parent = context_from_traceparent(value)
        method = str(info.method).rsplit(".", 1)[-1].lower()
        ctx = trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None
        span = self._tracer.start_span(
            f"flight.{method}", context=ctx, attributes={"rpc.system": "arrow_flight"}
        )
        return _CallSpan(span)


def call_span_context(context: fl.ServerCallContext) -> SpanContext | None:
    """The span context of this call's span (None when tracing is off)."""
    middleware = context.get_middleware(TRACE_KEY)
    if middleware is None:
        return None
    ctx = middleware.span.get_span_context()
    return ctx if ctx.is_valid else None
