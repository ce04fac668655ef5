"""Template filters for money in micro-units and window lengths."""

from __future__ import annotations

from django import template
from django.conf import settings

from billing.pricing import format_micros, format_minor

register = template.Library()


@register.filter
def micros(value: int | None) -> str:
    """`1234500|micros` -> `1.2345 USD`."""
    return format_micros(int(value or 0), settings.BILLING_CURRENCY)


@register.filter
def minor(value: int | None) -> str:
    """`1234|minor` -> `12.34 USD`."""
    return format_minor(
        int(value or 0), settings.BILLING_CURRENCY, minor_digits=settings.BILLING_MINOR_DIGITS
    )


@register.filter
def window(seconds: int) -> str:
    """`10800|window` -> `3 h`."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"
