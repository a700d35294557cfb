"""The web pages through Flask's test client, on the real database and cluster.

Sign-in, the session cookie's flags, CSRF, tenant rules and escaping; the
browser suite (tests/live/test_browser.py) drives the same pages in Chromium.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from pathlib import Path

import jwt
import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from werkzeug.http import parse_date
from werkzeug.test import TestResponse

from bench.support.services import TENANT_PREFIX
from billing import passes
from billing.calendar import period_of
from billing.prices import set_price
from billing.sacct import SACCT_FIELDS
from gpupool.config import Settings
from gpupool.models import Job, WebSession
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import revoke_token
from tests.conftest import SUITE_NOW, bearer, create_app_for_tests, recorded_token, wait_for
from tests.support.sacct_dumps import as_pass_output

SCRIPT_NAME = "<script>alert(1)</script>"
# The billed fixture bills this past month; the pages are asked for it by name.
PERIOD = "2026-11"
pytestmark = pytest.mark.calendar
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(page: TestResponse) -> str:
    found = CSRF.search(page.get_data(as_text=True))
    assert found, page.get_data(as_text=True)
    return found.group(1)


def sign_in(client: FlaskClient, token: str) -> TestResponse:
    form = client.get("/ui/signin")
    return client.post("/ui/signin", data={"csrf_token": csrf_of(form), "token": token})


def session_cookie_header(response: TestResponse) -> str:
    cookies = [value for value in response.headers.getlist("Set-Cookie") if value.startswith("gpupool_session=")]
    assert len(cookies) == 1, response.headers.getlist("Set-Cookie")
    return cookies[0]


def signed_in(client: FlaskClient, settings: Settings, account: str, **token_args: str) -> FlaskClient:
    assert sign_in(client, recorded_token(settings, account, **token_args)).status_code == 303
    return client


def api_submit(client: FlaskClient, headers: dict[str, str], **body: object) -> str:
    response = client.post("/submit", headers=headers, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()["job_id"]


def test_sign_in_sets_a_strict_httponly_cookie_that_expires_with_the_token(
    client: FlaskClient, settings: Settings, account: str
) -> None:
    token = recorded_token(settings, account, ttl_s=1800)
    answer = sign_in(client, token)
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/ui/jobs"
    cookie = session_cookie_header(answer)
    attributes = [part.strip() for part in cookie.split(";")]
    assert "HttpOnly" in attributes
    assert "SameSite=Strict" in attributes
    assert "Path=/ui" in attributes
    assert "Secure" not in attributes  # plain http: a Secure cookie would never come back
    expires = next(part.split("=", 1)[1] for part in attributes if part.startswith("Expires="))
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    assert parse_date(expires) == dt.datetime.fromtimestamp(exp, dt.UTC)
    assert client.get("/ui/jobs").status_code == 200


def test_the_cookie_is_secure_over_tls(app: object, settings: Settings, account: str) -> None:
    client = app.test_client()  # type: ignore[attr-defined]
    form = client.get("/ui/signin", base_url="https://gpupool.example")
    answer = client.post(
        "/ui/signin",
        base_url="https://gpupool.example",
        data={"csrf_token": csrf_of(form), "token": recorded_token(settings, account)},
    )
    assert answer.status_code == 303
    assert "Secure" in [part.strip() for part in session_cookie_header(answer).split(";")]


def test_the_json_api_ignores_the_page_cookie(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account)
    # The cookie is scoped to /ui, and the API wants a bearer token whatever a browser sends.
    response = client.get("/jobs")
    assert response.status_code == 401
    assert response.get_json()["error"] == "unauthorized"


def test_a_bad_token_is_refused_on_the_page(client: FlaskClient, settings: Settings, account: str) -> None:
    token = recorded_token(settings, account)
    answer = sign_in(client, token[:-4] + "AAAA")
    assert answer.status_code == 401
    assert "the token&#39;s signature does not verify" in answer.get_data(as_text=True)
    assert client.get("/ui/jobs").status_code == 302


def test_signing_out_ends_the_session(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account)
    jobs_page = client.get("/ui/jobs")
    answer = client.post("/ui/signout", data={"csrf_token": csrf_of(jobs_page)})
    assert answer.status_code == 303 and answer.headers["Location"] == "/ui/signin"
    later = client.get("/ui/jobs")
    assert later.status_code == 302
    assert later.headers["Location"] == "/ui/signin?next=/ui/jobs"
    assert client.get("/ui/data/jobs").get_json() == {"error": "session_ended", "message": "sign in again: the session has ended"}


def page_cookie(client: FlaskClient) -> str:
    cookie = client.get_cookie("gpupool_session", path="/ui")
    assert cookie is not None
    return cookie.value


def test_the_cookie_holds_a_session_id_not_the_token(app: Flask, settings: Settings, account: str) -> None:
    client = app.test_client()
    token = recorded_token(settings, account)
    assert sign_in(client, token).status_code == 303
    value = page_cookie(client)
    contents = app.session_interface.get_signing_serializer(app).loads(value)  # type: ignore[attr-defined]
    assert set(contents) == {"sid", "csrf", "expires_at"}
    for part in (token, *token.split(".")):
        assert part not in value and part not in str(contents)
    with app.extensions["gpupool"].session_factory() as database:
        # The database keeps only the id's hash, so a copy of the table signs nobody in either.
        hashes = set(database.scalars(select(WebSession.id_hash)))
    assert contents["sid"] not in hashes and len(hashes) == 1


def test_a_signed_out_cookie_replayed_gets_the_sign_in_page(app: Flask, settings: Settings, account: str) -> None:
    client = app.test_client()
    signed_in(client, settings, account)
    old_cookie = page_cookie(client)
    answer = client.post("/ui/signout", data={"csrf_token": csrf_of(client.get("/ui/jobs"))})
    assert answer.status_code == 303

    replayed = app.test_client()
    replayed.set_cookie("gpupool_session", old_cookie, path="/ui")
    page = replayed.get("/ui/jobs")
    assert page.status_code == 302 and page.headers["Location"] == "/ui/signin?next=/ui/jobs"
    replayed.set_cookie("gpupool_session", old_cookie, path="/ui")
    data = replayed.get("/ui/data/jobs")
    assert data.status_code == 401
    assert data.get_json() == {"error": "session_ended", "message": "sign in again: the session has ended"}


def test_each_sign_in_is_its_own_session(app: Flask, settings: Settings, account: str) -> None:
    token = recorded_token(settings, account)
    first, second = app.test_client(), app.test_client()
    assert sign_in(first, token).status_code == 303 and sign_in(second, token).status_code == 303
    assert first.post("/ui/signout", data={"csrf_token": csrf_of(first.get("/ui/jobs"))}).status_code == 303
    assert first.get("/ui/jobs").status_code == 302
    assert second.get("/ui/jobs").status_code == 200  # signing out one browser leaves the other signed in


def test_a_revoked_token_ends_the_session(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    client = create_app_for_tests(settings.replace(token_check_cache_s=0), slurm, session_factory).test_client()
    token = recorded_token(settings, account)
    assert sign_in(client, token).status_code == 303
    assert client.get("/ui/jobs").status_code == 200
    with session_factory() as session, session.begin():
        jti = jwt.decode(token, options={"verify_signature": False})["jti"]
        revoke_token(session, jti, by="test", reason="leaked", now=dt.datetime.now(dt.UTC))
    assert client.get("/ui/jobs").status_code == 302
    assert client.get("/ui/data/jobs").status_code == 401


@pytest.mark.parametrize("sent", [None, "forged"])
def test_a_form_without_its_csrf_token_is_refused(
    client: FlaskClient, settings: Settings, account: str, session_factory: sessionmaker, sent: str | None
) -> None:
    signed_in(client, settings, account)
    form = {"template": "hello", "param.message": "hi", "gpus": "1"}
    if sent is not None:
        form["csrf_token"] = sent
    answer = client.post("/ui/submit", data=form)
    assert answer.status_code == 403
    assert answer.mimetype == "text/html"
    body = answer.get_data(as_text=True)
    assert "403: csrf_failed" in body and "this form is out of date" in body
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == 0
    # Signing out is a form too: without the token the session stays.
    assert client.post("/ui/signout").status_code == 403
    assert client.get("/ui/jobs").status_code == 200


def test_pages_carry_the_security_headers(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account)
    for path in ("/ui/signin", "/ui/jobs", "/ui/usage", "/ui/data/jobs", "/ui/static/jobs.js"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'"), path
        assert response.headers["X-Frame-Options"] == "DENY", path
        assert response.headers["Referrer-Policy"] == "no-referrer", path


def test_another_accounts_job_is_a_404(
    client: FlaskClient, settings: Settings, account: str, other_account: str
) -> None:
    theirs = api_submit(client, bearer(settings, other_account), template="hello", name="their secret job")
    signed_in(client, settings, account)
    page = client.get(f"/ui/jobs/{theirs}")
    assert page.status_code == 404
    assert page.mimetype == "text/html"
    assert "their secret job" not in page.get_data(as_text=True)
    assert client.get(f"/ui/data/jobs/{theirs}").get_json()["error"] == "not_found"
    assert client.get(f"/ui/data/jobs/{theirs}/logs?stream=stdout&offset=0").status_code == 404
    assert "their secret job" not in client.get("/ui/jobs").get_data(as_text=True)


def test_customer_text_is_escaped(client: FlaskClient, settings: Settings, account: str) -> None:
    job_id = api_submit(
        client, bearer(settings, account), template="hello", name=SCRIPT_NAME, params={"message": SCRIPT_NAME}
    )
    signed_in(client, settings, account)
    escaped = html.escape(SCRIPT_NAME, quote=False)
    for path in ("/ui/jobs", f"/ui/jobs/{job_id}"):
        body = client.get(path).get_data(as_text=True)
        assert escaped in body, path
        assert SCRIPT_NAME not in body, path


def test_a_customer_does_not_see_the_operator_pages(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account)
    for path in ("/ui/admin/report", "/ui/admin/nodes", "/ui/admin/accounts"):
        assert client.get(path).status_code == 404, path
    assert "Operator:" not in client.get("/ui/jobs").get_data(as_text=True)


def test_an_admin_sees_nodes_and_accounts(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account, sub="ops", role="admin")
    nodes = client.get("/ui/admin/nodes")
    assert nodes.status_code == 200
    for node in SlurmClient(settings).node_gpus():
        assert f'data-node="{node.name}"' in nodes.get_data(as_text=True)
    accounts = client.get("/ui/admin/accounts").get_data(as_text=True)
    assert f'data-account="{account}"' in accounts


def test_submit_from_the_form_runs_the_job(
    client: FlaskClient, settings: Settings, account: str, session_factory: sessionmaker
) -> None:
    signed_in(client, settings, account)
    form = client.get("/ui/submit?template=hello")
    assert 'name="param.message"' in form.get_data(as_text=True)
    fields = {
        "csrf_token": csrf_of(form),
        "template": "hello",
        "submission": re.search(r'name="submission" value="([^"]+)"', form.get_data(as_text=True)).group(1),  # type: ignore[union-attr]
        "param.message": "from the form",
        "param.seconds": "0",
        "gpus": "1",
        "time_limit_min": "1",
        "name": "form job",
    }
    # First the quote, with nothing created; only the body it quoted is submitted.
    quoted = client.post("/ui/submit", data={**fields, "action": "quote"})
    assert quoted.status_code == 200
    page = quoted.get_data(as_text=True)
    assert 'id="quote-gpu-seconds">60 (1 GPU(s) x 1 min)' in page and 'id="submit-button"' in page
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == 0
    fields |= {"action": "submit", "quoted": re.search(r'name="quoted" value="([^"]+)"', page).group(1)}  # type: ignore[union-attr]
    changed = client.post("/ui/submit", data={**fields, "gpus": "2"})
    assert changed.status_code == 200 and 'id="quote-gpu-seconds">120 (2 GPU(s)' in changed.get_data(as_text=True)
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == 0
    answer = client.post("/ui/submit", data=fields)
    assert answer.status_code == 303
    job_id = answer.headers["Location"].rsplit("/", 1)[1]
    # Sent twice (a double click): the form's key makes it one job.
    again = client.post("/ui/submit", data=fields)
    assert again.headers["Location"] == answer.headers["Location"]

    def finished() -> dict | None:
        view = client.get(f"/ui/data/jobs/{job_id}").get_json()
        return view if view["state"] == "COMPLETED" and view["exit_code"] is not None else None

    view = wait_for(finished, timeout_s=90, what="the form's job to complete")
    assert view["name"] == "form job" and view["params"] == {"message": "from the form", "seconds": 0}
    page = client.get(f"/ui/jobs/{job_id}").get_data(as_text=True)
    assert "from the form" in page and 'data-event="ended"' in page
    logs = client.get(f"/ui/data/jobs/{job_id}/logs?stream=stdout&offset=0")
    assert logs.get_data(as_text=True).endswith("from the form\n")
    assert logs.headers["Gpupool-Log-Complete"] == "true"


def test_an_invalid_form_is_shown_again_with_the_reason(client: FlaskClient, settings: Settings, account: str) -> None:
    signed_in(client, settings, account)
    form = client.get("/ui/submit?template=hello")
    answer = client.post(
        "/ui/submit",
        data={"csrf_token": csrf_of(form), "template": "hello", "param.message": "kept", "param.seconds": "99999", "gpus": "1"},
    )
    assert answer.status_code == 422
    body = answer.get_data(as_text=True)
    assert "params.seconds" in body and ">kept</textarea>" in body


@pytest.fixture
def billed(session_factory: sessionmaker, settings: Settings, account: str, tmp_path: Path) -> None:
    """Two GPU types over three days of PERIOD, replayed through the billing pass."""
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        set_price(session, "rtx3090", 70_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    lines = [
        "|".join(SACCT_FIELDS),
        f"gpupool|911|911|{account}|{TENANT_PREFIX}{account}|COMPLETED|{PERIOD}-03T23:00:00|{PERIOD}-03T23:00:00|{PERIOD}-04T01:00:00|7200|gres/gpu:rtx4090=2,gres/gpu=2|{SCRIPT_NAME}",
        f"gpupool|912|912|{account}|{TENANT_PREFIX}{account}|COMPLETED|{PERIOD}-04T10:00:00|{PERIOD}-04T10:00:00|{PERIOD}-04T10:30:00|1800|gres/gpu:rtx3090=1,gres/gpu=1|small",
    ]
    dump = tmp_path / "month.psv"
    dump.write_text(as_pass_output(lines))
    passes.replay(session_factory, settings.replace(billing_archive_dir=str(tmp_path / "archive")), dump)


def bars(page: str) -> list[tuple[str, str, float]]:
    return [
        (column, series, round(float(value), 4))
        for column, series, value in re.findall(r'data-column="([^"]*)" data-series="([^"]*)" data-value="([^"]*)"', page)
    ]


def test_usage_chart_stacks_gpu_hours_per_day_by_type(
    client: FlaskClient, billed: None, settings: Settings, account: str
) -> None:
    signed_in(client, settings, account)
    page = client.get(f"/ui/usage?period={PERIOD}").get_data(as_text=True)
    assert bars(page) == [("03", "rtx4090", 2.0), ("04", "rtx3090", 0.5), ("04", "rtx4090", 2.0)]
    assert 'id="gpu-hours">4.50<' in page
    # Asked for no month, the page shows the app clock's, and lists it among the invoices.
    this_month = period_of(SUITE_NOW)
    assert f'id="period" name="period" value="{this_month}"' in client.get("/ui/usage").get_data(as_text=True)
    invoice = client.get(f"/ui/invoices/{PERIOD}.csv")
    assert invoice.mimetype == "text/csv"
    assert invoice.headers["Content-Disposition"] == f'attachment; filename="gpupool-invoice-{account}-{PERIOD}.csv"'
    # A spreadsheet never runs the job name; the page never runs it either.
    assert SCRIPT_NAME in invoice.get_data(as_text=True)
    listing = client.get("/ui/invoices").get_data(as_text=True)
    assert f'data-period="{PERIOD}"' in listing and f'data-period="{this_month}"' in listing


def test_an_admin_sees_the_report_with_charts(
    client: FlaskClient, billed: None, settings: Settings, account: str
) -> None:
    signed_in(client, settings, account, sub="ops", role="admin")
    page = client.get(f"/ui/admin/report?period={PERIOD}")
    assert page.status_code == 200, page.get_data(as_text=True)
    body = page.get_data(as_text=True)
    assert 'id="revenue-by-day"' in body and 'id="utilization-by-node"' in body
    # 2 x 2 h of rtx4090 at 0.00012/s and 0.5 h of rtx3090 at 0.00007/s, each invoice line rounded: 1.73 + 0.13.
    assert f'data-column="{account}" data-value="1.86"' in body
    assert 'id="gpu-hours-sold">4.50<' in body
    # Asked for no window, the report is of the app clock's month, in which nothing was billed.
    assert 'id="gpu-hours-sold">0.00<' in client.get("/ui/admin/report").get_data(as_text=True)
    assert html.escape(SCRIPT_NAME, quote=False) not in body and SCRIPT_NAME not in body
    assert client.get("/ui/admin/report?period=2026-13").status_code == 400
