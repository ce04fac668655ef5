"""Start N emulated vLLM workers in one process (see `benchmarks/emulator/__init__.py`).

    .venv/bin/python -m benchmarks.emulator --workers 8 --port 9100 --profile h100-8b \\
        --kv-events-port 9500

Worker i answers on `--port + i`; with `--kv-events-port P` it publishes its KV events on
`tcp://host:P + 2i` and replays them on `P + 2i + 1`. One JSON line per worker says where,
then `ready`; it runs until interrupted (SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from .profiles import PROFILES

    parser = argparse.ArgumentParser(description="Emulated vLLM workers.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--profile", default="cpu-smollm2", choices=sorted(PROFILES))
    parser.add_argument("--num-blocks", type=int, default=0, help="the KV cache's size in blocks")
    parser.add_argument(
        "--max-num-seqs", type=int, default=0, help="answers a worker runs at once (vLLM's)"
    )
    # A profile fitted elsewhere (`emulator_fidelity.py` fits one to a real worker).
    parser.add_argument("--step-ms", type=float, default=None)
    parser.add_argument("--decode-ms-per-stream", type=float, default=None)
    parser.add_argument("--prefill-ms-per-token", type=float, default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--kv-events-port", type=int, default=0, help="0: no KV events")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="every modelled duration times this (2: a fleet running at half speed)",
    )
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="tokens per streamed chunk (vLLM's)"
    )
    parser.add_argument("--served-model-name", default="smollm2-135m")
    parser.add_argument("--model-dir", default="", help="tokenizer and chat template folder")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=None)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web
    from django.conf import settings

    from .engine import Engine
    from .events import EventPublisher
    from .profiles import profile_named
    from .server import Tokens, Worker

    profile = profile_named(args.profile).sized(
        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs
    )
    fitted = {
        name: getattr(args, name)
        for name in ("step_ms", "decode_ms_per_stream", "prefill_ms_per_token", "block_size")
        if getattr(args, name) is not None
    }
    if fitted:
        profile = replace(profile, name=f"{profile.name}-fitted", **fitted)
    tokens = Tokens(args.model_dir or str(settings.MODEL_DIR))
    runners, publishers, engines = [], [], []
    for number in range(args.workers):
        publisher = None
        where: dict[str, object] = {"url": f"http://{args.host}:{args.port + number}"}
        if args.kv_events_port:
            port = args.kv_events_port + 2 * number
            publisher = EventPublisher(args.host, port, port + 1, profile.block_size)
            publisher.start()
            publishers.append(publisher)
            where["kv_events"] = f"tcp://{args.host}:{port}"
            where["kv_events_replay"] = f"tcp://{args.host}:{port + 1}"
        engine = Engine(
            profile,
            time_scale=args.time_scale,
            seed=None if args.seed is None else args.seed + number,
            on_events=publisher.publish if publisher is not None else None,
        )
        engines.append(asyncio.ensure_future(engine.run()))
        worker = Worker(
            engine,
            tokens,
            args.served_model_name,
            max_model_len=args.max_model_len,
            stream_interval=args.stream_interval,
        )
        # A client that leaves cancels its handler, which aborts its request.
        runner = web.AppRunner(worker.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port + number).start()
        runners.append(runner)
        print(json.dumps({**where, "profile": profile.name}), flush=True)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for task in engines:
            task.cancel()
        for runner in runners:
            await runner.cleanup()
        for publisher in publishers:
            publisher.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    os.environ.setdefault("SECRET_KEY", "vllm-emulator")
    os.environ.setdefault("PLUGINS_ENCRYPTION_KEY", "vllm-emulator")
    import django

    django.setup()
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
