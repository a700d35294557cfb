"""Invoices, usage and budgets through the API, on a ledger filled by replayed sacct output."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from bench.support.services import TENANT_PREFIX
from billing import passes
from billing.calendar import next_month_start, period_of
from billing.prices import set_price
from billing.sacct import SACCT_FIELDS
from gpupool.clock import FrozenClock
from gpupool.config import Settings
from gpupool.models import Account, Job
from tests.conftest import SUITE_NOW, bearer, new_uuid
from tests.support.sacct_dumps import as_pass_output

pytestmark = pytest.mark.calendar
# The fixture bills the month the API's clock is in, so "this month" is the invoice's month.
PERIOD = period_of(SUITE_NOW)


def day(number: int, time_of_day: str) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` on a day of PERIOD."""
    return f"{PERIOD}-{number:02d}T{time_of_day}"


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@pytest.fixture
def priced(session_factory: sessionmaker) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, utc("2020-01-01T00:00:00"))


@pytest.fixture
def billed(priced: None, session_factory: sessionmaker, settings: Settings, account: str, other_account: str, tmp_path: Path) -> None:
    """Two jobs of the caller's account (one across midnight), one of another account."""
    lines = [
        "|".join(SACCT_FIELDS),
        f"gpupool|901|901|{account}|{TENANT_PREFIX}{account}|COMPLETED|{day(3, '23:00:00')}|{day(3, '23:00:00')}|{day(4, '01:00:00')}|7200|gres/gpu:rtx4090=2,gres/gpu=2|train,\"big\"",
        f"gpupool|902|902|{account}|{TENANT_PREFIX}{account}|CANCELLED by 0|{day(5, '10:00:00')}|{day(5, '10:00:00')}|{day(5, '10:00:41')}|41|gres/gpu:rtx4090=1,gres/gpu=1|short",
        f"gpupool|903|903|{other_account}|{TENANT_PREFIX}{other_account}|COMPLETED|{day(5, '10:00:00')}|{day(5, '10:00:00')}|{day(5, '11:00:00')}|3600|gres/gpu:rtx4090=4,gres/gpu=4|secret",
    ]
    dump = tmp_path / "month.psv"
    dump.write_text(as_pass_output(lines))
    passes.replay(session_factory, settings.replace(billing_archive_dir=str(tmp_path / "archive")), dump)


def test_invoice_is_a_csv_attachment_of_the_callers_own_lines(client: FlaskClient, billed: None, settings: Settings, account: str) -> None:
    response = client.get(f"/invoices/{PERIOD}", headers=bearer(settings, account))
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"] == f'attachment; filename="gpupool-invoice-{account}-{PERIOD}.csv"'
    lines = list(csv.reader(io.StringIO(response.get_data(as_text=True), newline="")))
    assert [line[2:4] + line[6:12] for line in lines[1:]] == [
        ["901", 'train,"big"', day(3, "23:00:00Z"), day(4, "01:00:00Z"), "7200", "14400", "0.00012", "1.73"],
        ["902", "short", day(5, "10:00:00Z"), day(5, "10:00:41Z"), "41", "41", "0.00012", "0.00"],
        ["", "", "", "", "7241", "14441", "", "1.73"],
    ]
    assert "secret" not in response.get_data(as_text=True)


def test_customers_never_see_another_accounts_invoice_or_usage(
    client: FlaskClient, billed: None, settings: Settings, account: str, other_account: str
) -> None:
    mine = bearer(settings, account)
    for path in (f"/invoices/{PERIOD}?account={other_account}", f"/usage?period={PERIOD}&account={other_account}", "/usage?account=nosuch"):
        response = client.get(path, headers=mine)
        assert response.status_code == 404, path
        assert response.get_json()["error"] == "not_found"
    admin = bearer(settings, account, sub="ops", role="admin")
    theirs = client.get(f"/invoices/{PERIOD}?account={other_account}", headers=admin)
    assert theirs.status_code == 200 and "secret" in theirs.get_data(as_text=True)
    assert client.get(f"/invoices/{PERIOD}?account=nosuch", headers=admin).status_code == 404


@pytest.mark.parametrize("period", ["2026-13", "2026-1", "nov", "2026-11-01"])
def test_a_malformed_period_is_a_400(client: FlaskClient, settings: Settings, account: str, period: str) -> None:
    for path in (f"/invoices/{period}", f"/usage?period={period}"):
        response = client.get(path, headers=bearer(settings, account))
        assert response.status_code == 400, path
        assert response.get_json()["error"] == "bad_period"
        assert "YYYY-MM" in response.get_json()["message"]


def test_usage_by_type_and_by_day_agrees_with_the_invoice(
    client: FlaskClient, billed: None, settings: Settings, account: str, session_factory: sessionmaker
) -> None:
    with session_factory() as session, session.begin():
        session.get(Account, account).monthly_limit_nanos = 50 * 10**9  # type: ignore[union-attr]
    body = client.get(f"/usage?period={PERIOD}", headers=bearer(settings, account)).get_json()
    assert body["gpu_seconds"] == 14441
    assert body["by_gpu_type"] == [{"gpu_type": "rtx4090", "gpu_seconds": 14441, "amount": "1.73292"}]
    assert body["by_day"] == [
        {"date": day(3, "")[:10], "gpu_seconds": 7200, "amount": "0.864"},
        {"date": day(4, "")[:10], "gpu_seconds": 7200, "amount": "0.864"},
        {"date": day(5, "")[:10], "gpu_seconds": 41, "amount": "0.00492"},
    ]
    assert (body["charges"], body["adjustments"], body["total"]) == ("1.73", "0.00", "1.73")
    assert body["balance"]["monthly_limit"] == "50.00"
    # The fixture's month is the API clock's month: all of it was spent this month.
    assert body["balance"]["spent_total"] == body["balance"]["spent_this_month"] == "1.73292"
    assert body["balance"]["remaining"] == "48.26708"
    # The default period is the clock's month too.
    assert client.get("/usage", headers=bearer(settings, account)).get_json() == body


def test_this_month_follows_the_api_clock_into_the_next_month(
    client: FlaskClient, billed: None, settings: Settings, account: str, session_factory: sessionmaker, clock: FrozenClock
) -> None:
    """A month later the same spend is no longer this month's: the monthly limit is whole again."""
    with session_factory() as session, session.begin():
        session.get(Account, account).monthly_limit_nanos = 50 * 10**9  # type: ignore[union-attr]
    following = next_month_start(SUITE_NOW)
    clock.set(following)
    body = client.get("/usage", headers=bearer(settings, account)).get_json()
    assert body["period"] == period_of(following) != PERIOD
    assert (body["gpu_seconds"], body["total"]) == (0, "0.00")
    assert body["balance"]["spent_total"] == "1.73292"
    assert body["balance"]["spent_this_month"] == "0.00"
    assert body["balance"]["remaining"] == "50.00"
    clock.set(following - dt.timedelta(seconds=1))
    last_second = client.get("/usage", headers=bearer(settings, account)).get_json()
    assert (last_second["period"], last_second["balance"]["spent_this_month"]) == (PERIOD, "1.73292")


def test_submit_is_402_when_the_budget_is_spent_or_the_worst_case_does_not_fit(
    client: FlaskClient, billed: None, settings: Settings, account: str, session_factory: sessionmaker
) -> None:
    headers = bearer(settings, account)
    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 1_700_000_000  # type: ignore[union-attr]  # 1.70 < 1.73 spent
    spent = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1})
    assert spent.status_code == 402
    assert spent.get_json()["error"] == "payment_required"
    assert "no budget left" in spent.get_json()["message"]

    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 3_000_000_000  # type: ignore[union-attr]  # 1.27 left
    # 4 GPUs x 60 min x 0.00012 = 1.728 > 1.27
    too_big = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 4, "time_limit_min": 60})
    assert too_big.status_code == 402
    assert too_big.get_json()["required"] == "1.728"
    assert "fewer GPUs or a shorter time limit" in too_big.get_json()["message"]
    # 1 GPU x 60 min = 0.432 fits; a second such job still fits (0.864), a third does not (1.296).
    for _ in range(2):
        fits = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "time_limit_min": 60, "params": {"seconds": 60}})
        assert fits.status_code == 201, fits.get_json()
    third = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "time_limit_min": 60})
    assert third.status_code == 402


def unfinished_job(session_factory: sessionmaker, account: str, slurm_job_id: int | None, time_limit_min: int) -> str:
    """A 1-GPU job's row as the refresher last left it: RUNNING (or PENDING), not finished."""
    job_id = new_uuid()
    created = utc(day(1, "00:00:00"))
    with session_factory() as session, session.begin():
        session.add(
            Job(
                id=job_id, account=account, owner="alice", name="queued", template="hello", params={}, gpus=1,
                gpu_type=None, cpus=1, mem_gb=4, time_limit_min=time_limit_min, job_dir=f"/nonexistent/{job_id}",
                request_hash="0" * 64, slurm_job_id=slurm_job_id, state="PENDING" if slurm_job_id is None else "RUNNING",
                finished=False, submitted_at=created, submit_attempted_at=created, created_at=created, updated_at=created,
            )
        )
    return job_id


def test_queued_jobs_count_their_worst_case_less_what_is_billed_and_never_below_nothing(
    client: FlaskClient, priced: None, settings: Settings, account: str, session_factory: sessionmaker, tmp_path: Path
) -> None:
    # Billed 30 min of their runs (0.216 each), their rows not yet finished by a refresh: one with a
    # 60 min limit (0.432 worst case, 0.216 still to come), one with 10 min, billed past its 0.072.
    unfinished_job(session_factory, account, 911, time_limit_min=60)
    unfinished_job(session_factory, account, 912, time_limit_min=10)
    for _ in range(2):
        unfinished_job(session_factory, account, None, time_limit_min=60)  # queued, nothing billed: 0.432 each
    lines = [
        "|".join(SACCT_FIELDS),
        *(
            f"gpupool|{slurm_id}|{slurm_id}|{account}|{TENANT_PREFIX}{account}|COMPLETED|{day(3, '10:00:00')}|"
            f"{day(3, '10:00:00')}|{day(3, '10:30:00')}|1800|gres/gpu:rtx4090=1,gres/gpu=1|queued"
            for slurm_id in (911, 912)
        ),
    ]
    dump = tmp_path / "month.psv"
    dump.write_text(as_pass_output(lines))
    passes.replay(session_factory, settings.replace(billing_archive_dir=str(tmp_path / "archive")), dump)
    # Spent 0.432; still to come 0.216 + 0 + 2 x 0.432 = 1.08; a 1-GPU hour asks for 0.432 more.
    headers = bearer(settings, account)
    one_gpu_hour = {"template": "hello", "gpus": 1, "time_limit_min": 60, "params": {"seconds": 0}}
    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 1_943_000_000  # type: ignore[union-attr]
    short = client.post("/submit", headers=headers, json=one_gpu_hour)
    assert short.status_code == 402
    assert (short.get_json()["remaining"], short.get_json()["required"]) == ("0.431", "0.432")
    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 1_944_000_000  # type: ignore[union-attr]
    fits = client.post("/submit", headers=headers, json=one_gpu_hour)
    assert fits.status_code == 201, fits.get_json()
