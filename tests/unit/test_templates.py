"""The shipped templates and the schema machinery behind them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import ConfigError, ValidationFailed
from gpupool.templates import Template, load_template, load_templates

SHIPPED_TEMPLATES = Path(__file__).resolve().parents[2] / "slurm_templates"

TRAIN_DATA_DIR_PATTERN = "^(/[A-Za-z0-9_][A-Za-z0-9._-]{0,254}){1,32}$"


def errors_of(template: Template, raw: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ValidationFailed) as info:
        template.validate_params(raw)
    assert info.value.code == "validation_failed"
    assert f"invalid params for template {template.name!r}" in info.value.message
    return info.value.details["errors"]


# --- the three shipped templates -------------------------------------------------------


def test_shipped_templates_load(shipped_templates: dict[str, Template]) -> None:
    assert list(shipped_templates) == ["hello", "inference", "train"]
    for name, template in shipped_templates.items():
        assert template.name == name
        assert template.body == (SHIPPED_TEMPLATES / name / "run.sh").read_text()
        assert template.description


@pytest.mark.parametrize(
    ("name", "min_gpus", "max_gpus", "default_gpus"),
    [("hello", 1, None, 1), ("inference", 1, 1, 1), ("train", 1, None, 2)],
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
    assert props["model"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$"
    assert props["model"]["maxLength"] == 4096  # the default cap
    assert props["input"]["maxLength"] == 65536
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


def test_inference_model_pattern(shipped_templates: dict[str, Template]) -> None:
    inference = shipped_templates["inference"]
    ok = {"model": "meta-llama/Llama-3-8B", "input": "hi"}
    assert inference.validate_params(ok) == {**ok, "max_tokens": 512}
    for bad in ("-rf", "../x", "a b", "/abs"):
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
        ("[params.x\n", "is not valid TOML"),
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
