"""The gateway peers `benchmarks/overhead.py` measures the service against, started here in
front of the same vLLM workers, each from its own environment (`make peers`):

- litellm: LiteLLM proxy (`.venv-litellm`), with a master key and no database, one model
  entry per worker under the served model's name (it spreads the requests over them);
- openwebui: Open WebUI (`.venv-openwebui`) in `OFFLINE_MODE`, its OpenAI connections pointed
  at the workers, called at `/api/chat/completions` with the token of the admin its first
  sign-up makes.

Neither gets this project's `DATABASE_URL` or `REDIS_URL` (both would use them): LiteLLM runs
without a store, Open WebUI with its own SQLite file in a temporary folder. Both are called
with the official `openai` client, as the service's `/v1` is.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("litellm", "openwebui")
# The command each peer's environment installs.
EXECUTABLES = {"litellm": "litellm", "openwebui": "open-webui"}
# Open WebUI imports a great deal and migrates its database on a first start.
START_SECONDS = 300
# What the peers would read from the environment and must not: this project's stores.
OUR_STORES = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")


@dataclass
class Peer:
    """A started peer: the side's name, its process, and a client that calls it."""

    side: str
    process: subprocess.Popen[bytes]
    client: openai.AsyncOpenAI
    model: str
    log: Path


def executable(name: str) -> Path:
    return ROOT / f".venv-{name}" / "bin" / EXECUTABLES[name]


def installed() -> list[str]:
    """The peers whose environment `make peers` has installed here."""
    return [name for name in PEERS if executable(name).exists()]


def parse_peers(text: str) -> list[str]:
    """`--peers`: `auto` (those installed), `none`, or names separated by commas."""
    if text == "auto":
        return installed()
    if text in ("", "none"):
        return []
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    missing = [name for name in names if not executable(name).exists()]
    if missing:
        raise ValueError(f"not installed: {', '.join(missing)} (run `make peers`)")
    return names


def peer_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` without this project's stores, offline."""
    env = {key: value for key, value in base.items() if key not in OUR_STORES}
    return env | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def litellm_config(urls: Sequence[str], served: str, master_key: str) -> str:
    """LiteLLM's config (JSON, which its YAML reader takes): one deployment per worker."""
    return json.dumps(
        {
            "model_list": [
                {
                    "model_name": served,
                    "litellm_params": {"model": f"hosted_vllm/{served}", "api_base": f"{url}/v1"},
                }
                for url in urls
            ],
            "general_settings": {"master_key": master_key},
            # Its own per-request log lines would cost it CPU the service does not spend.
            "litellm_settings": {"set_verbose": False, "json_logs": False},
        },
        indent=2,
    )


def litellm_env(base: Mapping[str, str]) -> dict[str, str]:
    # Without this it fetches its model price list from GitHub at start.
    return peer_env(base) | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}


def openwebui_env(
    base: Mapping[str, str], urls: Sequence[str], data_dir: Path, secret: str
) -> dict[str, str]:
    """Open WebUI offline, its OpenAI connections to the workers, its extras off (titles,
    tags, follow-ups, retrieval), so it does per answer what the service's `/v1` does."""
    return peer_env(base) | {
        "DATA_DIR": str(data_dir),
        "OFFLINE_MODE": "true",
        "ENABLE_OLLAMA_API": "False",
        "OPENAI_API_BASE_URLS": ";".join(f"{url}/v1" for url in urls),
        "OPENAI_API_KEYS": ";".join("none" for _ in urls),
        "WEBUI_SECRET_KEY": secret,
        "BYPASS_EMBEDDING_AND_RETRIEVAL": "true",
        "ENABLE_TITLE_GENERATION": "False",
        "ENABLE_TAGS_GENERATION": "False",
        "ENABLE_FOLLOW_UP_GENERATION": "False",
        "ENABLE_AUTOCOMPLETE_GENERATION": "False",
        "GLOBAL_LOG_LEVEL": "WARNING",
    }


def wait_answering(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    *,
    within: float = START_SECONDS,
    ok: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
) -> None:
    """Until `url` answers as `ok` says; SystemExit with the log's end if the process ends
    or `within` seconds pass first."""
    deadline = time.monotonic() + within
    while True:
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{url} did not come up:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)


Starter = Callable[[list[str], Path, dict[str, str]], subprocess.Popen[bytes]]


def start_litellm(
    start: Starter, *, urls: Sequence[str], served: str, port: int, folder: Path
) -> Peer:
    master_key = f"sk-bench-{secrets.token_hex(8)}"
    config = folder / "litellm.json"
    config.write_text(litellm_config(urls, served, master_key))
    log = folder / "litellm.log"
    command = [str(executable("litellm")), "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    process = start(command, log, litellm_env(os.environ))
    base = f"http://127.0.0.1:{port}"
    wait_answering(f"{base}/health/liveliness", process, log)
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=master_key, max_retries=0)
    return Peer("litellm", process, client, served, log)


def start_openwebui(
    start: Starter, *, urls: Sequence[str], served: str, port: int, folder: Path
) -> Peer:
    data_dir = folder / "openwebui-data"
    data_dir.mkdir()
    log = folder / "openwebui.log"
    env = openwebui_env(os.environ, urls, data_dir, secrets.token_hex(16))
    command = [str(executable("openwebui")), "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = start(command, log, env)
    base = f"http://127.0.0.1:{port}"
    wait_answering(f"{base}/health", process, log)
    # The first sign-up makes the admin, whose token calls the API.
    signed_up = httpx.post(
        f"{base}/api/v1/auths/signup",
        json={"name": "bench", "email": "bench@example.com", "password": secrets.token_hex(12)},
        timeout=60,
    )
    signed_up.raise_for_status()
    token = signed_up.json()["token"]
    # Its model list is read from the workers: wait until it names the served model.
    wait_answering(
        f"{base}/api/models",
        process,
        log,
        ok=lambda _: served in _model_ids(base, token),
    )
    client = openai.AsyncOpenAI(base_url=f"{base}/api", api_key=token, max_retries=0)
    return Peer("openwebui", process, client, served, log)


def _model_ids(base: str, token: str) -> set[str]:
    answered = httpx.get(
        f"{base}/api/models", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    if answered.status_code != 200:
        return set()
    return {str(model.get("id")) for model in answered.json().get("data", [])}


STARTERS = {"litellm": start_litellm, "openwebui": start_openwebui}
