"""OpenAI's answer objects (`chat.completion`, `chat.completion.chunk`, `model`) built from a
generation and the events of its Redis Stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from msgspec.json import encode as encode_json

from chatsite.stream_events import StreamEvent
from inference.models import ModelPool

# What OpenAI's clients know; the scheduler's own reasons map onto them.
FINISH_REASONS = frozenset({"stop", "length", "content_filter", "tool_calls"})
OWNER = "chatsite"


def model_object(pool: ModelPool) -> dict[str, Any]:
    return {
        "id": pool.name,
        "object": "model",
        "created": int(pool.created_at.timestamp()),
        "owned_by": OWNER,
    }


def completion_id(generation_id: Any) -> str:
    return f"chatcmpl-{generation_id}"


@dataclass
class Answer:
    """A generation followed through its stream events: the text so far and how it ended."""

    text: str = ""
    done: bool = False
    retracted: bool = False
    restarted: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of the prompt, what the worker read from its prefix cache (None: it did not say).
    cached_tokens: int | None = None
    # (code, message) of an `error` event: the generation failed or was rejected.
    error: tuple[str, str] | None = None
    status: str = ""
    # The calls the answer ended with (a `tool_calls` event), for the client to run.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, event: str, data: dict[str, Any]) -> str:
        """Take one stream event; returns the new text it adds (empty for most events)."""
        if event == StreamEvent.DELTA and not self.retracted:
            text = str(data.get("text") or "")
            self.text += text
            return text
        if event == StreamEvent.RESTART:
            # The worker failed and another one starts over: what came before is void.
            self.text = ""
            self.tool_calls = []
            self.restarted = True
        elif event == StreamEvent.RETRACT:
            # Output moderation stopped the answer: its text is withdrawn.
            self.retracted = True
            self.text = ""
        elif event == StreamEvent.TOOL_CALLS and not self.retracted:
            self.tool_calls = list(data.get("tool_calls") or [])
        elif event == StreamEvent.ERROR:
            self.error = (str(data.get("code") or ""), str(data.get("message") or ""))
        elif event == StreamEvent.DONE:
            self.done = True
            self.status = str(data.get("status") or "")
            self.prompt_tokens = int(data.get("prompt_tokens") or 0)
            self.completion_tokens = int(data.get("output_tokens") or 0)
            cached = data.get("cached_tokens")
            self.cached_tokens = int(cached) if cached is not None else None
            reason = str(data.get("finish_reason") or "")
            if self.retracted:
                reason = "content_filter"
            self.finish_reason = reason if reason in FINISH_REASONS else "stop"
            if self.finish_reason != "tool_calls":
                self.tool_calls = []
            elif not self.tool_calls:
                self.finish_reason = "stop"
        return ""

    def message(self) -> dict[str, Any]:
        """The answer as OpenAI's assistant message: its text, or its calls (and any text
        the model wrote before them)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.tool_calls:
            message["content"] = self.text or None
            message["tool_calls"] = self.tool_calls
        return message

    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens is not None:
            # OpenAI's place for it: what the prompt cache saved.
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


def completion(*, generation_id: Any, created: int, model: str, answer: Answer) -> dict[str, Any]:
    """The `chat.completion` of a finished answer."""
    return {
        "id": completion_id(generation_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": answer.message(),
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": answer.usage(),
    }


@dataclass(frozen=True)
class Chunks:
    """Builds the `chat.completion.chunk` events of one streamed answer.

    A text chunk is most of them (one per event of the answer's stream): it is the same bytes
    around its text, encoded once (`_content_around`), so that each costs the encoding of its
    text alone."""

    generation_id: Any
    created: int
    model: str
    include_usage: bool

    @cached_property
    def _content_around(self) -> tuple[bytes, bytes]:
        marker = "\x00content\x00"
        whole = self._chunk([self._choice({"content": marker})])
        before, _, after = whole.partition(encode_json(marker))
        return before, after

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id(self.generation_id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        body.update(extra)
        return sse(body)

    def _choice(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def role(self) -> bytes:
        return self._chunk([self._choice({"role": "assistant", "content": ""})])

    def content(self, text: str) -> bytes:
        before, after = self._content_around
        return before + encode_json(text) + after

    def tool_calls(self, calls: list[dict[str, Any]]) -> list[bytes]:
        """The chunks of the answer's calls, as OpenAI streams them: each call's id, type
        and name first, then its arguments."""
        chunks = []
        for index, call in enumerate(calls):
            function = call.get("function") or {}
            head = {
                "index": index,
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function.get("name"), "arguments": ""},
            }
            body = {"index": index, "function": {"arguments": function.get("arguments") or ""}}
            chunks.append(self._chunk([self._choice({"tool_calls": [head]})]))
            chunks.append(self._chunk([self._choice({"tool_calls": [body]})]))
        return chunks

    def finish(self, finish_reason: str) -> bytes:
        return self._chunk([self._choice({}, finish_reason)])

    def usage(self, answer: Answer) -> bytes:
        return self._chunk([], usage=answer.usage())


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"
