"""Emulated vLLM workers: a GPU-class fleet on one machine, for benchmarks and development.

Each emulated worker speaks vLLM's OpenAI server surface (`server.py`), schedules as vLLM V1
does with a prefix cache of vLLM's semantics (`engine.py`), takes its time from a latency
profile (`profiles.py`) and publishes KV cache events in vLLM's format (`events.py`). No model
runs: the emulator's own CPU is small, and every result reports it.

Why not an existing one: NVIDIA Dynamo's mocker (`dynamo-mocker`) is an engine inside Dynamo's
runtime (its frontend, discovery and event plane), not a server with vLLM's HTTP surface,
metrics and ZeroMQ KV events; guidellm's mock server answers OpenAI's routes with a fixed
TTFT and ITL, with no KV cache, prefix caching, batching or vLLM metrics. Neither fits what
the scheduler reads from a worker, so this is written after llm-d-inference-sim's documented
semantics and vLLM's own scheduler.

Start N of them: `python -m benchmarks.emulator --workers N` (see `__main__.py`).
"""
