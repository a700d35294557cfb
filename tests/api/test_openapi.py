from __future__ import annotations

import re

from flask import Flask
from flask.testing import FlaskClient

from api.schemas import SubmitRequest


def test_document_covers_every_route_and_uses_the_validating_schemas(app: Flask, client: FlaskClient) -> None:
    doc = client.get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    routes = {
        (re.sub(r"<(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert routes == documented
    expected = SubmitRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    expected["properties"]["template"]["enum"] = ["envdump", "fail", "hello", "inference", "train"]
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
