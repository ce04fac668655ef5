"""The default free plan, as the data migration creates it and as it is restored if lost."""

from __future__ import annotations

from typing import Any

FREE_PLAN: dict[str, Any] = {
    "slug": "free",
    "name": "Free",
    "tier": "free",
    "monthly_price_micros": 0,
    "requests_per_minute": 20,
    "tokens_per_minute": 40_000,
    "max_concurrent": 2,
    "max_output_tokens": 1024,
    "message_cap": 40,
    "message_cap_window_seconds": 3 * 3600,
    "is_default": True,
}
