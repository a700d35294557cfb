"""Path parameters through POST /submit: traversal is a 422 and no job is made."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient


@pytest.mark.parametrize(
    ("template", "params", "field", "reason"),
    [
        ("train", {"data_dir": "/data/set1", "script": "../x/input.txt"}, "script", "it has a '..' segment"),
        ("train", {"data_dir": "/data/set1", "script": "/etc/passwd"}, "script", "it starts with '/'"),
        ("inference", {"model": "a/../../etc/passwd", "input": "x"}, "model", "it has a '..' segment"),
        ("inference", {"model": "~root/x", "input": "x"}, "model", "it starts with '~'"),
    ],
)
def test_traversal_in_a_path_parameter_is_refused(
    client: FlaskClient, auth: dict[str, str], template: str, params: dict[str, str], field: str, reason: str
) -> None:
    response = client.post("/submit", headers=auth, json={"template": template, "gpus": 1, "params": params})
    assert response.status_code == 422
    body = response.get_json()
    assert body["error"] == "validation_failed"
    assert body["errors"] == [
        {"field": f"params.{field}", "message": f"must be a relative path in normal form: {reason}"}
    ]
    assert client.get("/jobs", headers=auth).get_json()["jobs"] == []
