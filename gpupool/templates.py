"""Operator-written job templates: a parameter schema (template.toml) and a bash body (run.sh).

Each ``slurm_templates/<name>/`` folder is one template. Parameters are typed
and bounded in TOML; gpupool turns each schema into a pydantic model, so the
same definition validates requests and appears in ``GET /templates`` and the
OpenAPI document.

A ``type = "path"`` parameter is a path relative to wherever the template uses
it (the job folder, the container's working directory): it can never climb out
with ``..``, start at ``/`` or ``~``, or hold a control character, and it is
taken only in its normal form, so the value checked is the value used.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)
from pydantic_core import PydanticCustomError

from gpupool.errors import ConfigError, ValidationFailed

TEMPLATE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
PARAM_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_PARAM_TYPES = ("string", "path", "integer", "number", "boolean")
_SPEC_KEYS = {"type", "description", "default", "minimum", "maximum", "max_length", "min_length", "pattern", "choices"}
# A path's meaning is fixed by its kind; bounds, patterns and choices would only blur it.
_PATH_SPEC_KEYS = {"type", "description", "default", "max_length"}
# bash cannot hold a NUL byte in a variable; a default cap keeps scripts sane.
_DEFAULT_MAX_LENGTH = 4096
_CONTROL_CHARS = frozenset(map(chr, (*range(32), 127)))
# The JSON-schema (ECMA-262) spelling of _relative_path's rules, for clients that validate
# before sending; a unit test holds the two to the same answers.
RELATIVE_PATH_FORMAT = "relative-path"
RELATIVE_PATH_PATTERN = r"^(?![~-])(?!(?:.*/)?\.{1,2}(?:/|$))[^/\x00-\x1f\x7f]+(?:/[^/\x00-\x1f\x7f]+)*$"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    return value


def _path_error(reason: str) -> PydanticCustomError:
    return PydanticCustomError("relative_path", "must be a relative path in normal form: {reason}", {"reason": reason})


def _relative_path(value: str) -> str:
    """Refuse anything but a normalized relative path that stays below where it is used."""
    if not value:
        raise _path_error("it is empty")
    if any(char in _CONTROL_CHARS for char in value):
        raise _path_error("it holds a control character (NUL, newline, tab, ...)")
    if value.startswith("/"):
        raise _path_error("it starts with '/'")
    if value.startswith("~"):
        raise _path_error("it starts with '~'")
    # A leading dash would reach the program the template runs as an option, not a file.
    if value.startswith("-"):
        raise _path_error("it starts with '-'")
    segments = value.split("/")
    if ".." in segments:
        raise _path_error("it has a '..' segment")
    if "." in segments or "" in segments:
        raise _path_error("it has a '.' segment, '//' or a trailing '/'")
    return value


# What a session template's [session] table may say; the default idle timeout when it says none.
_SESSION_KEYS = {"idle_timeout_min"}
DEFAULT_IDLE_TIMEOUT_MIN = 30
MAX_IDLE_TIMEOUT_MIN = 7 * 24 * 60


@dataclass(frozen=True)
class SessionTemplate:
    """A template whose job serves a web app through gpupool's proxy (gpupool.sessions)."""

    # The operator's idle timeout; a customer may ask for less, never more.
    idle_timeout_min: int = DEFAULT_IDLE_TIMEOUT_MIN


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    body: str
    min_gpus: int
    max_gpus: int | None
    default_gpus: int
    params_model: type[BaseModel]
    session: SessionTemplate | None = None
    _schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Generating a JSON schema costs milliseconds; templates are immutable once loaded.
        object.__setattr__(self, "_schema", self.params_model.model_json_schema())

    def parameter_schema(self) -> dict[str, Any]:
        return copy.deepcopy(self._schema)

    def validate_params(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.params_model.model_validate(dict(raw)).model_dump()
        except ValidationError as exc:
            raise ValidationFailed(
                f"invalid params for template {self.name!r}: {describe_validation_error(exc)}",
                errors=validation_error_list(exc, prefix=("params",)),
            ) from exc


def validation_error_list(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(part) for part in (*prefix, *err["loc"])), "message": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False)
    ]


def describe_validation_error(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)
    )


def _param_field(template: str, name: str, spec: Mapping[str, Any]) -> tuple[Any, Any]:
    kind = spec.get("type")
    if kind not in _PARAM_TYPES:
        raise ConfigError(f"template {template}: param {name}: type must be one of {', '.join(_PARAM_TYPES)}")
    unknown = set(spec) - (_PATH_SPEC_KEYS if kind == "path" else _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"template {template}: param {name}: unknown key(s) {', '.join(sorted(unknown))}")
    constraints: dict[str, Any] = {"description": spec.get("description")}
    annotation: Any
    if kind == "path":
        constraints["max_length"] = spec.get("max_length", _DEFAULT_MAX_LENGTH)
        constraints["json_schema_extra"] = {"format": RELATIVE_PATH_FORMAT, "pattern": RELATIVE_PATH_PATTERN}
        annotation = Annotated[str, AfterValidator(_relative_path)]
        if "default" in spec:
            _check_path_default(template, name, spec["default"])
    elif "choices" in spec:
        annotation = Literal[tuple(spec["choices"])]
    elif kind == "string":
        constraints["max_length"] = spec.get("max_length", _DEFAULT_MAX_LENGTH)
        if "min_length" in spec:
            constraints["min_length"] = spec["min_length"]
        if "pattern" in spec:
            constraints["pattern"] = spec["pattern"]
        annotation = Annotated[str, AfterValidator(_no_nul)]
    elif kind == "integer":
        annotation = int
    elif kind == "number":
        annotation = float
    else:
        annotation = bool
    for bound in ("minimum", "maximum"):
        if bound in spec:
            constraints["ge" if bound == "minimum" else "le"] = spec[bound]
    default = spec.get("default", ...)
    if "choices" not in spec:
        constraints["strict"] = True  # "5" is not 5 and true is not 1.0; a Literal is exact already
    return annotation, Field(default, **constraints)


def _check_path_default(template: str, name: str, default: Any) -> None:
    # pydantic does not validate defaults, so an operator's typo would reach every job unchecked.
    if not isinstance(default, str):
        raise ConfigError(f"template {template}: param {name}: a path's default must be a string")
    try:
        _relative_path(default)
    except PydanticCustomError as exc:
        raise ConfigError(f"template {template}: param {name}: default {default!r} {exc.message()}") from exc


def load_template(folder: Path) -> Template:
    name = folder.name
    if not TEMPLATE_NAME.match(name):
        raise ConfigError(f"template folder {folder}: name must match {TEMPLATE_NAME.pattern}")
    spec_path, body_path = folder / "template.toml", folder / "run.sh"
    try:
        spec = tomllib.loads(spec_path.read_text())
        body = body_path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"template {name}: missing {exc.filename}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"template {name}: {spec_path} is not valid TOML: {exc}") from exc
    params = spec.get("params", {})
    fields: dict[str, Any] = {}
    for param_name, param_spec in params.items():
        if not PARAM_NAME.match(param_name):
            raise ConfigError(f"template {name}: param name {param_name!r} must match {PARAM_NAME.pattern}")
        fields[param_name] = _param_field(name, param_name, param_spec)
    model = create_model(  # type: ignore[call-overload]
        f"{name.title().replace('-', '').replace('_', '')}Params",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    resources = spec.get("resources", {})
    session = _session_spec(name, spec["session"]) if "session" in spec else None
    min_gpus = int(resources.get("min_gpus", 1))
    max_gpus = resources.get("max_gpus")
    return Template(
        name=name,
        description=str(spec.get("description", "")),
        body=body,
        min_gpus=min_gpus,
        max_gpus=int(max_gpus) if max_gpus is not None else None,
        default_gpus=int(resources.get("default_gpus", min_gpus)),
        params_model=model,
        session=session,
    )


def _session_spec(template: str, table: Any) -> SessionTemplate:
    if not isinstance(table, dict):
        raise ConfigError(f"template {template}: [session] must be a table")
    unknown = set(table) - _SESSION_KEYS
    if unknown:
        raise ConfigError(f"template {template}: [session]: unknown key(s) {', '.join(sorted(unknown))}")
    idle = table.get("idle_timeout_min", DEFAULT_IDLE_TIMEOUT_MIN)
    if not isinstance(idle, int) or isinstance(idle, bool) or not 1 <= idle <= MAX_IDLE_TIMEOUT_MIN:
        raise ConfigError(f"template {template}: [session]: idle_timeout_min must be a whole number from 1 to {MAX_IDLE_TIMEOUT_MIN}")
    return SessionTemplate(idle_timeout_min=idle)


def load_templates(directory: str | Path) -> dict[str, Template]:
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"templates_dir {root} is not a directory")
    templates = {
        folder.name: load_template(folder)
        for folder in sorted(root.iterdir())
        if folder.is_dir() and (folder / "template.toml").exists()
    }
    if not templates:
        raise ConfigError(f"no templates found in {root}")
    return templates
