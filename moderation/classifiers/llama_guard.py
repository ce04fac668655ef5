"""Llama Guard served by a vLLM pool of our own (the production choice on GPUs).

The pool is named by `settings.MODERATION_LLAMA_GUARD_POOL` and its workers are registered in
admin like any other; vLLM's chat template for Llama Guard turns the text into its safety
prompt. Llama Guard answers "safe", or "unsafe" and a line of categories ("S1,S10") in the
same MLCommons taxonomy we use. The named categories score the model's probability of
"unsafe" (from the first token's log-probabilities), or 1 when vLLM gives none.
"""

from __future__ import annotations

import math
import re
import threading
import time
from typing import Any

from django.conf import settings
from redis import RedisError

from inference.models import Worker
from inference.scheduler.capacity import background_order
from moderation.categories import CATEGORIES

from .base import Classifier, ClassifierError, Scores, post_json

WORKERS_REFRESH_SECONDS = 10.0
_CODES = re.compile(r"\bS\d{1,2}\b")


def parse_llama_guard(output: str, *, confidence: float = 1.0) -> Scores:
    """Scores from Llama Guard's answer; ClassifierError if it is not one."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines:
        raise ClassifierError("Llama Guard gave an empty answer")
    verdict = lines[0].lower()
    if verdict == "safe":
        return {}
    if verdict != "unsafe":
        raise ClassifierError(f"not a Llama Guard verdict: {lines[0][:80]!r}")
    codes = [code for code in _CODES.findall(" ".join(lines[1:]).upper()) if code in CATEGORIES]
    if not codes:
        raise ClassifierError(f"Llama Guard named no known category: {output[:80]!r}")
    return dict.fromkeys(codes, confidence)


def unsafe_probability(choice: dict[str, Any]) -> float:
    """P("unsafe") from the first generated token's top log-probabilities; 1.0 if absent."""
    try:
        first = choice["logprobs"]["content"][0]
        candidates = first.get("top_logprobs") or [first]
        total = sum(
            math.exp(float(item["logprob"]))
            for item in candidates
            if str(item["token"]).strip().lower().startswith("uns")
        )
    except (KeyError, IndexError, TypeError, ValueError):
        return 1.0
    return min(1.0, total) if total > 0 else 1.0


class LlamaGuardClassifier(Classifier):
    """Asks a worker of the Llama Guard pool, the one the scheduler's placement prefers."""

    name = "llama_guard"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[int, tuple[str, str]] = {}
        self._loaded_at = -math.inf

    def refresh(self) -> None:
        if time.monotonic() - self._loaded_at < WORKERS_REFRESH_SECONDS:
            return
        rows = Worker.objects.filter(
            pool__name=settings.MODERATION_LLAMA_GUARD_POOL,
            pool__is_active=True,
            state=Worker.State.HEALTHY,
        ).select_related("pool")
        targets = {row.pk: (row.url.rstrip("/"), row.pool.served_model) for row in rows}
        with self._lock:
            self._targets, self._loaded_at = targets, time.monotonic()

    def classify(self, text: str) -> Scores:
        with self._lock:
            targets = dict(self._targets)
        pool = settings.MODERATION_LLAMA_GUARD_POOL
        if not targets:
            raise ClassifierError(f"no healthy worker serves the pool {pool!r}")
        try:
            # `classify` never touches the database; the loads are in Redis.
            order = background_order(pool=pool, worker_ids=sorted(targets))
        except RedisError as exc:
            raise ClassifierError(f"could not read the load of the pool {pool!r}") from exc
        url, model = targets[order[0]]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 20,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 5,
        }
        answer = post_json(
            f"{url}/v1/chat/completions",
            body,
            timeout=settings.MODERATION_LLAMA_GUARD_TIMEOUT_SECONDS,
            what=f"Llama Guard worker {url}",
        )
        try:
            choice = answer["choices"][0]
            content = str(choice["message"]["content"])
        except (KeyError, IndexError, TypeError) as exc:
            raise ClassifierError(f"Llama Guard worker {url} sent an unreadable answer") from exc
        return parse_llama_guard(content, confidence=unsafe_probability(choice))
