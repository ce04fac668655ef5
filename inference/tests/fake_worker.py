"""A deliberately misbehaving stand-in for a vLLM worker, for the scheduler's fault tests.

It speaks just enough of vLLM's HTTP API (/health, /metrics, streaming
/v1/chat/completions) and can be told to answer well, die mid-stream, hang, answer 500 or
send garbage. It records every request so tests can count who served what.

Given `tool_calls` (name, arguments text) it answers a request that offers tools with those
calls, streamed in fragments as vLLM does, for `tool_rounds` rounds of one answer; then, or
with `tool_choice: "none"`, it answers with text. With a `tool_trigger`, only questions that
contain it get tool calls. `refuse_tools` plays a worker started
without a tool-call parser.

Its delays are the worker's pace, not waits for the test's sake: `token_delay` is the least
time between two chunks (a slower machine only spaces them more). Where a test needs a
request to wait for something rather than for a time, it waits on an event the test sets:
`release()` ends every `first_token_delay` and `hang` at once, and a paused request
(`pause_trigger`) goes on when the test sets `resume`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeWorker:
    """One stand-in worker on a free loopback port."""

    def __init__(
        self,
        *,
        mode: str = "ok",
        tokens: int = 8,
        token_delay: float = 0.01,
        tool_calls: list[tuple[str, str]] | None = None,
        tool_rounds: int = 1,
        refuse_tools: bool = False,
        tool_trigger: str = "",
        first_token_delay: float = 0.0,
        first_token_gate: threading.Event | None = None,
        pause_trigger: str = "",
        block_size: int = 0,
        prefix_cache: tuple[int, int] | None = None,
        answer: str = "",
    ) -> None:
        self.mode = mode
        # With an answer, a well-behaved request gets that text (one chunk) instead of tokens.
        self.answer = answer
        # (queries, hits): /metrics reports vLLM's prefix-cache counters with these totals.
        self.prefix_cache = prefix_cache
        # With a block size, /metrics reports vLLM's cache_config_info (1,000 blocks of it).
        self.block_size = block_size
        # Seconds before the first chunk, at most (`release()` ends the wait): a request
        # waiting in vLLM's queue behind a full batch.
        self.first_token_delay = first_token_delay
        # With a gate, every request holds its first chunk until the test sets it (then waits
        # out `first_token_delay`): the requests stay before their first token for as long
        # as the test needs them there.
        self.first_token_gate = first_token_gate
        # A request whose messages contain `pause_trigger` goes silent after its third token
        # (preempted, or behind higher-priority work), sets `paused`, and goes on once the
        # test sets `resume` (or the worker stops). The other requests hold their first token
        # until one has paused: they are what the worker serves while it is silent.
        self.pause_trigger = pause_trigger
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.tokens = tokens
        self.token_delay = token_delay
        self.tool_calls = tool_calls or []
        self.tool_rounds = tool_rounds
        self.refuse_tools = refuse_tools
        self.tool_trigger = tool_trigger
        self.requests: list[dict[str, Any]] = []
        self.request_ids: list[str] = []
        self.running = 0
        self.aborted = 0
        self.healthy = True
        # How many times /health and /metrics were read (the schedulers' health checks).
        self.health_reads = 0
        self.metrics_reads = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeWorker:
        self.thread.start()
        return self

    def release(self) -> None:
        """End every wait before a first token (`first_token_delay`) and every hang, now."""
        self._release.set()

    def stop(self) -> None:
        # Every thread that waits on an event goes on, and ends with the server.
        self._release.set()
        self.paused.set()
        self.resume.set()
        if self.first_token_gate is not None:
            self.first_token_gate.set()
        self.server.shutdown()
        self.server.server_close()

    def served(self) -> Counter[str]:
        """How many times each generation id was requested (ids are `<gen>-<attempt>`, then
        `.<edge request id>` when the job has one)."""
        return Counter(rid.split(".", 1)[0].rsplit("-", 1)[0] for rid in self.request_ids)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if not worker.healthy:
                    self.send_error(503)
                    return
                if self.path == "/health":
                    with worker._lock:
                        worker.health_reads += 1
                    self._send(200, b"", "text/plain")
                elif self.path == "/metrics":
                    with worker._lock:
                        worker.metrics_reads += 1
                    body = (
                        "# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{model_name="fake"}} {worker.running}\n'
                        "# TYPE vllm:num_requests_waiting gauge\n"
                        'vllm:num_requests_waiting{model_name="fake"} 0\n'
                        "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        'vllm:kv_cache_usage_perc{model_name="fake"} 0.1\n'
                    )
                    if worker.prefix_cache is not None:
                        queries, hits = worker.prefix_cache
                        body += (
                            "# TYPE vllm:prefix_cache_queries_total counter\n"
                            f'vllm:prefix_cache_queries_total{{model_name="fake"}} {queries}\n'
                            "# TYPE vllm:prefix_cache_hits_total counter\n"
                            f'vllm:prefix_cache_hits_total{{model_name="fake"}} {hits}\n'
                        )
                    if worker.block_size:
                        body += (
                            "# TYPE vllm:cache_config_info gauge\n"
                            f'vllm:cache_config_info{{block_size="{worker.block_size}",'
                            'num_gpu_blocks="1000"} 1.0\n'
                        )
                    self._send(200, body.encode(), "text/plain")
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with worker._lock:
                    worker.requests.append(body)
                    worker.request_ids.append(self.headers.get("X-Request-Id", ""))
                mode = worker.mode
                if mode == "error500":
                    self._send(500, b'{"error": "internal"}', "application/json")
                    return
                if worker.refuse_tools and body.get("tools"):
                    refusal = "tool choice requires --tool-call-parser to be set"
                    message = json.dumps({"error": {"message": refusal}}).encode()
                    self._send(400, message, "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                with worker._lock:
                    worker.running += 1
                try:
                    self._stream(body, mode)
                except (BrokenPipeError, ConnectionResetError):
                    with worker._lock:
                        worker.aborted += 1
                finally:
                    with worker._lock:
                        worker.running -= 1

            def _calls_tools(self, body: dict[str, Any]) -> bool:
                if not (worker.tool_calls and body.get("tools")):
                    return False
                if body.get("tool_choice") == "none":
                    return False
                rounds = 0
                for message in reversed(body["messages"]):
                    if message["role"] == "user":
                        if worker.tool_trigger not in message["content"]:
                            return False
                        break
                    if message["role"] == "assistant" and message.get("tool_calls"):
                        rounds += 1
                return rounds < worker.tool_rounds

            def _stream_tool_calls(self) -> None:
                for index, (name, arguments) in enumerate(worker.tool_calls):
                    head = {"index": index, "id": f"call-{index}", "type": "function"}
                    head["function"] = {"name": name}
                    self._event({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
                    # Arguments in small pieces, as a model writes them.
                    for start in range(0, len(arguments), 5):
                        piece = {
                            "index": index,
                            "function": {"arguments": arguments[start : start + 5]},
                        }
                        self._event({"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]})
                        time.sleep(worker.token_delay)  # the worker's pace (a least gap)
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
                self._event(
                    {
                        "choices": [],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
                    }
                )
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _stream(self, body: dict[str, Any], mode: str) -> None:
                if worker.first_token_gate is not None:
                    worker.first_token_gate.wait(timeout=600)  # a backstop only
                if worker.first_token_delay:
                    # At most this long: the time a request waits in vLLM's own queue.
                    worker._release.wait(timeout=worker.first_token_delay)
                paused = bool(worker.pause_trigger) and worker.pause_trigger in json.dumps(
                    body.get("messages")
                )
                if worker.pause_trigger and not paused:
                    # Until a request has gone silent (a backstop only: the test's own budget
                    # for it is shorter).
                    worker.paused.wait(timeout=600)
                if self._calls_tools(body):
                    self._stream_tool_calls()
                    return
                count = (
                    1
                    if worker.answer
                    else min(worker.tokens, int(body.get("max_tokens") or worker.tokens))
                )
                for index in range(count):
                    if paused and index == 3:
                        worker.paused.set()
                        worker.resume.wait(timeout=600)  # a backstop, as above
                    if mode == "die" and index == 3:
                        # Vanish without finishing the chunked body.
                        self.connection.shutdown(2)
                        return
                    if mode == "hang" and index == 3:
                        # Until the test releases it or the worker stops (a backstop only).
                        worker._release.wait(timeout=600)
                        return
                    if mode == "garbage" and index == 3:
                        self._chunk(b"data: {this is not json\n\n")
                        continue
                    delta = {"content": worker.answer or f"tok{index} "}
                    self._event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                    time.sleep(worker.token_delay)  # the worker's pace (a least gap)
                finish = "length" if count < worker.tokens and not worker.answer else "stop"
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                self._event(
                    {
                        "choices": [],
                        "usage": {
                            "prompt_tokens": 11,
                            "completion_tokens": count,
                            "total_tokens": 11 + count,
                        },
                    }
                )
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _event(self, data: dict[str, Any]) -> None:
                self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
