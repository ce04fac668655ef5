"""An emulated vLLM worker's HTTP surface, as the scheduler and the peer routers use it.

`POST /v1/chat/completions` and `/v1/completions` (whole or streamed, `stream_options.
include_usage`, `priority`, `usage.prompt_tokens_details.cached_tokens`; a client that leaves
aborts its request), `GET /health`, `GET /v1/models`, `POST /reset_prefix_cache` and
`GET /metrics` with vLLM's metric names; and one route vLLM lacks, `GET /kv_cache`: what the
cache truly holds (each cached block's hash, its parent's and its token ids), for a benchmark
to compare a router's index with (`router_race.py`). Prompts are rendered with the pool's chat
template and tokenized with its tokenizer, as the worker would (`inference.prompts`), so
prefix-cache hits fall where a real worker's would. The answer is made of words that are one
token each, so that re-reading the text gives the same tokens (the scheduler's index does that).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from .engine import CacheFull, Engine

TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)

# Words a BPE tokenizer is likely to keep as one token with their leading space.
_WORDS_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "what more if no out so said can who will up other about into than them time only new "
    "some could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still"
)
WORDS = tuple(_WORDS_TEXT.split())

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


class Tokens:
    """Prompts tokenized as the worker would; answers of one-token words."""

    def __init__(self, folder: str) -> None:
        from inference import prompts
        from inference.tokens import load_tokenizer

        self.folder = folder
        self._prompts = prompts
        self.tokenizer = load_tokenizer(folder)
        self.vocabulary: list[tuple[int, str]] = []
        for word in WORDS:
            ids = self.tokenizer.encode(" " + word, add_special_tokens=False).ids
            if len(ids) == 1:
                self.vocabulary.append((ids[0], " " + word))
        if not self.vocabulary:
            raise ValueError(f"no one-token words in {folder}'s tokenizer")
        self.text_of = dict(self.vocabulary)

    def chat(self, messages: Sequence[dict[str, Any]], tools: Any) -> list[int]:
        return self._prompts.token_ids(self.folder, messages, tools=tools or None)

    def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(token) for token in prompt]
        return list(self.tokenizer.encode(prompt, add_special_tokens=True).ids)

    def answer(self, prompt: Sequence[int], length: int) -> list[int]:
        """The same answer for the same prompt (as at temperature 0)."""
        rng = random.Random(hash(tuple(prompt[-256:])))
        return [rng.choice(self.vocabulary)[0] for _ in range(length)]


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(total)}')
        out.append(f"{name}_count{{{labels}}} {float(total)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


@dataclass(frozen=True)
class Wanted:
    """A request as read: its prompt, the answer it will get, and how."""

    prompt: list[int]
    output: list[int]
    stream: bool
    include_usage: bool
    priority: int


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Worker:
    """One emulated worker: its engine and its HTTP application."""

    engine: Engine
    tokens: Tokens
    served_model: str
    max_model_len: int = 8192
    default_max_tokens: int = 256
    stream_interval: int = 1
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    prefill_time: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat_completions),
                web.post("/v1/completions", self.completions),
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
                web.post("/reset_prefix_cache", self.reset_prefix_cache),
                web.get("/metrics", self.metrics),
                web.get("/kv_cache", self.kv_cache),
            ]
        )
        return app

    # Routes

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.served_model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.served_model,
            "max_model_len": self.max_model_len,
        }
        return _json_response({"object": "list", "data": [model]})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if self.engine.reset_prefix_cache():
            return web.Response(status=200)
        return _error(503, "The prefix cache is in use; try again when the worker is idle.")

    async def kv_cache(self, request: web.Request) -> web.Response:
        pool = self.engine.pool
        blocks = [
            [block_hash, parent, tokens] for block_hash, (parent, tokens) in pool.lineage.items()
        ]
        return _json_response({"block_size": pool.block_size, "blocks": blocks})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    # Serving a request

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = _decode.decode(await request.read())
            if not isinstance(body, dict):
                raise BadRequest("The request body must be a JSON object.")
            wanted = self._read(body, chat=chat)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.")
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        answer = Answer(chat=chat, model=self.served_model, request_id=_request_id(request, chat))
        queue: asyncio.Queue[tuple[list[int], bool]] = asyncio.Queue()
        started = time.monotonic()
        try:
            job = self.engine.add(
                answer.request_id,
                wanted.prompt,
                wanted.output,
                lambda ids, done: queue.put_nowait((ids, done)),
                priority=wanted.priority,
            )
        except CacheFull as exc:
            return _error(400, str(exc))
        try:
            if wanted.stream:
                return await self._stream(
                    request, answer, job, queue, wanted.include_usage, started
                )
            ids: list[int] = []
            done = False
            while not done:
                more, done = await queue.get()
                if not ids:
                    self.ttft.observe(time.monotonic() - started)
                ids += more
            self._finished(job, started)
            text = "".join(self.tokens.text_of[token] for token in ids)
            return _json_response(
                answer.whole(text, len(wanted.prompt), len(ids), job.cached_tokens)
            )
        finally:
            # A client gone (the handler cancelled) aborts the request, as vLLM does.
            self.engine.abort(job)

    def _read(self, body: dict[str, Any], *, chat: bool) -> Wanted:
        if body.get("model") not in (None, self.served_model):
            raise BadRequest(f"The model `{body.get('model')}` does not exist.", status=404)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list.")
            try:
                prompt = self.tokens.chat(messages, body.get("tools"))
            except Exception as exc:  # the template refused them, as vLLM would
                raise BadRequest(f"The messages could not be rendered: {exc}") from exc
        else:
            text = body.get("prompt")
            ids = isinstance(text, list) and all(
                isinstance(token, int) and not isinstance(token, bool) and token >= 0
                for token in text
            )
            if not text or not (isinstance(text, str) or ids):
                raise BadRequest("prompt must be a non-empty string or a list of token ids.")
            prompt = self.tokens.completion(text)
        room = self.max_model_len - len(prompt)
        if room <= 0:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {len(prompt)} input tokens."
            )
        length = body.get("max_completion_tokens") or body.get("max_tokens")
        if length is None:
            length = min(self.default_max_tokens, room)
        if not isinstance(length, int) or length < 1:
            raise BadRequest("max_tokens must be a positive integer.")
        if length > room:
            raise BadRequest(
                f"max_tokens is too large: {length}. This model's maximum context length is "
                f"{self.max_model_len} tokens and your request has {len(prompt)} input tokens."
            )
        try:
            priority = int(body.get("priority") or 0)
        except (TypeError, ValueError):
            raise BadRequest("priority must be an integer.") from None
        options = body.get("stream_options") or {}
        return Wanted(
            prompt=prompt,
            output=self.tokens.answer(prompt, length),
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            priority=priority,
        )

    async def _stream(
        self,
        request: web.Request,
        answer: Answer,
        job: Any,
        queue: asyncio.Queue[tuple[list[int], bool]],
        include_usage: bool,
        started: float,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if answer.chat:
            await response.write(answer.sse(answer.chunk({"role": "assistant", "content": ""})))
        pending: list[int] = []
        produced = 0
        done = False
        while not done:
            ids, done = await queue.get()
            if not produced:
                self.ttft.observe(time.monotonic() - started)
            produced += len(ids)
            pending += ids
            if len(pending) < self.stream_interval and not done:
                continue
            text = "".join(self.tokens.text_of[token] for token in pending)
            pending = []
            await response.write(answer.sse(answer.piece(text)))
        self._finished(job, started)
        await response.write(answer.sse(answer.piece("", finish_reason="length")))
        if include_usage:
            usage = _usage(len(job.prompt), produced, job.cached_tokens)
            await response.write(answer.sse(answer.chunk(None, usage=usage)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # Metrics

    def _finished(self, job: Any, started: float) -> None:
        """An answer is whole: its latencies, as vLLM's histograms count them."""
        self.e2e.observe(time.monotonic() - started)
        if job.scheduled_at:
            self.queue_time.observe(job.scheduled_at - job.added_at)
            if job.first_token_at:
                self.prefill_time.observe(job.first_token_at - job.scheduled_at)

    def metrics_text(self, process_cpu: Callable[[], float] = time.process_time) -> str:
        engine, counters = self.engine, self.engine.counters
        labels = f'engine="0",model_name="{self.served_model}"'
        profile = engine.profile
        lines = [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{profile.block_size}",enable_prefix_caching='
            f'"True",engine="0",num_gpu_blocks="{profile.num_blocks}"}} 1.0',
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(len(engine.running))}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(len(engine.waiting))}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {engine.kv_usage}",
        ]
        for family, value in (
            ("vllm:prefix_cache_queries", counters.prefix_queries),
            ("vllm:prefix_cache_hits", counters.prefix_hits),
            ("vllm:prompt_tokens", counters.prompt_tokens),
            ("vllm:generation_tokens", counters.generation_tokens),
            ("vllm:num_preemptions", counters.preemptions),
        ):
            lines += [f"# TYPE {family} counter", f"{family}_total{{{labels}}} {float(value)}"]
        lines.append("# TYPE vllm:request_success counter")
        for reason, count in sorted(counters.finished.items()):
            lines.append(
                f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(count)}'
            )
        lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
        lines += self.ttft.lines("vllm:time_to_first_token_seconds", labels)
        lines.append("# TYPE vllm:e2e_request_latency_seconds histogram")
        lines += self.e2e.lines("vllm:e2e_request_latency_seconds", labels)
        lines.append("# TYPE vllm:request_queue_time_seconds histogram")
        lines += self.queue_time.lines("vllm:request_queue_time_seconds", labels)
        lines.append("# TYPE vllm:request_prefill_time_seconds histogram")
        lines += self.prefill_time.lines("vllm:request_prefill_time_seconds", labels)
        # The emulator's own process (every worker it hosts reports the same one).
        lines += [
            "# TYPE process_cpu_seconds_total counter",
            f"process_cpu_seconds_total {process_cpu()}",
            "# TYPE emulator_busy_seconds counter",
            f"emulator_busy_seconds_total{{{labels}}} {counters.busy_seconds}",
        ]
        return "\n".join(lines) + "\n"

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")


@dataclass
class Answer:
    """One answer's shapes, as vLLM's OpenAI server writes them."""

    chat: bool
    model: str
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(
        self, delta: dict[str, Any] | None, *, usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
        }
        if delta is not None:
            data["choices"] = [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            ]
        if usage is not None:
            data["usage"] = usage
        return data

    def piece(self, text: str, *, finish_reason: str | None = None) -> dict[str, Any]:
        if self.chat:
            data = self.chunk({"content": text} if text else {})
        else:
            data = self.chunk(None)
            data["choices"] = [{"index": 0, "text": text, "logprobs": None}]
        data["choices"][0]["finish_reason"] = finish_reason
        return data

    @staticmethod
    def sse(data: dict[str, Any]) -> bytes:
        return b"data: " + _json.encode(data) + b"\n\n"

    def whole(self, text: str, prompt: int, output: int, cached: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(prompt, output, cached),
        }


def _usage(prompt: int, output: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + output,
        "completion_tokens": output,
        "prompt_tokens_details": {"cached_tokens": max(cached, 0)},
    }


def _request_id(request: web.Request, chat: bool) -> str:
    own = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    return ("chatcmpl-" if chat else "cmpl-") + own


def _json_response(data: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(data), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    kinds = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    error = {"message": message, "type": kinds.get(status, "Error"), "param": None, "code": status}
    return _json_response({"error": error}, status=status)
