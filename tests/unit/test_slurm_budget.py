"""The Slurm budget (GrpTRESMins=gres/gpu) an account's money buys: pure arithmetic."""

from __future__ import annotations

import datetime as dt

import pytest

from billing.enforcement import budget_gpu_minutes
from billing.price_book import PriceBook
from gpupool.errors import PriceMissing

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
SINCE = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
PRICES = PriceBook([("rtx4090", SINCE, 120_000), ("rtx3090", SINCE, 70_000)])  # nano-units per GPU-second


@pytest.mark.parametrize(
    ("remaining", "disabled", "minutes"),
    [
        (None, False, None),  # no credit and no monthly limit: no Slurm limit
        (0, False, 0),
        (-5, False, 0),  # overspent
        (10 * 60 * 120_000, False, 10),  # at the dearest type's price
        (10 * 60 * 120_000 - 1, False, 9),  # never rounded up
        (10 * 60 * 120_000, True, 0),  # a disabled account starts nothing
        (None, True, 0),
    ],
)
def test_money_left_becomes_whole_gpu_minutes_at_the_dearest_price(remaining: int | None, disabled: bool, minutes: int | None) -> None:
    assert budget_gpu_minutes(remaining, PRICES, NOW, disabled=disabled) == minutes


def test_money_left_without_any_price_cannot_be_converted() -> None:
    with pytest.raises(PriceMissing):
        budget_gpu_minutes(1_000, PriceBook([]), NOW)
    assert budget_gpu_minutes(0, PriceBook([]), NOW) == 0


def test_free_gpus_need_no_limit() -> None:
    assert budget_gpu_minutes(1_000, PriceBook([("*", SINCE, 0)]), NOW) is None
