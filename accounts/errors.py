"""Error codes of the accounts app."""

import enum


class ErrorCode(enum.StrEnum):
    API_KEY_LIMIT = "api_key_limit"
    API_KEY_REVOKED = "api_key_revoked"
    # An API key whose scope does not cover the endpoint, or the key it would create (403).
    INSUFFICIENT_SCOPE = "insufficient_scope"
    # Too many requests from one client IP (accounts/abuse.py).
    RATE_LIMITED = "rate_limited"
