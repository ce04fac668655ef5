"""The one error shape, for the views DRF's exception handler never sees."""

from __future__ import annotations

import json

from chatsite.errors import ErrorCode, error_body, error_response


def test_a_plain_view_answers_the_one_error_shape() -> None:
    response = error_response(
        429, "rate_limited", "Slow down.", detail={"retry_after": 3}, headers={"Retry-After": "3"}
    )

    assert response.status_code == 429
    assert json.loads(response.content) == {
        "error": {"code": "rate_limited", "message": "Slow down.", "detail": {"retry_after": 3}}
    }
    assert response["Retry-After"] == "3"


def test_a_code_from_an_enum_is_its_value() -> None:
    assert error_body(ErrorCode.NOT_FOUND, "Not found.") == {
        "error": {"code": "not_found", "message": "Not found.", "detail": None}
    }
