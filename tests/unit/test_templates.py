"""The shipped templates and the schema machinery behind them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import ConfigError, ValidationFailed
from gpupool.render import JobSpec, param_env_name, render, shell_quote
from gpupool.templates import RELATIVE_PATH_FORMAT, RELATIVE_PATH_PATTERN, Template, load_template, load_templates

SHIPPED_TEMPLATES = Path(__file__).resolve().parents[2] / "slurm_templates"

TRAIN_DATA_DIR_PATTERN = "^(/[A-Za-z0-9_][A-Za-z0-9._-]{0,254}){1,32}$"


def errors_of(template: Template, raw: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ValidationFailed) as info:
        template.validate_params(raw)
    assert info.value.code == "validation_failed"
    assert f"invalid params for template {template.name!r}" in info.value.message
    return info.value.details["errors"]


# --- the shipped templates ------------------------------------------------------------


def test_shipped_templates_load(shipped_templates: dict[str, Template]) -> None:
    assert list(shipped_templates) == ["command", "hello", "inference", "jupyter", "train", "webapp"]
    for name, template in shipped_templates.items():
        assert template.name == name
        assert template.body == (SHIPPED_TEMPLATES / name / "run.sh").read_text()
        assert template.description


@pytest.mark.parametrize(
    ("name", "min_gpus", "max_gpus", "default_gpus"),
    [("command", 1, None, 1), ("hello", 1, None, 1), ("inference", 1, 1, 1), ("train", 1, None, 2), ("jupyter", 1, None, 1), ("webapp", 1, None, 1)],
)
def test_gpu_bounds(shipped_templates: dict[str, Template], name: str, min_gpus: int, max_gpus: int | None, default_gpus: int) -> None:
    template = shipped_templates[name]
    assert (template.min_gpus, template.max_gpus, template.default_gpus) == (min_gpus, max_gpus, default_gpus)


def test_hello_schema(hello: Template) -> None:
    assert hello.parameter_schema() == {
        "additionalProperties": False,
        "properties": {
            "message": {
                "default": "hello from gpupool",
                "description": "Printed exactly as given, on its own line.",
                "maxLength": 65536,
                "title": "Message",
                "type": "string",
            },
            "seconds": {
                "default": 0,
                "description": "How long to sleep after printing, in seconds.",
                "maximum": 3600,
                "minimum": 0,
                "title": "Seconds",
                "type": "integer",
            },
        },
        "title": "HelloParams",
        "type": "object",
    }


def test_inference_schema(shipped_templates: dict[str, Template]) -> None:
    schema = shipped_templates["inference"].parameter_schema()
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["model", "input"]
    props = schema["properties"]
    assert (props["model"]["format"], props["model"]["pattern"]) == (RELATIVE_PATH_FORMAT, RELATIVE_PATH_PATTERN)
    assert props["model"]["maxLength"] == 256
    assert props["input"]["maxLength"] == 65536
    assert "format" not in props["input"]  # free text, not a path
    assert {k: props["max_tokens"][k] for k in ("type", "minimum", "maximum", "default")} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 32768,
        "default": 512,
    }


def test_train_schema(shipped_templates: dict[str, Template]) -> None:
    schema = shipped_templates["train"].parameter_schema()
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["data_dir"]
    props = schema["properties"]
    assert props["data_dir"]["pattern"] == TRAIN_DATA_DIR_PATTERN
    assert {k: props["epochs"][k] for k in ("type", "minimum", "maximum", "default")} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000,
        "default": 1,
    }
    assert {k: props["learning_rate"][k] for k in ("type", "minimum", "maximum", "default")} == {
        "type": "number",
        "minimum": 0.0,
        "maximum": 1.0,
        "default": 0.0003,
    }
    assert props["script"]["default"] == "train.py"
    assert (props["script"]["format"], props["script"]["pattern"]) == (RELATIVE_PATH_FORMAT, RELATIVE_PATH_PATTERN)
    assert props["script"]["maxLength"] == 255


@pytest.mark.parametrize("seconds", [0, 1, 3600])
def test_hello_seconds_in_bounds(hello: Template, seconds: int) -> None:
    assert hello.validate_params({"seconds": seconds}) == {"message": "hello from gpupool", "seconds": seconds}


@pytest.mark.parametrize(
    ("seconds", "message"),
    [
        (-1, "Input should be greater than or equal to 0"),
        (3601, "Input should be less than or equal to 3600"),
        (10**12, "Input should be less than or equal to 3600"),
    ],
)
def test_hello_seconds_out_of_bounds(hello: Template, seconds: int, message: str) -> None:
    assert errors_of(hello, {"seconds": seconds}) == [{"field": "params.seconds", "message": message}]


def test_train_data_dir_accepts(shipped_templates: dict[str, Template]) -> None:
    train = shipped_templates["train"]
    assert train.validate_params({"data_dir": "/data/set1"}) == {
        "data_dir": "/data/set1",
        "epochs": 1,
        "learning_rate": 0.0003,
        "script": "train.py",
    }
    for ok in ("/data", "/data/set_1/v2.0", "/_x/y-z"):
        assert train.validate_params({"data_dir": ok})["data_dir"] == ok


@pytest.mark.parametrize(
    "data_dir",
    ["/data/../etc", "relative/path", "/data/.hidden", "/..", "/data/set1/", "/", "", "/data/set1\n", "/data//x", "/data/a b", "//etc"],
)
def test_train_data_dir_rejects(shipped_templates: dict[str, Template], data_dir: str) -> None:
    assert errors_of(shipped_templates["train"], {"data_dir": data_dir}) == [
        {"field": "params.data_dir", "message": f"String should match pattern '{TRAIN_DATA_DIR_PATTERN}'"}
    ]


def test_inference_model_is_a_relative_path(shipped_templates: dict[str, Template]) -> None:
    inference = shipped_templates["inference"]
    ok = {"model": "meta-llama/Llama-3-8B", "input": "hi"}
    assert inference.validate_params(ok) == {**ok, "max_tokens": 512}
    for bad in ("-rf", "../x", "/abs", "m" * 257):
        errors = errors_of(inference, {"model": bad, "input": "hi"})
        assert [e["field"] for e in errors] == ["params.model"]


def test_unknown_params_are_listed(hello: Template) -> None:
    assert errors_of(hello, {"message": "hi", "bogus": 1, "other": "x"}) == [
        {"field": "params.bogus", "message": "Extra inputs are not permitted"},
        {"field": "params.other", "message": "Extra inputs are not permitted"},
    ]


def test_missing_required_params_are_listed(shipped_templates: dict[str, Template]) -> None:
    assert errors_of(shipped_templates["inference"], {}) == [
        {"field": "params.model", "message": "Field required"},
        {"field": "params.input", "message": "Field required"},
    ]


def test_defaults_applied(shipped_templates: dict[str, Template]) -> None:
    assert shipped_templates["hello"].validate_params({}) == {"message": "hello from gpupool", "seconds": 0}
    assert shipped_templates["inference"].validate_params({"model": "m", "input": ""}) == {
        "model": "m",
        "input": "",
        "max_tokens": 512,
    }


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"seconds": "5"}, "params.seconds", "Input should be a valid integer"),
        ({"seconds": True}, "params.seconds", "Input should be a valid integer"),
        ({"seconds": 5.0}, "params.seconds", "Input should be a valid integer"),
        ({"seconds": None}, "params.seconds", "Input should be a valid integer"),
        ({"message": 5}, "params.message", "Input should be a valid string"),
        ({"message": b"bytes"}, "params.message", "Input should be a valid string"),
        ({"message": ["a"]}, "params.message", "Input should be a valid string"),
    ],
)
def test_hello_wrong_types_rejected(hello: Template, raw: dict[str, Any], field: str, message: str) -> None:
    assert errors_of(hello, raw) == [{"field": field, "message": message}]


def test_lone_surrogate_rejected(hello: Template) -> None:
    errors = errors_of(hello, {"message": "\ud800"})
    assert [e["field"] for e in errors] == ["params.message"]


@pytest.mark.parametrize("epochs", ["3", True, 2.0])
def test_train_integer_is_strict(shipped_templates: dict[str, Template], epochs: Any) -> None:
    errors = errors_of(shipped_templates["train"], {"data_dir": "/data/set1", "epochs": epochs})
    assert errors == [{"field": "params.epochs", "message": "Input should be a valid integer"}]


def test_train_number_accepts_int_and_float(shipped_templates: dict[str, Template]) -> None:
    train = shipped_templates["train"]
    assert train.validate_params({"data_dir": "/d", "learning_rate": 1})["learning_rate"] == 1.0
    assert train.validate_params({"data_dir": "/d", "learning_rate": 0.5})["learning_rate"] == 0.5
    assert errors_of(train, {"data_dir": "/d", "learning_rate": 1.5}) == [
        {"field": "params.learning_rate", "message": "Input should be less than or equal to 1"}
    ]


@pytest.mark.parametrize("learning_rate", [True, "0.1"])
def test_train_number_rejects_bool_and_string(shipped_templates: dict[str, Template], learning_rate: Any) -> None:
    # A JSON `true` or "0.1" is not a number; the other parameter kinds are strict too.
    errors = errors_of(shipped_templates["train"], {"data_dir": "/data/set1", "learning_rate": learning_rate})
    assert [e["field"] for e in errors] == ["params.learning_rate"]


# --- loading errors, on throwaway templates --------------------------------------------


def write_template(root: Path, name: str, toml: str, body: str | None = "echo hi\n") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "template.toml").write_text(toml)
    if body is not None:
        (folder / "run.sh").write_text(body)
    return folder


@pytest.mark.parametrize(
    ("kind", "choices", "default", "other", "outside"),
    [("string", '["small", "large"]', '"small"', "large", "huge"), ("integer", "[1, 2, 4]", "1", 4, 3)],
    ids=["string", "integer"],
)
def test_choices(tmp_path: Path, kind: str, choices: str, default: str, other: Any, outside: Any) -> None:
    # "choices" is one of the documented keys of a parameter spec.
    folder = write_template(
        tmp_path, "pick", f'[params.size]\ntype = "{kind}"\nchoices = {choices}\ndefault = {default}\n'
    )
    template = load_template(folder)
    assert template.validate_params({}) == {"size": json.loads(default)}
    assert template.validate_params({"size": other}) == {"size": other}
    assert [e["field"] for e in errors_of(template, {"size": outside})] == ["params.size"]


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ('[params.x]\ntype = "string"\nmaxlen = 3\n', "unknown key(s) maxlen"),
        ('[params.x]\ntype = "list"\n', "type must be one of"),
        ('[params.X]\ntype = "string"\n', "param name 'X'"),
        ('[params.p]\ntype = "path"\npattern = "^a$"\n', "unknown key(s) pattern"),
        ('[params.p]\ntype = "path"\nchoices = ["a"]\n', "unknown key(s) choices"),
        ('[params.p]\ntype = "path"\ndefault = "../x"\n', "default '../x' must be a relative path in normal form: it has a '..' segment"),
        ('[params.p]\ntype = "path"\ndefault = 3\n', "a path's default must be a string"),
        ("[params.x\n", "is not valid TOML"),
        ("[session]\nidle_timeout_min = 0\n", "idle_timeout_min must be a whole number from 1"),
        ("[session]\nidle_timeout_min = true\n", "idle_timeout_min must be a whole number from 1"),
        ('[session]\nport = 8080\n', "[session]: unknown key(s) port"),
        ('session = "yes"\n', "[session] must be a table"),
    ],
)
def test_bad_template_toml(tmp_path: Path, toml: str, fragment: str) -> None:
    folder = write_template(tmp_path, "bad", toml)
    with pytest.raises(ConfigError) as info:
        load_template(folder)
    assert fragment in info.value.message


def test_missing_run_sh(tmp_path: Path) -> None:
    folder = write_template(tmp_path, "nobody", "", body=None)
    with pytest.raises(ConfigError, match="missing"):
        load_template(folder)


def test_bad_template_folder_name(tmp_path: Path) -> None:
    folder = write_template(tmp_path, "Bad Name", "")
    with pytest.raises(ConfigError, match="name must match"):
        load_template(folder)


def test_load_templates_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        load_templates(tmp_path / "absent")
    with pytest.raises(ConfigError, match="no templates found"):
        load_templates(tmp_path)


def test_load_templates_skips_folders_without_toml(tmp_path: Path) -> None:
    write_template(tmp_path, "real", "")
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("x")
    assert list(load_templates(tmp_path)) == ["real"]


# --- path parameters, and traversal strings against every shipped string parameter ------

# Each shipped template's smallest valid params; a test swaps one value for a hostile one.
MINIMAL_PARAMS: dict[str, dict[str, Any]] = {
    "command": {"command": "x"},
    "hello": {},
    "inference": {"model": "m", "input": "x"},
    "train": {"data_dir": "/data/set1"},
    "jupyter": {},
    "webapp": {"command": "x"},
}
TRAVERSALS = [
    "../x",
    "..",
    "../../../../etc/shadow",
    "a/../../etc/passwd",
    "a/b/..",
    "/etc/passwd",
    "/",
    "//etc/passwd",
    "~root/x",
    "~",
    "a\n..",
    "a\n/etc/passwd",
    "a\x00b",
    ".",
    "./..",
    "./x",
    "x/./y",
    "a//b",
    "x/",
    "-rf",
    "--nproc-per-node=64",
    "",
]
RELATIVE_PATHS = ["train.py", "src/train.py", "meta-llama/Llama-3-8B", "..a/b", "a..", "a.b/.c", "x~", "a b/ü.py"]
_LOADED = load_templates(SHIPPED_TEMPLATES)
STRING_PARAMS = [
    (template.name, name)
    for template in _LOADED.values()
    for name, prop in template.parameter_schema()["properties"].items()
    if prop.get("type") == "string"
]


def is_path_param(template: Template, param: str) -> bool:
    return template.parameter_schema()["properties"][param].get("format") == RELATIVE_PATH_FORMAT


def test_every_shipped_template_is_walked() -> None:
    assert MINIMAL_PARAMS.keys() == _LOADED.keys()
    assert sorted(STRING_PARAMS) == [
        ("command", "command"), ("hello", "message"), ("inference", "input"), ("inference", "model"), ("train", "data_dir"), ("train", "script"),
        ("webapp", "command"),
    ]
    paths = sorted((t, p) for t, p in STRING_PARAMS if is_path_param(_LOADED[t], p))
    assert paths == [("inference", "model"), ("train", "script")]


def run_printing(template: Template, params: dict[str, Any], param: str, job_dir: Path) -> bytes:
    """Render ``template`` with a body that prints one parameter, run it with bash, return stdout."""
    spec = JobSpec(
        job_id="j-0123456789abcdef", account="acme", name="walk", template=template.name,
        body=f'printf "%s" "${param_env_name(param)}"\n', params=params, gpus=1, gpu_type=None,
        cpus=1, mem_gb=4, time_limit_min=5, partition="gpu", job_dir=str(job_dir),
    )
    script = render(spec).script
    assert f"export {param_env_name(param)}={shell_quote(params[param])}\n" in script
    path = job_dir / "job.sbatch"
    path.write_text(script)
    result = subprocess.run(
        ["/bin/bash", str(path)], capture_output=True, cwd=job_dir, env={"PATH": "/usr/bin:/bin"}, timeout=30, check=False
    )
    assert (result.returncode, result.stderr) == (0, b"")
    return result.stdout


@pytest.mark.parametrize("value", TRAVERSALS, ids=[repr(v) for v in TRAVERSALS])
@pytest.mark.parametrize(("template_name", "param"), STRING_PARAMS, ids=[f"{t}.{p}" for t, p in STRING_PARAMS])
def test_traversal_strings_against_every_string_param(tmp_path: Path, template_name: str, param: str, value: str) -> None:
    template = _LOADED[template_name]
    raw = {**MINIMAL_PARAMS[template_name], param: value}
    if is_path_param(template, param):
        errors = errors_of(template, raw)
        assert [e["field"] for e in errors] == [f"params.{param}"]
        assert errors[0]["message"].startswith("must be a relative path in normal form: ")
        return
    try:
        params = template.validate_params(raw)
    except ValidationFailed as exc:  # refused by the parameter's own rules (data_dir's pattern, the NUL check)
        assert [e["field"] for e in exc.details["errors"]] == [f"params.{param}"]
        return
    # Accepted free text reaches the job quoted: bash hands it over byte for byte, runs nothing.
    assert run_printing(template, params, param, tmp_path) == value.encode()


@pytest.mark.parametrize("value", RELATIVE_PATHS)
def test_train_script_accepts_relative_paths(tmp_path: Path, value: str) -> None:
    train = _LOADED["train"]
    params = train.validate_params({"data_dir": "/data/set1", "script": value})
    assert run_printing(train, params, "script", tmp_path) == value.encode()


def test_train_data_dir_is_absolute_by_design() -> None:
    # Shared storage is named by absolute path; the job reads it with its own Unix permissions,
    # so only traversal and non-normal spellings are refused, not the absolute form itself.
    train = _LOADED["train"]
    accepted = [v for v in TRAVERSALS if _accepts(train, {"data_dir": v})]
    assert accepted == ["/etc/passwd"]


def _accepts(template: Template, raw: dict[str, Any]) -> bool:
    try:
        template.validate_params(raw)
    except ValidationFailed:
        return False
    return True


@pytest.mark.parametrize("value", TRAVERSALS + RELATIVE_PATHS + ["a\t", "a\x7f", "x/...", "..."], ids=repr)
def test_schema_pattern_gives_the_validators_answer(value: str) -> None:
    # fullmatch: Python's `$` also matches before a final newline, ECMA-262's does not.
    by_pattern = re.fullmatch(RELATIVE_PATH_PATTERN, value) is not None
    assert by_pattern == _accepts(_LOADED["train"], {"data_dir": "/d", "script": value})


def test_path_param_is_strict_and_bounded() -> None:
    train = _LOADED["train"]
    assert [e["message"] for e in errors_of(train, {"data_dir": "/d", "script": 5})] == ["Input should be a valid string"]
    assert [e["message"] for e in errors_of(train, {"data_dir": "/d", "script": "a" * 256})] == [
        "String should have at most 255 characters"
    ]
