"""`GET /api/v1/events/stream`: the caller's events (new titles, deletions) as SSE.

Without `Last-Event-ID` the stream starts at what happens next; with it, at what the client
missed (within the capped stream). Heartbeats keep proxies from closing an idle connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from redis.exceptions import RedisError

from inference import queue
from inference.api.stream import EVENT_ID, error_response, format_event, stream_caller

from ..events import user_events_key


async def user_event_stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "GET":
        return error_response(405, "method_not_allowed", "Only GET is allowed here.")
    user = await stream_caller(request)
    if user is None:
        return error_response(401, "not_authenticated", "Log in or send an API key.")
    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or ""
    if last_id and not EVENT_ID.match(last_id):
        return error_response(400, "invalid_last_event_id", "Last-Event-ID is not an event id.")
    redis = queue.async_redis(socket_timeout=settings.STREAM_HEARTBEAT_SECONDS + 10)
    stream = user_events_key(user.pk)
    if not last_id:
        # "Now", as an id: re-reading with "$" after each heartbeat would lose the events
        # that land between two reads.
        newest = await redis.xrevrange(stream, count=1)
        last_id = str(newest[0][0]) if newest else "0-0"
    response = StreamingHttpResponse(
        _tail(redis, stream, last_id), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _tail(redis: Any, stream: str, last_id: str) -> AsyncIterator[bytes]:
    # The response may stay open for hours; the request's database connection must not.
    await sync_to_async(connections.close_all)()
    try:
        yield f"retry: {settings.STREAM_RETRY_MS}\n\n".encode()
        while True:
            try:
                batches = await redis.xread(
                    {stream: last_id}, count=64, block=settings.STREAM_HEARTBEAT_SECONDS * 1000
                )
            except RedisError:
                return  # the client reconnects with Last-Event-ID and loses nothing
            if not batches:
                yield b": heartbeat\n\n"
                continue
            for entry_id, fields in batches[0][1]:
                last_id = entry_id
                yield format_event(entry_id, fields.get("event", "message"), fields["data"])
    finally:
        await redis.aclose()
