"""A turn's request id, generation id and trace, from the edge through the scheduler to the
worker: JSON log lines that carry the ids, the worker's request id, the spans of one trace,
and spans exported over OTLP/HTTP.

The stand-in worker records the request id it was sent (a real vLLM worker's own log:
test_e2e_vllm.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from accounts.services import api_key_create
from chatsite import tracing
from chatsite.testing import budget

from .fixtures import finished, register_pool, running_schedulers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST_ID = "client-req-42"
EDGE_STEPS = [
    "turn.accept",
    "turn.moderate_input",
    "turn.persist",
    "turn.assemble",
    "turn.reserve",
    "turn.enqueue",
]
SCHEDULER_STEPS = [
    "scheduler.queue_wait",
    "scheduler.placement",
    "scheduler.generate",
    "scheduler.finish",
]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for this test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)
    provider.shutdown()


async def _send(user: User, content: str = "Hello there") -> tuple[Any, str]:
    """A message POST through the ASGI path, with its sync work on the edge's pool of threads
    (as in production); the response and its generation's id. In a task of its own, as the
    ASGI handler runs each request (the test client runs it in the caller's task, whose
    context the schedulers started next would inherit)."""
    return await asyncio.create_task(_post(user, content))


async def _post(user: User, content: str) -> tuple[Any, str]:
    _, key = await sync_to_async(api_key_create)(user=user, name="tests")
    client = AsyncClient()
    authorization = {"Authorization": f"Bearer {key}"}
    created = await client.post(
        "/api/v1/conversations", {}, content_type="application/json", headers=authorization
    )
    assert created.status_code == 201, created.content
    response = await client.post(
        f"/api/v1/conversations/{created.json()['id']}/messages",
        {"content": content},
        content_type="application/json",
        headers={**authorization, "X-Request-Id": REQUEST_ID},
    )
    assert response.status_code == 201, response.content
    return response, response.json()["generation"]["id"]


async def test_log_lines_carry_the_ids_from_the_edge_to_the_worker(
    user: User, fake_workers: Any, json_lines: Any, settings: Any
) -> None:
    settings.EDGE_SYNC_THREADS = True
    fake = fake_workers(tokens=4)
    await sync_to_async(register_pool)(fake)

    response, generation_id = await _send(user)
    assert response["X-Request-Id"] == REQUEST_ID
    async with running_schedulers():
        await wait_for(lambda: finished(generation_id))

    lines = json_lines()
    assert lines and all(line["time"] and line["level"] for line in lines)
    about = [line for line in lines if line.get("generation_id") == generation_id]
    # The edge's (queued, on its thread at commit) and the scheduler's (its run on a worker,
    # its end), each with the request id the client sent.
    assert [line["logger"] for line in about] == [
        "inference.services",
        "inference.scheduler.run",
        "inference.scheduler.run",
    ]
    assert "queued" in about[0]["message"] and "ended complete" in about[-1]["message"]
    assert all(line["request_id"] == REQUEST_ID for line in about)
    # The worker's request id names the generation, its attempt and the client's request.
    assert fake.request_ids == [f"{generation_id}-1.{REQUEST_ID}"]


async def test_a_turn_is_one_trace_from_the_edge_to_the_scheduler(
    user: User, fake_workers: Any, spans: InMemorySpanExporter, settings: Any
) -> None:
    settings.EDGE_SYNC_THREADS = True
    await sync_to_async(register_pool)(fake_workers(tokens=4))

    _, generation_id = await _send(user)
    async with running_schedulers():
        await wait_for(lambda: finished(generation_id))

    finished_spans = spans.get_finished_spans()
    by_name: dict[str, ReadableSpan] = {}
    for span in finished_spans:
        assert span.name not in by_name, f"{span.name} twice"
        by_name[span.name] = span
    assert sorted(by_name) == sorted(["turn", *EDGE_STEPS, *SCHEDULER_STEPS])

    def ids(span: ReadableSpan) -> tuple[int, int]:
        assert span.context is not None
        return span.context.trace_id, span.context.span_id

    trace_id, turn_id = ids(by_name["turn"])
    assert {ids(span)[0] for span in finished_spans} == {trace_id}
    assert by_name["turn"].parent is None
    assert by_name["turn"].attributes == {
        "chatsite.generation_id": generation_id,
        "chatsite.request_id": REQUEST_ID,
    }
    for name in EDGE_STEPS:
        parent = by_name[name].parent
        assert parent is not None and parent.span_id == turn_id, name
    enqueue_id = ids(by_name["turn.enqueue"])[1]
    for name in SCHEDULER_STEPS:
        parent = by_name[name].parent
        assert parent is not None and parent.span_id == enqueue_id, name
    generate = by_name["scheduler.generate"]
    assert [event.name for event in generate.events] == ["first_token"]
    assert generate.attributes is not None and generate.attributes["chatsite.attempt"] == 1


class _Collector:
    """A tiny OTLP/HTTP endpoint: records each POST it gets."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, bytes]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                collector.posts.append((self.path, self.headers["Content-Type"], body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> _Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


async def test_spans_are_exported_over_otlp_http(
    user: User, fake_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sync_to_async(register_pool)(fake_workers(tokens=4))
    with _Collector() as collector:
        monkeypatch.setenv(tracing.ENDPOINT_VARIABLE, collector.url)
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        provider = tracing.provider_from_environment("chatsite-test")
        assert provider is not None
        tracing.use(provider)
        try:
            await _send(user)
            assert provider.force_flush(timeout_millis=int(budget(60) * 1000))  # failure point
        finally:
            tracing.use(None)
            provider.shutdown()

    assert collector.posts
    names: set[str] = set()
    services: set[str] = set()
    for path, content_type, body in collector.posts:
        assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                names.update(span.name for span in scope_spans.spans)
    assert names == {"turn", *EDGE_STEPS}
    assert services == {"chatsite-test"}
