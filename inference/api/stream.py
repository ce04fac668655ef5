"""`GET /api/v1/generations/<id>/stream`: a generation's events as Server-Sent Events.

The view tails the generation's Redis Stream, so any edge process can serve any stream and
several tabs can watch one generation. Each event's `id:` is its stream entry id: a client
that reconnects with `Last-Event-ID` gets exactly what it missed, then the live tail. Once
the stream has expired, the stored message is served as one `delta` and `done`.

Disconnects: the last watcher leaving before the first token cancels the generation at once;
after it, the scheduler cancels the generation if nobody re-attaches within the grace period.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from redis.exceptions import RedisError

from accounts.services import api_key_authenticate
from chatsite.errors import NotFound
from inference import queue, selectors, services
from inference.models import Generation

logger = logging.getLogger(__name__)

# A Redis Stream entry id, as clients send it back in Last-Event-ID.
EVENT_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
# Entries read per round trip: bounds what one connection holds in memory at a time.
READ_BATCH = 64
TERMINAL_EVENTS = {"done"}


def error_response(status: int, code: str, message: str) -> JsonResponse:
    """The one error shape, for the streaming views that DRF does not handle."""
    return JsonResponse(
        {"error": {"code": code, "message": message, "detail": None}}, status=status
    )


async def stream_caller(request: HttpRequest) -> User | None:
    """Who opens a stream: an API key's owner (Bearer) or the session's user; None if nobody."""
    header = request.headers.get("Authorization", "")
    scheme, _, raw_key = header.partition(" ")
    if scheme.lower() == "bearer" and raw_key.strip():
        key = await sync_to_async(api_key_authenticate)(raw_key=raw_key.strip())
        return key.user if key is not None else None
    user = await request.auser()
    return user if isinstance(user, User) and user.is_authenticated else None


def format_event(entry_id: str, event: str, data: str) -> bytes:
    # `id:` goes last: a connection cut inside an event then leaves the client no id of an
    # event it never got (some EventSource implementations keep a half-read event's id).
    return f"event: {event}\ndata: {data}\nid: {entry_id}\n\n".encode()


async def generation_stream(
    request: HttpRequest, generation_id: UUID
) -> HttpResponse | StreamingHttpResponse:
    if request.method != "GET":
        return error_response(405, "method_not_allowed", "Only GET is allowed here.")
    user = await stream_caller(request)
    if user is None:
        return error_response(401, "not_authenticated", "Log in or send an API key.")
    try:
        generation = await sync_to_async(selectors.generation_for_user)(
            user=user, generation_id=generation_id
        )
    except NotFound as exc:
        return error_response(404, exc.code, exc.message)

    last_id = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0-0"
    if not EVENT_ID.match(last_id):
        return error_response(400, "invalid_last_event_id", "Last-Event-ID is not an event id.")

    # The blocking read outlasts redis-py's default socket timeout unless told otherwise.
    redis = queue.async_redis(socket_timeout=settings.STREAM_HEARTBEAT_SECONDS + 10)
    if not await redis.exists(queue.stream_key(generation.id)):
        await redis.aclose()
        body = await sync_to_async(_stored_events)(generation.id)
        return _sse_response(_once(body))
    return _sse_response(_tail(redis, generation, last_id))


def _sse_response(events: AsyncIterator[bytes]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _stored_events(generation_id: UUID) -> bytes:
    """The finished answer from Postgres, for a client that comes back after the stream."""
    generation = Generation.objects.select_related("message", "pool").get(pk=generation_id)
    message = generation.message
    out = format_event(
        "0-1",
        "meta",
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
        out += format_event(
            "0-2",
            "retract",
            json.dumps({"reason": "content_filter", "notice": settings.MODERATION_RETRACT_NOTICE}),
        )
    elif message.content:
        out += format_event("0-2", "delta", json.dumps({"text": message.content}))
    if generation.status in (Generation.Status.FAILED, Generation.Status.REJECTED):
        out += format_event(
            "0-3",
            "error",
            json.dumps({"code": generation.error_code, "message": generation.error_message}),
        )
    out += format_event(
        "0-4",
        "done",
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


async def _tail(redis: Any, generation: Generation, last_id: str) -> AsyncIterator[bytes]:
    gid = str(generation.id)
    stream = queue.stream_key(gid)
    watchers = queue.key("watchers", gid)
    heartbeat = settings.STREAM_HEARTBEAT_SECONDS
    finished = False
    # A stream may stay open for minutes; the database connection that this request's thread
    # opened (authentication, the lookup, middleware) must not stay open with it.
    await sync_to_async(connections.close_all)()
    await redis.incr(watchers)
    await redis.expire(watchers, settings.GENERATION_STREAM_TTL_SECONDS)
    await redis.hdel(queue.job_key(gid), "detached_ms")
    try:
        yield f"retry: {settings.STREAM_RETRY_MS}\n\n".encode()
        while True:
            try:
                batches = await redis.xread(
                    {stream: last_id}, count=READ_BATCH, block=heartbeat * 1000
                )
            except RedisError:
                # End the response: the client reconnects with Last-Event-ID and loses nothing.
                logger.warning("stream %s: Redis failed; ending the response", gid, exc_info=True)
                return
            if not batches:
                yield b": heartbeat\n\n"
                continue
            for entry_id, fields in batches[0][1]:
                last_id = entry_id
                event = fields.get("event", "message")
                yield format_event(entry_id, event, fields.get("data", "{}"))
                if event in TERMINAL_EVENTS:
                    finished = True
                    return
    finally:
        await asyncio.shield(_detach(redis, generation, watchers, finished))


async def _detach(redis: Any, generation: Generation, watchers: str, finished: bool) -> None:
    try:
        remaining = await redis.decr(watchers)
        if finished or remaining > 0:
            return
        job = queue.job_key(generation.id)
        if not await redis.hexists(job, "first_token_ms"):
            # The client left before the first token: stop now rather than spend a worker.
            await sync_to_async(services.generation_cancel)(generation=generation)
        else:
            # The scheduler cancels it if nobody re-attaches within the grace period.
            await redis.eval(queue.HSET_IF_EXISTS, 1, job, "detached_ms", queue.now_ms())
    except Exception:
        logger.exception("could not record the detach from generation %s", generation.id)
    finally:
        await redis.aclose()
