"""The `/v1` views: async, for the ASGI edge, so a streamed answer holds no thread and no
database connection while it lasts.

Authentication is the API key alone (`Authorization: Bearer csk_...`): a session cookie never
authenticates here, so there is no CSRF to check. The request is turned into a turn by
`conversations.turns.turn_from_messages` (the web chat's path), or `turns.turn_unkept` for a
key that keeps nothing (no row written), in one thread hop; then the
view tails the generation's Redis Stream, as the SSE stream view does, and answers in
OpenAI's shapes. A client that leaves before the end cancels its generation: vLLM aborts the
request, and the usage ledger charges what was produced until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from redis.exceptions import RedisError

from accounts.abuse import abuse_retry_after
from accounts.errors import ErrorCode as AccountsErrorCode
from accounts.models import ApiKey
from accounts.services import api_key_authenticate
from billing.middleware import headers_known
from billing.selectors import plan_for_user, pools_for_plan
from chatsite import sse
from chatsite.auth import bearer_token
from chatsite.errors import ServiceError
from chatsite.stream_events import StreamEvent
from chatsite.threads import in_thread
from conversations import turns
from inference import edge_relay
from inference.models import Generation
from inference.services import generation_cancel, generation_cancel_unkept

from . import shapes
from .errors import OpenAIError, from_generation_error, from_service_error
from .parsing import ChatCompletionRequest, parse_chat_completion

logger = logging.getLogger(__name__)


async def _authenticate(request: HttpRequest) -> ApiKey:
    return await in_thread(_authenticated_key, request)


def _authenticated_key(request: HttpRequest) -> ApiKey:
    raw_key = bearer_token(request)
    # Whatever the session says, this API answers to keys only; the rate-limit headers
    # then describe the key's owner.
    request.user = AnonymousUser()
    if not raw_key:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer csk_...'.",
            code="missing_api_key",
        )
    key = api_key_authenticate(raw_key=raw_key)
    if key is None:
        raise OpenAIError(401, "Incorrect or revoked API key provided.", code="invalid_api_key")
    request.user = key.user
    return key


def _method_not_allowed(allowed: str) -> JsonResponse:
    response = OpenAIError(
        405, f"Only {allowed} is allowed here.", code="method_not_allowed"
    ).response()
    response["Allow"] = allowed
    return response


# GET /v1/models and /v1/models/<id>


def _pools(key: ApiKey) -> list[dict[str, Any]]:
    pools = pools_for_plan(plan=plan_for_user(user=key.user))
    listed = [shapes.model_object(pool) for pool in pools]
    small = next((pool for pool in pools if pool.name == settings.AUTO_MODEL_SMALL), None)
    if settings.AUTO_MODEL and small is not None:
        # Each answer by the small or the large pool; the answer's `model` names the one.
        listed.append({**shapes.model_object(small), "id": settings.AUTO_MODEL})
    return listed


@csrf_exempt
async def model_list(request: HttpRequest) -> HttpResponse:
    """The models the key's plan may use."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        key = await _authenticate(request)
    except OpenAIError as exc:
        return exc.response()
    data = await sync_to_async(_pools)(key)
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
async def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    """One model, if the key's plan may use it; 404 otherwise, as for a model never served."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        key = await _authenticate(request)
    except OpenAIError as exc:
        return exc.response()
    for entry in await sync_to_async(_pools)(key):
        if entry["id"] == model_id:
            return JsonResponse(entry)
    return OpenAIError(
        404,
        f"The model {model_id!r} does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    ).response()


# POST /v1/chat/completions


@dataclass(frozen=True)
class _Started:
    """A queued answer and what the view needs to follow it."""

    generation_id: str
    conversation_id: Any  # None for a key that keeps nothing
    model: str
    created: int
    user_id: int = 0
    # This request reads the answer from the worker itself (inference/relay.py), with the
    # prompt as the worker is asked it.
    relay: bool = False
    messages: list[dict[str, Any]] | None = None


def _start(key: ApiKey, wanted: ChatCompletionRequest, idempotency_key: str | None) -> _Started:
    arguments: dict[str, Any] = {
        "user": key.user,
        "model": wanted.model,
        "system_prompt": wanted.system_prompt,
        "messages": wanted.messages,
        "max_tokens": wanted.max_tokens,
        "params": wanted.sampling,
        "tools": wanted.tools,
        "tool_choice": wanted.tool_choice,
        "idempotency_key": idempotency_key,
    }
    if key.store_conversations:
        turn = turns.turn_from_messages(**arguments)
        generation = turn.generation
        started = _Started(
            generation_id=str(generation.pk),
            conversation_id=turn.conversation.pk,
            model=generation.pool.name,
            created=int(generation.enqueued_at.timestamp()),
        )
    else:
        # Nothing is written: the answer lives in Redis until its end (inference/unkept.py),
        # and, without tools, this edge reads it from the worker (inference/relay.py).
        unkept = turns.turn_unkept(**arguments, relay=settings.INFERENCE_DIRECT_RELAY)
        started = _Started(
            str(unkept.generation.id),
            None,
            unkept.generation.pool.name,
            int(time.time()),
            user_id=key.user.pk,
            relay=unkept.relay,
            messages=unkept.messages,
        )
    # The answer may take minutes: a connection this request opened must not wait with it.
    connections.close_all()
    return started


def _accept(request: HttpRequest) -> tuple[ChatCompletionRequest, _Started]:
    """Everything before the answer, in one thread hop: the client's limit, the key, the
    request, the turn; for a stream also the rate-limit headers, which go out before it."""
    # Per client IP, before any key lookup: the web chat's limit on message POSTs.
    retry_after = abuse_retry_after(request, "message_post")
    if retry_after is not None:
        raise OpenAIError(
            429,
            "Too many requests from your network; please wait before trying again.",
            code=AccountsErrorCode.RATE_LIMITED,
            retry_after=retry_after,
        )
    key = _authenticated_key(request)
    wanted = parse_chat_completion(request.body)
    started = _start(key, wanted, request.headers.get("Idempotency-Key"))
    if wanted.stream:
        # A whole answer's headers are read after it, with its usage settled.
        headers_known(request, user=key.user)
    return wanted, started


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Answer a chat, whole (`chat.completion`) or streamed (`chat.completion.chunk`s)."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        wanted, started = await in_thread(_accept, request)
    except OpenAIError as exc:
        return exc.response()
    except ServiceError as exc:
        return from_service_error(exc).response()

    redis = sse.stream_redis()
    if wanted.stream:
        response: HttpResponse | StreamingHttpResponse = sse.sse_response(
            _streamed(redis, started, wanted)
        )
    else:
        response = await _whole(redis, started)
    response["x-request-id"] = shapes.completion_id(started.generation_id)
    if started.conversation_id is not None:
        response["x-chatsite-conversation-id"] = str(started.conversation_id)
    return response


def _events(started: _Started) -> AsyncGenerator[edge_relay.Item, None]:
    """The generation's events (name, payload) from the first, then live, until `done`; None
    after each heartbeat period in which nothing happened. A relayed answer's text comes
    from the worker (`edge_relay.follow`)."""
    return edge_relay.follow(
        started.generation_id,
        user_id=started.user_id,
        relay=started.relay,
        messages=started.messages,
    )


def _failure(answer: shapes.Answer) -> OpenAIError | None:
    """The error a finished answer ends in, if it ended in one."""
    if answer.error is not None:
        return from_generation_error(*answer.error)
    if answer.status == "cancelled" and not answer.retracted:
        return OpenAIError(500, "The answer was cancelled.", code="generation_cancelled")
    return None


async def _whole(redis: Any, started: _Started) -> HttpResponse:
    answer = shapes.Answer()
    try:
        async with contextlib.aclosing(_events(started)) as events:
            async for item in events:
                if item is not None:
                    answer.apply(*item)
                if answer.done:
                    break
    except RedisError:
        logger.warning("generation %s: Redis failed", started.generation_id, exc_info=True)
    finally:
        await asyncio.shield(_after(redis, started, finished=answer.done))
    if not answer.done:
        return OpenAIError(
            503, "The service lost track of the answer; try again.", code="stream_lost"
        ).response()
    failure = _failure(answer)
    if failure is not None:
        return failure.response()
    return JsonResponse(
        shapes.completion(
            generation_id=started.generation_id,
            created=started.created,
            model=started.model,
            answer=answer,
        )
    )


async def _streamed(
    redis: Any, started: _Started, wanted: ChatCompletionRequest
) -> AsyncIterator[bytes]:
    chunks = shapes.Chunks(
        generation_id=started.generation_id,
        created=started.created,
        model=started.model,
        include_usage=wanted.include_usage,
    )
    answer = shapes.Answer()
    sent = closed = False
    try:
        yield chunks.role()
        async with contextlib.aclosing(_events(started)) as events:
            async for item in events:
                if item is None:
                    yield sse.HEARTBEAT
                    continue
                event, payload = item
                if event == StreamEvent.RESTART and sent:
                    # The text already sent cannot be taken back: end with an error rather
                    # than splice a second answer onto the first (the generation is then
                    # cancelled as for a client that left).
                    yield shapes.sse(
                        OpenAIError(
                            500,
                            "The model worker failed mid-answer; try again.",
                            code="worker_restarted",
                        ).body()
                    )
                    return
                text = answer.apply(event, payload)
                if text:
                    sent = True
                    yield chunks.content(text)
                if answer.done:
                    break
        if not answer.done:
            return
        closed = True
        await asyncio.shield(_after(redis, started, finished=True))
        failure = _failure(answer)
        if failure is not None:
            yield shapes.sse(failure.body())
            return
        # The scheduler hands the calls over just before the end: sent whole, at the end,
        # so that calls withdrawn by moderation never reach the client.
        for chunk in chunks.tool_calls(answer.tool_calls):
            yield chunk
        yield chunks.finish(answer.finish_reason or "stop")
        if wanted.include_usage:
            yield chunks.usage(answer)
        yield shapes.DONE
    except RedisError:
        logger.warning("generation %s: Redis failed", started.generation_id, exc_info=True)
    finally:
        if not closed:
            await asyncio.shield(_after(redis, started, finished=answer.done))


async def _after(redis: Any, started: _Started, *, finished: bool) -> None:
    """The request is over: cancel an answer nobody waits for any more."""
    try:
        if not finished:
            await sync_to_async(_cancel)(started)
    except Exception:
        logger.exception("could not close generation %s", started.generation_id)
    finally:
        await redis.aclose()


def _cancel(started: _Started) -> None:
    try:
        if started.conversation_id is None:
            generation_cancel_unkept(generation_id=started.generation_id)
        else:
            generation_cancel(generation=Generation.objects.get(pk=started.generation_id))
    finally:
        connections.close_all()
