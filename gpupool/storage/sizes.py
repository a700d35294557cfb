"""Sizes as operators write them (``500G``) and as people read them: binary units, as df and quota tools count."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(r"^\s*([0-9]+)\s*([KMGTP]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``500G``, ``1.5T`` is refused (whole numbers), ``1048576``: bytes. G is GiB (1024^3), as df -h and setquota count."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size: a whole number with an optional unit K, M, G, T or P (binary), e.g. 500G")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_size(size: int) -> str:
    """``500 GiB``; exact when the size is a whole number of the unit, else one decimal."""
    for unit in ("P", "T", "G", "M", "K"):
        scale = _UNITS[unit]
        if size >= scale:
            value = size / scale
            return f"{int(value)} {unit}iB" if size % scale == 0 else f"{value:.1f} {unit}iB"
    return f"{size} B"
