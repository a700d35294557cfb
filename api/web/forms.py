"""The submit form, generated from a template's parameter schema, and read back into a submit body.

Values are typed by the schema (the API's submit model is strict: "3" is not
an integer); their ranges and patterns are left to the same validation the API
runs, so the form and ``POST /submit`` refuse exactly the same things.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.errors import ValidationFailed

PARAM_PREFIX = "param."
# Longer strings than this get a text area.
_SHORT_TEXT = 256
RESOURCE_FIELDS = ("gpus", "gpu_type", "time_limit_min", "name")


@dataclass(frozen=True)
class FormField:
    """One input of the form: its HTML name, kind and attributes, and what to prefill."""

    name: str
    label: str
    kind: str  # text, textarea, integer, number, checkbox, select
    description: str
    required: bool
    value: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None


def _default_text(spec: Mapping[str, Any]) -> str:
    default = spec.get("default")
    if default is None or isinstance(default, bool):
        return ""
    return str(default)


def param_fields(schema: Mapping[str, Any], entered: Mapping[str, str] | None = None) -> list[FormField]:
    """The form's parameter inputs, in the template's order; ``entered`` refills them after a refusal."""
    required = set(schema.get("required", ()))
    fields = []
    for name, spec in schema.get("properties", {}).items():
        html_name = PARAM_PREFIX + name
        choices = tuple(str(choice) for choice in spec.get("enum", ()))
        kind = spec.get("type")
        if choices:
            form_kind = "select"
        elif kind == "boolean":
            form_kind = "checkbox"
        elif kind == "integer":
            form_kind = "integer"
        elif kind == "number":
            form_kind = "number"
        else:
            form_kind = "textarea" if spec.get("maxLength", 0) > _SHORT_TEXT else "text"
        if entered is not None:
            value = entered.get(html_name, "")
        elif form_kind == "checkbox":
            value = "on" if spec.get("default") is True else ""
        else:
            value = _default_text(spec)
        fields.append(
            FormField(
                name=html_name,
                label=spec.get("title", name),
                kind=form_kind,
                description=spec.get("description") or "",
                required=name in required,
                value=value,
                choices=choices,
                minimum=spec.get("minimum"),
                maximum=spec.get("maximum"),
                max_length=spec.get("maxLength"),
            )
        )
    return fields


def _number(text: str, field: str, kind: str) -> int | float:
    try:
        return int(text) if kind == "integer" else float(text)
    except ValueError as exc:
        word = "a whole number" if kind == "integer" else "a number"
        raise ValidationFailed(f"{field}: must be {word}", errors=[{"field": field, "message": f"must be {word}"}]) from exc


def submit_body(template: str, schema: Mapping[str, Any], form: Mapping[str, str]) -> dict[str, Any]:
    """The JSON body ``POST /submit`` would get for this form: empty optional inputs are left out."""
    params: dict[str, Any] = {}
    required = set(schema.get("required", ()))
    for name, spec in schema.get("properties", {}).items():
        raw = form.get(PARAM_PREFIX + name, "")
        kind = spec.get("type")
        if "enum" in spec:
            # A choice goes back as the schema's own value: 2, not "2".
            by_text = {str(choice): choice for choice in spec["enum"]}
            if raw == "" and name not in required:
                continue
            params[name] = by_text.get(raw, raw)
        elif kind == "boolean":
            params[name] = raw == "on"
        elif raw.strip() == "" and (kind in ("integer", "number") or name not in required):
            continue
        elif kind in ("integer", "number"):
            params[name] = _number(raw.strip(), f"params.{name}", kind)
        else:
            # Text goes as typed; a browser sends a text area's line ends as CRLF.
            params[name] = raw.replace("\r\n", "\n")
    body: dict[str, Any] = {"template": template, "params": params}
    for field in ("gpus", "time_limit_min"):
        raw = form.get(field, "").strip()
        if raw:
            body[field] = _number(raw, field, "integer")
    for field in ("gpu_type", "name"):
        raw = form.get(field, "").strip()
        if raw:
            body[field] = raw
    return body
