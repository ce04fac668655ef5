"""Simulated users of the service, behaving as its clients do when something fails.

- The conversation API: `POST /api/v1/conversations/<id>/messages` with an Idempotency-Key,
  retried on the other edge when the connection drops or the edge answers 5xx (or 409 while
  the first try is still in flight); then the answer's Server-Sent Events, resumed with
  `Last-Event-ID` on the other edge whenever the connection drops or the stream ends early.
  A `restart` event voids the text so far, as the page does.
- `/v1/chat/completions`, streamed or whole: one request with an Idempotency-Key; a dropped
  connection or a 5xx is retried with the same key on the other edge, which replays the same
  answer from its start (OpenAI's protocol has no resume).

Each send is one `Answer`: what the client was told and saw. Whoever runs the traffic checks
it against the database afterwards (`check_answers`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

# A retry waits this long at first, doubling up to RETRY_MAX_SECONDS.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 1.0
FINAL = ("complete", "failed", "cancelled", "rejected")


@dataclass
class Answer:
    """One send and what became of it, as the client saw it."""

    door: str  # conversations, v1-stream, v1
    client: int
    content: str
    sent_at: float
    posted: bool = False  # the service said it took the message (201 / 200)
    refused: str = ""  # why the send failed in the end, if it did
    conversation_id: str = ""
    message_id: str = ""
    generation_id: str = ""
    text: str = ""
    status: str = ""  # the final status the client was told (empty: none within the deadline)
    error: str = ""  # the error code the client was shown
    restarts: int = 0
    drops: int = 0  # connections that ended before the answer did
    post_tries: int = 0
    edges: list[int] = field(default_factory=list)  # the edge of each request, in order
    first_token_at: float | None = None
    ended_at: float | None = None
    http_errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Retry(Exception):
    """The edge could not serve the request now: try again (on the other edge)."""


class Edges:
    """The edges' clients, and which edge each simulated user talks to now."""

    def __init__(self, urls: Sequence[str], *, read_timeout: float = 20.0) -> None:
        timeout = httpx.Timeout(connect=3.0, read=read_timeout, write=10.0, pool=30.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.clients = [httpx.AsyncClient(base_url=u, timeout=timeout, limits=limits) for u in urls]
        self.current: dict[int, int] = {}

    def of(self, client: int) -> int:
        return self.current.setdefault(client, client % len(self.clients))

    def switch(self, client: int) -> int:
        self.current[client] = (self.of(client) + 1) % len(self.clients)
        return self.current[client]

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


def _backoff(attempt: int) -> float:
    return float(min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2**attempt))


def _auth(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"].get("code") or response.status_code)
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(response.status_code)


def _retryable(status: int) -> bool:
    # 409: the first try with this Idempotency-Key is still in flight; 5xx: the edge or a
    # store behind it failed; 429 only for abuse limits, which the benchmarks lift.
    return status >= 500 or status == 409


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, str, str]]:
    """(id, event, data) per complete Server-Sent Event; comments (heartbeats) skipped."""
    event_id, event = "", "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event_id, event, "\n".join(data)
            event_id, event, data = "", "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value


async def create_conversation(edges: Edges, client: int, key: str, *, until: float) -> str | None:
    """A new conversation, retried across edges until `until` (loop time); None if none."""
    loop = asyncio.get_running_loop()
    attempt = 0
    while loop.time() < until:
        edge = edges.of(client)
        try:
            response = await edges.clients[edge].post(
                "/api/v1/conversations", json={}, headers=_auth(key)
            )
            if response.status_code == 201:
                return str(response.json()["id"])
            if not _retryable(response.status_code):
                return None
        except httpx.HTTPError:
            pass
        edges.switch(client)
        await asyncio.sleep(_backoff(attempt))
        attempt += 1
    return None


async def conversation_turn(
    edges: Edges, client: int, key: str, conversation_id: str, content: str, *, until: float
) -> Answer:
    """Send `content` into the conversation and follow its answer to the end, or to `until`
    (loop time)."""
    loop = asyncio.get_running_loop()
    answer = Answer("conversations", client, content, sent_at=time.time())
    answer.conversation_id = conversation_id
    idempotency = str(uuid.uuid4())
    attempt = 0
    while True:
        if loop.time() >= until:
            answer.refused = answer.refused or "no answer to the send within the deadline"
            return answer
        edge = edges.of(client)
        answer.edges.append(edge)
        answer.post_tries += 1
        try:
            response = await edges.clients[edge].post(
                f"/api/v1/conversations/{conversation_id}/messages",
                json={"content": content},
                headers=_auth(key, **{"Idempotency-Key": idempotency}),
            )
            if response.status_code == 201:
                body = response.json()
                answer.posted = True
                answer.message_id = str(body["user_message"]["id"])
                answer.generation_id = str(body["generation"]["id"])
                break
            answer.http_errors.append(f"POST {response.status_code} {_error_code(response)}")
            if not _retryable(response.status_code):
                answer.refused = answer.http_errors[-1]
                return answer
        except httpx.HTTPError as exc:
            answer.http_errors.append(f"POST {type(exc).__name__}")
        edges.switch(client)
        await asyncio.sleep(_backoff(attempt))
        attempt += 1
    await _follow(edges, client, key, answer, until=until)
    return answer


async def _follow(edges: Edges, client: int, key: str, answer: Answer, *, until: float) -> None:
    """The answer's events to `done`, resumed after each drop with Last-Event-ID."""
    loop = asyncio.get_running_loop()
    url = f"/api/v1/generations/{answer.generation_id}/stream"
    last_id = ""
    attempt = 0
    while loop.time() < until:
        edge = edges.of(client)
        answer.edges.append(edge)
        headers = _auth(key, **({"Last-Event-ID": last_id} if last_id else {}))
        try:
            async with asyncio.timeout_at(until):
                async with edges.clients[edge].stream("GET", url, headers=headers) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise _Retry(f"GET {response.status_code} {_error_code(response)}")
                    async for event_id, event, data in sse(response):
                        last_id = event_id or last_id
                        if _apply(answer, event, data):
                            answer.ended_at = time.time()
                            return
                        attempt = 0
            answer.http_errors.append("GET ended before done")
        except TimeoutError:
            return
        except (httpx.HTTPError, _Retry) as exc:
            answer.http_errors.append(str(exc) if isinstance(exc, _Retry) else type(exc).__name__)
        answer.drops += 1
        edges.switch(client)
        await asyncio.sleep(_backoff(attempt))
        attempt += 1


def _apply(answer: Answer, event: str, data: str) -> bool:
    """One stream event into the answer; True once it is the last (`done`)."""
    payload = json.loads(data) if data else {}
    if event == "delta":
        if answer.first_token_at is None:
            answer.first_token_at = time.time()
        answer.text += payload.get("text", "")
    elif event == "restart":
        answer.restarts += 1
        answer.text = ""
    elif event == "retract":
        answer.text = ""
    elif event == "error":
        answer.error = str(payload.get("code") or "error")
    elif event == "done":
        answer.status = str(payload.get("status") or "")
        return True
    return False


async def v1_turn(
    edges: Edges,
    client: int,
    key: str,
    model: str,
    content: str,
    *,
    stream: bool,
    max_tokens: int,
    until: float,
) -> Answer:
    """One `/v1/chat/completions` request, retried with its Idempotency-Key after a drop."""
    loop = asyncio.get_running_loop()
    answer = Answer("v1-stream" if stream else "v1", client, content, sent_at=time.time())
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": max_tokens,
    }
    headers = _auth(key, **{"Idempotency-Key": str(uuid.uuid4())})
    attempt = 0
    while loop.time() < until:
        edge = edges.of(client)
        answer.edges.append(edge)
        answer.post_tries += 1
        try:
            async with asyncio.timeout_at(until):
                if stream:
                    if await _v1_stream(edges.clients[edge], body, headers, answer):
                        return answer
                else:
                    if await _v1_whole(edges.clients[edge], body, headers, answer):
                        return answer
        except TimeoutError:
            break
        except (httpx.HTTPError, _Retry) as exc:
            answer.http_errors.append(str(exc) if isinstance(exc, _Retry) else type(exc).__name__)
        if answer.posted:
            answer.drops += 1
        edges.switch(client)
        await asyncio.sleep(_backoff(attempt))
        attempt += 1
    if not answer.posted:
        answer.refused = answer.refused or "no answer to the request within the deadline"
    return answer


def _took(answer: Answer, response: httpx.Response) -> None:
    answer.posted = True
    answer.conversation_id = response.headers.get("x-chatsite-conversation-id", "")
    answer.generation_id = response.headers.get("x-request-id", "").removeprefix("chatcmpl-")


def _refuse(answer: Answer, response: httpx.Response) -> bool:
    """For a response that is not 200: raise _Retry if it is worth another try, else record
    the refusal (True: the request is over)."""
    code = _error_code(response)
    if _retryable(response.status_code):
        raise _Retry(f"POST {response.status_code} {code}")
    answer.http_errors.append(f"POST {response.status_code} {code}")
    if answer.posted:
        answer.status, answer.error = "failed", code
    else:
        answer.refused = f"POST {response.status_code} {code}"
    answer.ended_at = time.time()
    return True


async def _v1_stream(
    http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], answer: Answer
) -> bool:
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return _refuse(answer, response)
        _took(answer, response)
        answer.text = ""  # a replay starts from the first token again
        finish = ""
        async for _, _, data in sse(response):
            if data == "[DONE]":
                answer.status = "complete" if finish else "failed"
                answer.ended_at = time.time()
                return True
            chunk = json.loads(data)
            if "error" in chunk:
                answer.status = "failed"
                answer.error = str(chunk["error"].get("code") or "error")
                answer.ended_at = time.time()
                return True
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text and answer.first_token_at is None:
                    answer.first_token_at = time.time()
                answer.text += text
                finish = choice.get("finish_reason") or finish
    raise _Retry("stream ended before [DONE]")


async def _v1_whole(
    http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], answer: Answer
) -> bool:
    response = await http.post("/v1/chat/completions", json=body, headers=headers)
    if response.status_code != 200:
        return _refuse(answer, response)
    _took(answer, response)
    completion = response.json()
    answer.text = completion["choices"][0]["message"].get("content") or ""
    answer.status = "complete"
    answer.ended_at = time.time()
    return True


# Against the database


@dataclass
class Verdict:
    """What became of one answer, judged from the client's view and the database."""

    completed: bool = False
    restarted: bool = False
    failed: bool = False  # the client was shown a failure (or its send was refused)
    stuck: bool = False  # no final state within the deadline (client or database)
    lost: bool = False  # the service took the message, the database does not have it
    duplicated: bool = False  # the message is in the database more than once
    charged_twice: bool = False
    uncharged: bool = False  # a final answer that used tokens, without a ledger row
    mismatch: bool = False  # complete, but the text streamed is not the text stored
    db_status: str = ""
    db_error: str = ""


def check_answers(answers: Sequence[Answer]) -> list[Verdict]:
    """Each answer against Postgres: its user message, its generation, its ledger rows."""
    from django.db import connections
    from django.db.models import Count

    from billing.models import UsageEvent
    from conversations.models import Message
    from inference.models import Generation

    connections.close_all()
    contents = [answer.content for answer in answers]
    stored = dict(
        Message.objects.filter(role=Message.Role.USER, content__in=contents)
        .values_list("content")
        .annotate(n=Count("id"))
    )
    ids = [uuid.UUID(a.generation_id) for a in answers if a.generation_id]
    generations = {
        str(g.pk): g for g in Generation.objects.filter(pk__in=ids).select_related("message")
    }
    ledger = dict(
        UsageEvent.objects.filter(generation_id__in=ids)
        .values_list("generation_id")
        .annotate(n=Count("id"))
    )
    verdicts = []
    for answer in answers:
        verdict = Verdict(restarted=answer.restarts > 0)
        copies = stored.get(answer.content, 0)
        verdict.lost = answer.posted and copies == 0
        verdict.duplicated = copies > 1
        generation = generations.get(answer.generation_id)
        if generation is not None:
            verdict.db_status = generation.status
            verdict.db_error = generation.error_code or ""
            rows = ledger.get(generation.pk, 0)
            verdict.charged_twice = rows > 1
            used = (generation.output_tokens or 0) + (generation.prompt_tokens or 0)
            verdict.uncharged = generation.is_final and used > 0 and rows == 0
        db_final = generation is not None and generation.is_final
        if answer.refused:
            verdict.failed = True
        elif not answer.status or (answer.posted and not db_final):
            verdict.stuck = True
        elif answer.status == "complete" and not answer.error:
            verdict.completed = True
            if generation is not None and answer.text != generation.message.content:
                verdict.mismatch = True
        else:
            verdict.failed = True
        verdicts.append(verdict)
    connections.close_all()
    return verdicts
