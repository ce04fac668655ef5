"""Error codes of the accounts app."""

import enum


class ErrorCode(enum.StrEnum):
    API_KEY_LIMIT = "api_key_limit"
    API_KEY_REVOKED = "api_key_revoked"
    # Too many requests from one client IP (accounts/abuse.py).
    RATE_LIMITED = "rate_limited"
