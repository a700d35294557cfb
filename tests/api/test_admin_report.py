"""GET /admin/report: the operator report for admin tokens, and nothing at all for anyone else."""

from __future__ import annotations

import datetime as dt

import pytest
from flask.testing import FlaskClient

from billing.calendar import month_start, next_month_start
from gpupool.config import Settings
from gpupool.slurm.parse import parse_delimited, parse_gres
from tests.conftest import SUITE_NOW, bearer, slurm_cmd

pytestmark = pytest.mark.calendar


def test_an_admin_gets_the_report_of_a_month(client: FlaskClient, settings: Settings, account: str) -> None:
    admin = bearer(settings, account, sub="root", role="admin")
    answer = client.get("/admin/report?period=2026-11", headers=admin)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "private, no-store"
    body = answer.get_json()
    assert (body["since"], body["until"]) == ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    for key in (
        "revenue_by_account", "revenue_by_gpu_type", "revenue_by_day", "adjustments", "gpu_hours_sold",
        "utilization_by_node", "utilization_by_gpu_type", "queue_wait", "waiting_now", "payback",
    ):
        assert key in body
    # Every node with GPUs, as sinfo itself lists them.
    sinfo = parse_delimited(slurm_cmd("sinfo", "--Node", "-o", "%N|%G"))
    expected = {row["NODELIST"]: sum(g.count for g in parse_gres(row["GRES"]) if g.name == "gpu") for row in sinfo}
    assert {line["node"]: line["gpus"] for line in body["utilization_by_node"] if line["gpus"]} == {
        node: gpus for node, gpus in expected.items() if gpus
    }


def test_a_range_and_malformed_windows(client: FlaskClient, settings: Settings, account: str) -> None:
    admin = bearer(settings, account, sub="root", role="admin")
    since = (SUITE_NOW - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ok = client.get(f"/admin/report?since={since}", headers=admin)
    assert ok.status_code == 200 and ok.get_json()["since"] == since
    # With no window at all: the month the API's clock is in.
    this_month = client.get("/admin/report", headers=admin).get_json()
    assert (this_month["since"], this_month["until"]) == (
        month_start(SUITE_NOW).strftime("%Y-%m-%dT%H:%M:%SZ"), next_month_start(SUITE_NOW).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    for query, code in (("period=2026-13", "bad_period"), ("period=2026-11&since=2026-11-01", "bad_window"),
                        ("since=2026-11-02&until=2026-11-01", "bad_window"), ("since=soon", "bad_window")):
        refused = client.get(f"/admin/report?{query}", headers=admin)
        assert refused.status_code == 400 and refused.get_json()["error"] == code, (query, refused.get_json())


def test_a_customer_gets_the_same_404_as_for_a_path_that_does_not_exist(client: FlaskClient, auth: dict[str, str]) -> None:
    report = client.get("/admin/report", headers=auth)
    unknown = client.get("/admin/nothing-here", headers=auth)
    assert report.status_code == unknown.status_code == 404
    assert report.get_json() == unknown.get_json()
    assert client.get("/admin/report").status_code == 401
