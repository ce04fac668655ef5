"""The one Bearer parser: every way a header can come, and what each view makes of it."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from chatsite.auth import bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),  # no header at all
        ("", None),
        ("Basic dXNlcjpwYXNz", None),  # another scheme: not ours to judge
        ("Token csk_abc", None),
        ("Bearer", ""),  # the scheme and nothing after it
        ("Bearer ", ""),
        ("Bearer    ", ""),
        ("Bearer csk_abc", "csk_abc"),
        ("bearer csk_abc", "csk_abc"),  # the scheme is case-insensitive
        ("BEARER csk_abc", "csk_abc"),
        ("Bearer    csk_abc   ", "csk_abc"),  # spaces around the token are not part of it
        ("Bearer csk_a csk_b", "csk_a csk_b"),  # one token, as given: no key will match it
        ("Bearer\tcsk_abc", None),  # only a space separates the scheme
        ("Bearercsk_abc", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
    request = RequestFactory().get("/", **headers)  # type: ignore[arg-type]

    assert bearer_token(request) == token
