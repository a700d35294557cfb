"""Query parameters of the JSON API: the one reader of whole numbers, and one value per name.

Every route reads its numbers through ``int_arg``, so a number outside what the
OpenAPI document declares is the same 400 ``bad_request`` everywhere, naming
the parameter and its range. A parameter given twice (``?offset=1&offset=2``)
is refused before any route runs: which of the two a route would read is
nobody's contract. Lists are one value, comma-separated (``?state=RUNNING,PENDING``,
``style: form, explode: false`` in the document). The pages under /ui/ read
their forms themselves and are left alone.
"""

from __future__ import annotations

from typing import Any

from flask import request

from api.auth import PAGE_BLUEPRINTS
from gpupool.errors import BadRequest

# The largest integer the document declares anywhere (JSON's safe integers).
MAX_SAFE_INTEGER = 2**53 - 1


def optional_int_arg(name: str, low: int, high: int) -> int | None:
    """The whole number ``?name=`` within [low, high], None when absent; 400 otherwise."""
    raw = request.args.get(name)
    if raw is None:
        return None
    # int() would also take "+5", " 5" and "5_000"; a query carries digits.
    if not raw.isascii() or not raw.removeprefix("-").isdigit():
        raise BadRequest(f"{name} must be an integer")
    # A number of more digits than any bound here is out of range before int() spends time on it.
    if len(raw) > 40 or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be between {low} and {high}")
    return int(raw)


def int_param(name: str, low: int, high: int, *, default: int | None = None, description: str | None = None) -> dict[str, Any]:
    """The OpenAPI entry of the whole-number ``?name=`` that ``int_arg`` reads within [low, high]."""
    schema: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
    if default is not None:
        schema["default"] = default
    param: dict[str, Any] = {"name": name, "in": "query", "schema": schema}
    if description is not None:
        param["description"] = description
    return param


def int_arg(name: str, default: int, low: int, high: int) -> int:
    """The whole number ``?name=`` within [low, high], ``default`` when absent; 400 otherwise."""
    value = optional_int_arg(name, low, high)
    return default if value is None else value


def refuse_repeated_parameters() -> None:
    """``before_request``: 400 for a JSON API request that names a query parameter more than once."""
    if request.blueprint in PAGE_BLUEPRINTS:
        return
    repeated = sorted(name for name, values in request.args.lists() if len(values) > 1)
    if repeated:
        raise BadRequest(f"query parameter(s) given more than once: {', '.join(repeated)}; give each once")
