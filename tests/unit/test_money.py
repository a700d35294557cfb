from __future__ import annotations

import pytest

from billing.money import MoneyError, format_cents, format_nanos, parse_nanos, round_to_cents


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("0.00012", 120_000),
        ("12.50", 12_500_000_000),
        ("-12.50", -12_500_000_000),
        ("+3", 3_000_000_000),
        (".5", 500_000_000),
        ("0.000000001", 1),
        ("100", 100_000_000_000),
        ("999999999.999999999", 10**18 - 1),  # the most there is: a 64-bit column holds it and sums of it
        ("-999999999.999999999", -(10**18 - 1)),
    ],
)
def test_parse_nanos_is_exact(text: str, nanos: int) -> None:
    assert parse_nanos(text) == nanos


@pytest.mark.parametrize(
    "text", ["0.0000000001", "1e-4", "nan", "inf", "", "12,50", "0x10", "1.2.3", "- 1", "1000000000", "726512750341.352331587"]
)
def test_parse_nanos_refuses_what_it_cannot_hold(text: str) -> None:
    with pytest.raises(MoneyError):
        parse_nanos(text)


@pytest.mark.parametrize(
    ("nanos", "cents"),
    [
        (4_999_999, 0),
        (5_000_000, 1),  # half a cent rounds away from zero
        (-5_000_000, -1),
        (-4_999_999, 0),
        (15_000_000, 2),
        (25_000_000, 3),  # not banker's rounding
        (12_345_678_901, 1235),
    ],
)
def test_round_to_cents_half_away_from_zero(nanos: int, cents: int) -> None:
    assert round_to_cents(nanos) == cents


def test_formatting() -> None:
    assert format_nanos(120_000) == "0.00012"
    assert format_nanos(-12_500_000_000) == "-12.50"
    assert format_nanos(0) == "0.00"
    assert format_cents(round_to_cents(-1_005_000_000)) == "-1.01"
    assert format_cents(round_to_cents(999)) == "0.00"
    assert format_cents(-5) == "-0.05"
