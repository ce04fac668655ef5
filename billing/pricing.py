"""Money arithmetic, in integers only, with every rounding rule in one place.

- Prices are micro-units per million tokens; a generation costs
  `ceil((prompt * input_price + output * output_price) / 1_000_000)` micro-units: rounded up
  once per generation, so a ledger of many tiny generations never sums to zero.
- Statements add exact micro-units (no rounding).
- An invoice turns micro-units into minor units (cents) rounding half up.
"""

from __future__ import annotations

from decimal import Decimal

MICROS = 1_000_000
TOKENS_PER_PRICE_UNIT = 1_000_000


def generation_cost_micros(
    *, prompt_tokens: int, output_tokens: int, input_price: int, output_price: int
) -> int:
    """The cost of one generation in micro-units, rounded up to a whole micro-unit."""
    numerator = prompt_tokens * input_price + output_tokens * output_price
    return -(-numerator // TOKENS_PER_PRICE_UNIT)


def micros_to_minor(micros: int, *, minor_digits: int) -> int:
    """Micro-units to minor units (cents for two digits), rounding half up."""
    per_minor = 10 ** (6 - minor_digits)
    return (micros + per_minor // 2) // per_minor


def format_micros(micros: int, currency: str) -> str:
    """`1234500` -> `1.2345 USD`: exact, with at least two decimals, never through float."""
    amount = Decimal(micros) / MICROS
    text = f"{amount:.6f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')} {currency}"


def format_minor(minor: int, currency: str, *, minor_digits: int) -> str:
    amount = Decimal(minor) / (10**minor_digits)
    return f"{amount:.{minor_digits}f} {currency}"
