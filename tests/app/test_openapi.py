from __future__ import annotations

from flask import Flask
from flask.testing import FlaskClient

from api.auth import PAGE_BLUEPRINTS, PROXY_BLUEPRINTS
from api.routing import openapi_path
from api.schemas import SubmitRequest
from tests.conftest import REPO

PAGE_ENDPOINT_PREFIXES = PAGE_BLUEPRINTS | {"web_root"}


def test_document_covers_every_route_and_uses_the_validating_schemas(app: Flask, client: FlaskClient) -> None:
    doc = client.get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    # The web pages (api.web) are HTML for browsers, and the sessions' proxy endpoints answer nginx
    # alone (its key, else 404): neither is part of the JSON API. /docs is documented; the script
    # and styles its page loads are not.
    routes = {
        (openapi_path(rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.endpoint not in ("docs.init_script", "docs.asset")
        and rule.endpoint.split(".")[0] not in PAGE_ENDPOINT_PREFIXES | PROXY_BLUEPRINTS
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert routes == documented
    expected = SubmitRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    # The operator's templates (here the shipped ones) are the only names the document allows.
    expected["properties"]["template"]["enum"] = sorted(path.name for path in (REPO / "slurm_templates").iterdir())
    assert expected["properties"]["template"]["enum"] == ["command", "hello", "inference", "jupyter", "train", "webapp"]
    # Nested models (the array request) are components of their own, referenced from it.
    for name, schema in expected.pop("$defs", {}).items():
        assert doc["components"]["schemas"][name] == schema
    assert doc["components"]["schemas"]["SubmitRequest"] == expected
    assert doc["components"]["schemas"]["HelloParams"]["properties"]["seconds"]["maximum"] == 3600
    submit = doc["paths"]["/submit"]["post"]
    assert {"201", "400", "401", "409", "413", "415", "422", "429", "503"} <= set(submit["responses"])


def test_templates_endpoint_lists_parameter_schemas(client: FlaskClient, auth: dict[str, str]) -> None:
    templates = {t["name"]: t for t in client.get("/templates", headers=auth).get_json()["templates"]}
    assert {"hello", "inference", "train"} <= set(templates)
    hello = templates["hello"]["params_schema"]
    assert hello["properties"]["seconds"]["minimum"] == 0
    assert hello["additionalProperties"] is False
    assert templates["inference"]["max_gpus"] == 1
    assert templates["train"]["params_schema"]["required"] == ["data_dir"]


def test_logs_endpoint_documents_offset_reads(client: FlaskClient) -> None:
    logs = client.get("/openapi.json").get_json()["paths"]["/jobs/{job_id}/logs"]["get"]
    params = {param["name"]: param for param in logs["parameters"]}
    assert set(params) == {"job_id", "stream", "tail", "offset", "limit"}
    assert params["offset"]["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 2**53 - 1}
    ok = logs["responses"]["200"]
    assert set(ok["headers"]) == {"Gpupool-Job-State", "Gpupool-Next-Offset", "Gpupool-Log-Complete"}
    assert ok["headers"]["Gpupool-Log-Complete"]["schema"] == {"enum": ["true", "false"]}
    assert "409" in logs["responses"]


def test_path_parameters_are_marked_in_template_schemas(client: FlaskClient) -> None:
    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]
    for model, param in (("TrainParams", "script"), ("InferenceParams", "model")):
        assert schemas[model]["properties"][param]["format"] == "relative-path"
        assert "pattern" in schemas[model]["properties"][param]
