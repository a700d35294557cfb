"""The OpenAPI document tells the truth about what the API refuses: each case a schema-driven generator found.

Each answer here is a documented 4xx with the one error body, never a 500 or an
answer the document does not list, and what the document allows is accepted.
"""

from __future__ import annotations

from flask.testing import FlaskClient

from tests.support.http import assert_error


def document(client: FlaskClient) -> dict:
    return client.get("/openapi.json").get_json()


def test_a_period_outside_the_calendar_is_a_400_not_a_500(client: FlaskClient, auth: dict[str, str]) -> None:
    # Year 0 has no datetime: the invoice's month boundaries once raised inside the stream.
    for period in ("0000-01", "1969-12", "3000-01", "2026-13", "2026-1"):
        assert_error(client.get(f"/invoices/{period}", headers=auth), 400, "bad_period")
    with client.get("/invoices/2999-12", headers=auth) as invoice:
        assert invoice.status_code == 200 and invoice.mimetype == "text/csv"
    pattern = document(client)["paths"]["/invoices/{period}"]["get"]["parameters"][0]["schema"]["pattern"]
    assert pattern == "^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])$"


def test_an_empty_period_is_refused_as_its_pattern_says(client: FlaskClient, auth: dict[str, str]) -> None:
    assert_error(client.get("/usage?period=", headers=auth), 400, "bad_period")
    assert client.get("/usage", headers=auth).status_code == 200  # left out: this month


def test_an_audit_page_outside_its_declared_bounds_is_refused(client: FlaskClient, auth: dict[str, str]) -> None:
    parameters = {p["name"]: p["schema"] for p in document(client)["paths"]["/account/audit"]["get"]["parameters"]}
    assert parameters["limit"]["minimum"] == 1 and parameters["before"] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
    body = assert_error(client.get("/account/audit?limit=0", headers=auth), 400, "bad_request")
    assert "limit must be between 1 and" in body["message"]
    assert_error(client.get("/account/audit?before=0", headers=auth), 400, "bad_request")
    # A page before a number past any event's is empty, not a refusal of a number the document allows.
    assert client.get(f"/account/audit?before={2**63 - 1}&limit=1", headers=auth).get_json()["events"] == []
    assert_error(client.get(f"/account/audit?before={2**63}", headers=auth), 400, "bad_request")


def test_a_query_parameter_given_twice_is_refused_whichever_the_route(client: FlaskClient, auth: dict[str, str]) -> None:
    for path in ("/jobs?limit=5&limit=6", "/account/audit?before=3&before=4", "/usage?period=2026-01&period=2026-02"):
        body = assert_error(client.get(path, headers=auth), 400, "bad_request")
        assert "given more than once" in body["message"]


def test_every_operation_with_a_token_documents_its_400_and_403(client: FlaskClient) -> None:
    # 400: a parameter given twice, whatever the route; 403: a role or a key's scope.
    doc = document(client)
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if operation.get("security", doc["security"]):
                assert {"400", "403"} <= set(operation["responses"]), (method, path)


def test_an_empty_cursor_is_no_cursor_the_api_gave_out(client: FlaskClient, auth: dict[str, str]) -> None:
    assert_error(client.get("/jobs?cursor=", headers=auth), 400, "bad_request")


def test_a_whole_number_written_2_0_is_the_integer_the_document_says(client: FlaskClient, auth: dict[str, str]) -> None:
    # JSON Schema's "integer" takes 2.0; strict validation keeps refusing "2" and 1.5.
    accepted = client.put("/account/alerts", headers=auth, json={"thresholds": [50.0, 100], "forecast_hours": 48.0})
    assert accepted.status_code == 200, accepted.get_json()
    assert (accepted.get_json()["thresholds"], accepted.get_json()["forecast_hours"]) == ([50, 100], 48)
    for bad in ({"thresholds": ["50"]}, {"thresholds": [50.5]}, {"forecast_hours": True}):
        assert_error(client.put("/account/alerts", headers=auth, json=bad), 422)


def test_a_key_or_member_limited_to_templates_names_only_the_operators_templates(client: FlaskClient) -> None:
    schemas = document(client)["components"]["schemas"]
    for model in ("KeyCreate", "MemberIn"):
        (array,) = [option for option in schemas[model]["properties"]["templates"]["anyOf"] if option.get("type") == "array"]
        assert array["items"]["enum"] == ["command", "hello", "inference", "jupyter", "train", "webapp"], model


def test_naming_an_account_the_caller_cannot_see_is_a_documented_404(client: FlaskClient, auth: dict[str, str]) -> None:
    assert "404" in document(client)["paths"]["/jobs"]["get"]["responses"]
    for query in ("account=", "account=someone-else"):
        assert_error(client.get(f"/jobs?{query}", headers=auth), 404, "not_found")


def test_alert_thresholds_are_a_list_or_left_out_and_the_document_offers_nothing_else(
    client: FlaskClient, auth: dict[str, str]
) -> None:
    thresholds = document(client)["components"]["schemas"]["AlertsIn"]["properties"]["thresholds"]
    assert thresholds["type"] == "array" and "anyOf" not in thresholds
    body = assert_error(client.put("/account/alerts", headers=auth, json={"thresholds": None}), 422)
    assert "leave thresholds out" in body["message"]
    assert client.put("/account/alerts", headers=auth, json={"thresholds": [50, 100]}).status_code == 200
