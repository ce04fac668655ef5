"""OpenTelemetry spans for the steps of a turn, off unless an OTLP endpoint is configured.

With `OTEL_EXPORTER_OTLP_ENDPOINT` set (the standard variable; the SDK's other `OTEL_*`
variables, such as `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_SERVICE_NAME`, apply too), each
process that calls `configure` (the edge, the scheduler) installs a tracer provider that
batches its spans to that endpoint over OTLP/HTTP. The edge's spans of a turn (`turn` and its
steps) and the scheduler's of the same generation form one trace: the edge writes the W3C
`traceparent` of its enqueue into the job (`inference.queue.Job.traceparent`), and the
scheduler continues from it (`resumed`).

Off (the default), no provider is installed and nothing here builds a span: `span` hands out
one shared empty context manager, `traceparent` an empty string, and the decorated functions
call through.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

F = TypeVar("F", bound=Callable[..., Any])

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"

_propagator = TraceContextTextMapPropagator()
_off: contextlib.nullcontext[None] = contextlib.nullcontext()
# The tracer spans come from; None while tracing is off.
_tracer: trace.Tracer | None = None


def provider_from_environment(service_name: str) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`; None if unset."""
    if not os.environ.get(ENDPOINT_VARIABLE):
        return None
    # Imported only here: a process that does not trace loads neither the SDK nor the
    # exporter (protobuf, requests).
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME, when set, names the process instead.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def configure(service_name: str) -> None:
    """Trace this process (`service_name`, e.g. `chatsite-edge`) if an endpoint is set: the
    provider becomes OpenTelemetry's global one, so instrumentation packages use it too."""
    provider = provider_from_environment(service_name)
    if provider is not None:
        trace.set_tracer_provider(provider)
        use(provider)


def use(provider: trace.TracerProvider | None) -> None:
    """Spans go to `provider` from now on; None turns tracing off (tests swap providers)."""
    global _tracer
    _tracer = provider.get_tracer("chatsite") if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span named `name` around the block, the current one's child (nothing when off)."""
    if _tracer is None:
        return _off
    return _tracer.start_as_current_span(name, attributes=attributes)


def traced(name: str) -> Callable[[F], F]:
    """Runs the decorated function (sync or async) in a span named `name`."""

    def decorate(function: F) -> F:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if _tracer is None:
                    return await function(*args, **kwargs)
                with _tracer.start_as_current_span(name):
                    return await function(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None:
                return function(*args, **kwargs)
            with _tracer.start_as_current_span(name):
                return function(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


def annotate(**attributes: Any) -> None:
    """Attributes on the current span."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def event(name: str, **attributes: Any) -> None:
    """An event (a moment, such as the first token) on the current span."""
    if _tracer is not None:
        trace.get_current_span().add_event(name, attributes)


def traceparent() -> str:
    """The current span's W3C `traceparent`, for work another process continues ("" off)."""
    if _tracer is None:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def _parent(parent: str) -> context.Context:
    return _propagator.extract({"traceparent": parent})


@contextlib.contextmanager
def resumed(parent: str) -> Iterator[None]:
    """Spans started within are children of the span `parent` (a `traceparent`) names."""
    if _tracer is None or not parent:
        yield
        return
    token = context.attach(_parent(parent))
    try:
        yield
    finally:
        context.detach(token)


def record(name: str, *, parent: str, start_ms: int, end_ms: int, **attributes: Any) -> None:
    """A span for a stretch already over (a wait measured from stored times), the child of
    the span `parent` names."""
    if _tracer is None or not parent:
        return
    done = _tracer.start_span(
        name, context=_parent(parent), attributes=attributes, start_time=start_ms * 1_000_000
    )
    done.end(end_time=max(start_ms, end_ms) * 1_000_000)
