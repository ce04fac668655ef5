"""A pool's sampling defaults: what staff set once for a model (its temperature, a seed, the
least an answer writes), sent to its workers with every request that does not set its own.

vLLM takes OpenAI's sampling fields and a few of its own (`top_k`, `min_p`,
`repetition_penalty`, `min_tokens`); a default is checked against the range vLLM accepts when
it is saved, so a pool never makes its workers refuse a request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Range:
    low: float
    high: float
    integer: bool = False

    def refusal(self, name: str, value: Any) -> str | None:
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"'{name}' must be {kind}; got {value!r}."
        if self.integer and value != int(value):
            return f"'{name}' must be {kind}; got {value!r}."
        if not math.isfinite(value) or not self.low <= value <= self.high:
            return f"'{name}' must be between {self.low:g} and {self.high:g}; got {value!r}."
        return None


_SEED_RANGE = _Range(-(2**63), 2**63 - 1, integer=True)

# The fields a pool may set, with the values vLLM accepts for each.
SAMPLING_FIELDS: dict[str, _Range] = {
    "temperature": _Range(0, 2),
    "top_p": _Range(0.01, 1),
    "top_k": _Range(-1, 1_000_000, integer=True),
    "min_p": _Range(0, 1),
    "presence_penalty": _Range(-2, 2),
    "frequency_penalty": _Range(-2, 2),
    "repetition_penalty": _Range(0.01, 2),
    "seed": _SEED_RANGE,
    # The least an answer writes before its model may end it (clamped to its max_tokens).
    "min_tokens": _Range(0, 1_000_000, integer=True),
}


def sampling_defaults_refusal(value: Any) -> str | None:
    """Why `value` cannot be a pool's sampling defaults (a sentence), or None if it can."""
    if not isinstance(value, dict):
        return "Sampling defaults must be an object of field names and values."
    for name, field_value in value.items():
        known = SAMPLING_FIELDS.get(name)
        if known is None:
            allowed = ", ".join(sorted(SAMPLING_FIELDS))
            return f"Unknown sampling field {name!r}; a pool may set {allowed}."
        if refusal := known.refusal(name, field_value):
            return refusal
    return None


def request_sampling(
    params: Mapping[str, Any], defaults: Mapping[str, Any], *, max_tokens: int
) -> dict[str, Any]:
    """The sampling fields of a request to a worker: the request's own, and its pool's
    defaults for the fields it leaves out. `min_tokens` is held to `max_tokens`: vLLM
    refuses a request asking for more than it allows."""
    merged = {**defaults, **params}
    if "min_tokens" in merged:
        merged["min_tokens"] = min(int(merged["min_tokens"]), max_tokens)
    return merged
