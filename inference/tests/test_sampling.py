"""A pool's sampling defaults: what staff may set, and how a request's own fields win."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from inference.models import ModelPool
from inference.sampling import request_sampling, sampling_defaults_refusal


@pytest.mark.parametrize(
    "defaults",
    [{}, {"temperature": 0, "top_k": -1, "seed": 3, "min_tokens": 10, "repetition_penalty": 1.1}],
)
def test_defaults_vllm_accepts_are_kept(defaults: dict[str, Any]) -> None:
    assert sampling_defaults_refusal(defaults) is None


@pytest.mark.parametrize(
    ("defaults", "said"),
    [
        ([], "must be an object"),
        ({"temprature": 0.5}, "Unknown sampling field 'temprature'"),
        ({"temperature": "hot"}, "'temperature' must be a number"),
        ({"temperature": True}, "'temperature' must be a number"),
        ({"temperature": 2.5}, "between 0 and 2"),
        ({"top_p": float("nan")}, "'top_p' must be between"),
        ({"min_tokens": 1.5}, "'min_tokens' must be an integer"),
        ({"seed": 2**64}, "'seed' must be between"),
    ],
)
def test_defaults_a_worker_would_refuse_are_refused_with_the_reason(
    defaults: Any, said: str
) -> None:
    assert said in (sampling_defaults_refusal(defaults) or "")


@pytest.mark.django_db
def test_a_pool_with_bad_defaults_does_not_validate() -> None:
    pool = ModelPool(name="p", served_model="m", sampling_defaults={"top_k": "many"})
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert "'top_k' must be an integer" in str(refused.value.message_dict["sampling_defaults"])


def test_a_requests_own_fields_win_and_min_tokens_is_held_to_max_tokens() -> None:
    defaults = {"temperature": 0.9, "min_tokens": 300}
    assert request_sampling({"temperature": 0.2}, defaults, max_tokens=100) == {
        "temperature": 0.2,
        "min_tokens": 100,
    }
    assert request_sampling({}, {}, max_tokens=5) == {}
