"""Money as integer nano-units (1e-9 of the currency), and the one rounding rule.

Rounding rule: every ledger amount is exact (GPU-seconds x unit price, both
integers). Amounts are rounded only once, per invoice line, to the cent, half
away from zero (0.005 -> 0.01, -0.005 -> -0.01). An invoice total is the sum
of its rounded lines, so it always equals what the lines add up to. Any
other total of money billed (the operator report's revenue, adjustments and
net) is ``invoiced_cents`` of the same lines, so it is what the invoices say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

NANOS = 10**9
CENT_NANOS = 10**7
# The largest amount anyone may enter (a price, a credit, a limit): under a billion in the
# currency, so that the database's 64-bit columns hold it, and sums of it, exactly.
MAX_AMOUNT_NANOS = 10**18 - 1
_AMOUNT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


class MoneyError(ValueError):
    """A price or amount that cannot be held exactly."""


def parse_nanos(text: str, *, what: str = "amount") -> int:
    """``"0.00012"`` -> 120000. Refuses floats' spellings, exponents and more than 9 decimals."""
    text = text.strip()
    if not _AMOUNT.match(text):
        raise MoneyError(f"{what} {text!r} is not a decimal number such as 12.50")
    try:
        scaled = Decimal(text) * NANOS
    except InvalidOperation as exc:
        raise MoneyError(f"{what} {text!r} is not a decimal number") from exc
    if scaled != scaled.to_integral_value():
        raise MoneyError(f"{what} {text!r} has more than 9 decimal places")
    if abs(scaled) > MAX_AMOUNT_NANOS:
        raise MoneyError(f"{what} {text!r} is more than gpupool holds: at most {format_nanos(MAX_AMOUNT_NANOS)}")
    return int(scaled)


def round_to_cents(nanos: int) -> int:
    """Whole cents, half away from zero."""
    cents, rest = divmod(abs(nanos), CENT_NANOS)
    if rest * 2 >= CENT_NANOS:
        cents += 1
    return -cents if nanos < 0 else cents


def invoiced_cents(line_nanos: Iterable[int]) -> int:
    """What invoice lines of these exact amounts add up to: each rounded to the cent, then summed."""
    return sum(round_to_cents(nanos) for nanos in line_nanos)


def format_cents(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole}.{part:02d}"


def format_nanos(nanos: int) -> str:
    """Exact decimal text, trailing zeros trimmed to no fewer than 2 decimals: 120000 -> '0.00012'."""
    sign = "-" if nanos < 0 else ""
    whole, part = divmod(abs(nanos), NANOS)
    decimals = f"{part:09d}".rstrip("0")
    return f"{sign}{whole}.{decimals.ljust(2, '0')}"
