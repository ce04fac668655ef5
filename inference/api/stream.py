"""`GET /api/v1/generations/<id>/stream`: a generation's events as Server-Sent Events.

The view tails the generation's Redis Stream, so any edge process can serve any stream and
several tabs can watch one generation. Each event's `id:` is its stream entry id: a client
that reconnects with `Last-Event-ID` gets exactly what it missed, then the live tail. Once
the stream has expired, the stored message is served as one `delta` and `done`.

Disconnects: the last watcher leaving notes since when nobody watches (`queue.DETACH`), and
the scheduler's housekeeping cancels the generation if nobody re-attaches within the grace:
`STREAM_FIRST_TOKEN_GRACE_SECONDS` for one left before its first token (queued or not),
`STREAM_GRACE_SECONDS` after it. A client that reconnects at once keeps its answer. A page of
the web chat reads with `?page=<its own id>`, so that when it goes away (`queue.LEAVE`) its own
streams are told from other clients'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from accounts.authentication import request_caller, stream_credential_check
from chatsite import sse
from chatsite.errors import ErrorCode, NotFound, error_response
from chatsite.stream_events import StreamEvent
from inference import queue, selectors
from inference.models import Generation

logger = logging.getLogger(__name__)


async def generation_stream(
    request: HttpRequest, generation_id: UUID
) -> HttpResponse | StreamingHttpResponse:
    if request.method != "GET":
        return error_response(405, ErrorCode.METHOD_NOT_ALLOWED, "Only GET is allowed here.")
    user = await request_caller(request)
    if user is None:
        return error_response(401, ErrorCode.NOT_AUTHENTICATED, "Log in or send an API key.")
    # The caller as found here (the key's owner, whatever the session says): the rate-limit
    # headers describe them without looking the key up again.
    request.user = user
    try:
        generation = await sync_to_async(selectors.generation_to_stream)(
            user=user, generation_id=generation_id
        )
    except NotFound as exc:
        return error_response(404, exc.code, exc.message)
    try:
        last_id = sse.last_event_id(request) or "0-0"
    except sse.InvalidEventId:
        return error_response(
            400, ErrorCode.INVALID_LAST_EVENT_ID, "Last-Event-ID is not an event id."
        )

    page = request.GET.get("page", "")
    if page and not re.fullmatch(queue.PAGE_ID_PATTERN, page):
        return error_response(400, ErrorCode.INVALID_PAGE_ID, "page is not a page id.")

    redis = sse.stream_redis()
    if not await redis.exists(queue.stream_key(generation.id)):
        await redis.aclose()
        body = await sync_to_async(_stored_events)(generation.id)
        return sse.sse_response(_once(body))
    check = stream_credential_check(request, redis)
    return sse.sse_response(_tail(redis, generation, last_id, page, check))


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _stored_events(generation_id: UUID) -> bytes:
    """The finished answer from Postgres, for a client that comes back after the stream."""
    generation = Generation.objects.select_related("message", "pool").get(pk=generation_id)
    message = generation.message
    out = sse.format_event(
        "0-1",
        StreamEvent.META,
        json.dumps(
            {
                "generation_id": str(generation.id),
                "message_id": str(message.id),
                "model": generation.pool.name,
                "status": generation.status,
            }
        ),
    )
    if message.status == message.Status.BLOCKED:
        # Withheld by moderation: the notice, never the text.
        out += sse.format_event(
            "0-2",
            StreamEvent.RETRACT,
            json.dumps({"reason": "content_filter", "notice": settings.MODERATION_RETRACT_NOTICE}),
        )
    elif message.content:
        out += sse.format_event("0-2", StreamEvent.DELTA, json.dumps({"text": message.content}))
    if generation.status in (Generation.Status.FAILED, Generation.Status.REJECTED):
        out += sse.format_event(
            "0-3",
            StreamEvent.ERROR,
            json.dumps({"code": generation.error_code, "message": generation.error_message}),
        )
    out += sse.format_event(
        "0-4",
        StreamEvent.DONE,
        json.dumps(
            {
                "status": generation.status,
                "finish_reason": generation.finish_reason,
                "prompt_tokens": generation.prompt_tokens,
                "output_tokens": generation.output_tokens,
            }
        ),
    )
    return out


async def _tail(
    redis: Any,
    generation: Generation,
    last_id: str,
    page: str,
    still_allowed: Callable[[], Awaitable[bool]] | None,
) -> AsyncGenerator[bytes, None]:
    gid = str(generation.id)
    keys = queue.watch_keys(gid)
    tail = sse.Tail(queue.stream_key(gid), last_id, still_allowed=still_allowed)
    await redis.eval(
        queue.ATTACH, len(keys), *keys, gid, str(settings.GENERATION_STREAM_TTL_SECONDS), page
    )
    try:
        async with contextlib.aclosing(tail.events()) as events:
            async for chunk in events:
                yield chunk
    finally:
        await asyncio.shield(_detach(redis, gid, keys, page))


async def _detach(redis: Any, generation_id: str, keys: list[str], page: str) -> None:
    """The client left: if it was the last, housekeeping cancels the generation unless one
    re-attaches within the grace."""
    try:
        await redis.eval(queue.DETACH, len(keys), *keys, generation_id, str(queue.now_ms()), page)
    except Exception:
        logger.exception("could not record the detach from generation %s", generation_id)
    finally:
        await redis.aclose()
