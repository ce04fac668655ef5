"""`GET /api/v1/events/stream`: the caller's events (new titles, deletions) as SSE.

Without `Last-Event-ID` the stream starts at what happens next; with it, at what the client
missed (within the capped stream). Heartbeats keep proxies from closing an idle connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from accounts.authentication import request_caller, stream_credential_check
from chatsite import sse
from chatsite.errors import ErrorCode, error_response

from ..events import user_events_key


async def user_event_stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "GET":
        return error_response(405, ErrorCode.METHOD_NOT_ALLOWED, "Only GET is allowed here.")
    user = await request_caller(request)
    if user is None:
        return error_response(401, ErrorCode.NOT_AUTHENTICATED, "Log in or send an API key.")
    try:
        last_id = sse.last_event_id(request)
    except sse.InvalidEventId:
        return error_response(
            400, ErrorCode.INVALID_LAST_EVENT_ID, "Last-Event-ID is not an event id."
        )
    redis = sse.stream_redis()
    stream = user_events_key(user.pk)
    if not last_id:
        # "Now", as an id: re-reading with "$" after each heartbeat would lose the events
        # that land between two reads.
        newest = await redis.xrevrange(stream, count=1)
        last_id = str(newest[0][0]) if newest else "0-0"
    check = stream_credential_check(request, redis)
    return sse.sse_response(_tail(redis, stream, last_id, check))


async def _tail(
    redis: Any, stream: str, last_id: str, still_allowed: Callable[[], Awaitable[bool]] | None
) -> AsyncGenerator[bytes, None]:
    # A user's stream has no last event: it lasts as long as the page (or, read with an API
    # key, until the key is revoked).
    tail = sse.Tail(stream, last_id, until=(), still_allowed=still_allowed)
    try:
        async with contextlib.aclosing(tail.events()) as events:
            async for chunk in events:
                yield chunk
    finally:
        await redis.aclose()
