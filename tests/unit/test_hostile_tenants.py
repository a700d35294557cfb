"""Per-GPU shares read from sinfo, and invoice cells a spreadsheet must not run."""

from __future__ import annotations

import pytest

from billing.invoice import spreadsheet_text
from gpupool.slurm.client import GpuInventory, GpuShare, parse_inventory


def test_share_is_the_nodes_cpus_and_memory_divided_by_its_gpus() -> None:
    recorded = "NODELIST|GRES|CPUS|MEMORY\nvm|gpu:rtx4090:4|8|16000\n"
    assert parse_inventory(recorded) == GpuInventory(
        max_per_node=4,
        max_per_node_by_type={"rtx4090": 4},
        share=GpuShare(cpus=2, mem_mb=4000),
        share_by_type={"rtx4090": GpuShare(cpus=2, mem_mb=4000)},
    )


def test_share_is_the_smallest_of_any_node_per_resource_and_per_type() -> None:
    text = (
        "NODELIST|GRES|CPUS|MEMORY\n"
        "big|gpu:rtx4090:4(S:0-1)|64|257000\n"
        "lean|gpu:rtx4090:2|8|128000\n"
        "mixed|gpu:a100:2(S:0),gpu:rtx4090:1(S:1)|48|60000\n"
        "cpuonly|(null)|128|500000\n"
    )
    inventory = parse_inventory(text)
    # lean has the fewest CPUs per GPU (4), mixed the least memory per GPU (20000 MB).
    assert inventory.share == GpuShare(cpus=4, mem_mb=20000)
    assert inventory.share_by_type == {"rtx4090": GpuShare(cpus=4, mem_mb=20000), "a100": GpuShare(cpus=16, mem_mb=20000)}


def test_no_share_without_sizes_in_the_output() -> None:
    assert parse_inventory("NODELIST|GRES\nvm|gpu:rtx4090:4\n").share is None


@pytest.mark.parametrize(
    ("cell", "shown"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+1", "'+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(1)", "'@SUM(1)"),
        ("\tcmd", "'\tcmd"),
        ("\rcmd", "'\rcmd"),
        ("train = fast", "train = fast"),
        ("", ""),
    ],
)
def test_formula_starts_are_shown_as_text(cell: str, shown: str) -> None:
    assert spreadsheet_text(cell) == shown
