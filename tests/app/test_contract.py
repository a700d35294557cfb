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


def test_an_audit_page_of_zero_is_refused_as_its_minimum_says(client: FlaskClient, auth: dict[str, str]) -> None:
    limit = next(p for p in document(client)["paths"]["/account/audit"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["minimum"] == 1
    body = assert_error(client.get("/account/audit?limit=0", headers=auth), 422)
    assert "limit must be between 1 and" in body["message"]
    assert client.get("/account/audit?limit=1", headers=auth).status_code == 200


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
