"""The web pages in headless Chromium (Debian's chromium and chromium-driver) against gunicorn.

A customer signs in, submits from the form, watches the job complete, reads
the usage chart and downloads the invoice; an admin reads the report. Every
page is checked for console errors, which is also how a CSP violation shows.
Screenshots go to the test's tmp folder; with GPUPOOL_DOCS_SCREENSHOTS=1 the
usage page and the report are also written to docs/ for the documentation site.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from bench.support.http import http
from bench.support.services import TENANT_PREFIX
from billing import passes
from billing.prices import set_price
from billing.sacct import SACCT_FIELDS
from gpupool import db
from gpupool.config import Settings
from gpupool.models import Account, Job
from tests.conftest import REPO, base_settings, recorded_token, wait_for
from tests.live.conftest import Server
from tests.support.sacct_dumps import as_pass_output

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCRIPT_NAME = "<script>alert(1)</script>"
PERIOD = "2025-06"
pytestmark = pytest.mark.skipif(not Path(CHROMEDRIVER).exists(), reason="apt-get install chromium chromium-driver")


@pytest.fixture
def settings(live_db: str) -> Settings:
    return base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = Options()
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1200,1000",
    ):
        options.add_argument(flag)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def billed(live_db: str, slurm_account: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A month of ledger for the account: 2 GPU-hours of rtx4090 on the 3rd, 1 on the 4th, 0.5 of rtx3090 on the 4th."""
    settings = base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")
    tmp_path = tmp_path_factory.mktemp("billed")
    engine = db.make_engine(settings.database_url)
    sessions = db.make_session_factory(engine)
    with sessions() as session, session.begin():
        set_price(session, "rtx4090", 120_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        set_price(session, "rtx3090", 70_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    first = 800_000 + secrets.randbelow(100_000)  # ids no real job of this database has
    lines = [
        "|".join(SACCT_FIELDS),
        f"gpupool|{first}|{first}|{slurm_account}|{TENANT_PREFIX}{slurm_account}|COMPLETED|2025-06-03T10:00:00|2025-06-03T10:00:00|2025-06-03T11:00:00|3600|gres/gpu:rtx4090=2,gres/gpu=2|{SCRIPT_NAME}",
        f"gpupool|{first + 1}|{first + 1}|{slurm_account}|{TENANT_PREFIX}{slurm_account}|COMPLETED|2025-06-04T10:00:00|2025-06-04T10:00:00|2025-06-04T11:00:00|3600|gres/gpu:rtx4090=1,gres/gpu=1|b",
        f"gpupool|{first + 2}|{first + 2}|{slurm_account}|{TENANT_PREFIX}{slurm_account}|COMPLETED|2025-06-04T12:00:00|2025-06-04T12:00:00|2025-06-04T12:30:00|1800|gres/gpu:rtx3090=1,gres/gpu=1|c",
    ]
    dump = tmp_path / "june.psv"
    dump.write_text(as_pass_output(lines))
    passes.replay(sessions, settings.replace(billing_archive_dir=str(tmp_path / "archive")), dump)
    with sessions() as session, session.begin():
        account = session.get(Account, slurm_account)
        assert account is not None
        account.prepaid_credit_nanos = 10 * 10**9  # so the usage page draws spend against a budget
    engine.dispose()
    return PERIOD


@pytest.fixture
def foreign_job(settings: Settings) -> Iterator[str]:
    """A job row of another account (no Slurm needed: the page refuses it before anything runs)."""
    engine = create_engine(db.normalize_url(settings.database_url))
    sessions = db.make_session_factory(engine)
    other, job_id = f"x{secrets.token_hex(4)}", str(uuid.uuid4())
    with sessions() as session, session.begin():
        session.add(Account(name=other, gpu_limit=1))
        session.flush()
        session.add(
            Job(id=job_id, account=other, owner="mallory", name="their private job", template="hello", params={}, gpus=1,
                cpus=1, mem_gb=1, time_limit_min=1, job_dir=f"/nonexistent/{job_id}", state="COMPLETED", finished=True,
                request_hash="0" * 64)
        )
    yield job_id
    engine.dispose()


def severe_console_messages(driver: WebDriver, *, allowed: tuple[str, ...] = ()) -> list[str]:
    messages = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return [message for message in messages if not any(part in message for part in allowed)]


def sign_in(driver: WebDriver, server: Server, token: str) -> None:
    driver.get(server.url + "/")
    assert driver.current_url.endswith("/ui/signin")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "signin-button").click()
    wait_for(lambda: driver.current_url.endswith("/ui/jobs"), timeout_s=15, what="the jobs page after sign-in")


def save_screenshot(driver: WebDriver, folder: Path, name: str, *, docs: bool = False) -> None:
    driver.save_screenshot(str(folder / f"{name}.png"))
    if docs and os.environ.get("GPUPOOL_DOCS_SCREENSHOTS") == "1":
        driver.save_screenshot(str(REPO / "docs" / f"{name}.png"))


def test_a_customer_submits_follows_and_is_billed(
    start_server: Callable[..., Server], browser: WebDriver, settings: Settings, slurm_account: str,
    billed: str, foreign_job: str, tmp_path: Path,
) -> None:
    server = start_server(workers=2)
    sign_in(browser, server, recorded_token(settings, slurm_account, sub="web-user"))
    assert severe_console_messages(browser) == []

    # Submit from the form generated from the hello template's schema.
    browser.get(server.url + "/ui/submit?template=hello")
    browser.find_element(By.ID, "name").send_keys(SCRIPT_NAME)
    message = browser.find_element(By.ID, "param.message")
    message.clear()
    message.send_keys("hello from the browser")
    seconds = browser.find_element(By.ID, "param.seconds")
    seconds.clear()
    seconds.send_keys("3")
    browser.find_element(By.ID, "quote-button").click()
    # The quote comes before the confirmation: the worst case and Slurm's estimate, nothing submitted yet.
    wait_for(lambda: browser.find_elements(By.ID, "quote"), timeout_s=30, what="the quote")
    assert browser.find_element(By.ID, "quote-start").text != ""
    browser.find_element(By.ID, "submit-button").click()
    wait_for(lambda: "/ui/jobs/" in browser.current_url, timeout_s=30, what="the job page after submit")
    job_url = browser.current_url

    # The job page's script follows the state and the log without a reload.
    wait_for(lambda: browser.find_element(By.ID, "job-state").text == "COMPLETED", timeout_s=120, what="COMPLETED on the job page")
    wait_for(lambda: "hello from the browser" in browser.find_element(By.ID, "log-stdout").text, timeout_s=30, what="the log")
    wait_for(lambda: browser.find_element(By.ID, "log-stdout").get_attribute("data-complete") == "true", timeout_s=30, what="the end of the log")
    assert browser.find_element(By.ID, "job-name").text == SCRIPT_NAME  # shown as text, never run
    events = [item.get_attribute("data-event") for item in browser.find_elements(By.CSS_SELECTOR, "#timeline li")]
    assert events == ["submitted", "started", "ended"]
    save_screenshot(browser, tmp_path, "job")

    browser.get(server.url + "/ui/jobs")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job_url.rsplit("/", 1)[1]}"]')
    assert row.find_element(By.CSS_SELECTOR, "td.name").text == SCRIPT_NAME
    assert "COMPLETED" in row.find_element(By.CSS_SELECTOR, "td.state").text
    # An alert would have been raised by now had the name been run as script.
    assert browser.execute_script("return document.querySelectorAll('td.name script').length") == 0

    # Usage: one bar per (day, GPU type) with sales.
    browser.get(server.url + f"/ui/usage?period={billed}")
    bars = [
        (rect.get_attribute("data-column"), rect.get_attribute("data-series"), float(rect.get_attribute("data-value")))
        for rect in browser.find_elements(By.CSS_SELECTOR, "#usage-chart rect.bar")
    ]
    assert bars == [("03", "rtx4090", 2.0), ("04", "rtx3090", 0.5), ("04", "rtx4090", 1.0)]
    assert all(rect.size["height"] > 0 for rect in browser.find_elements(By.CSS_SELECTOR, "#usage-chart rect.bar"))
    meter = browser.find_element(By.CSS_SELECTOR, ".meter")
    assert "1.422 USD" in meter.text and "10.00 USD" in meter.text
    save_screenshot(browser, tmp_path, "usage", docs=True)

    # The invoice downloads as a CSV file.
    browser.find_element(By.ID, "invoice-link").click()
    invoice = tmp_path / "downloads" / f"gpupool-invoice-{slurm_account}-{billed}.csv"
    wait_for(invoice.exists, timeout_s=30, what="the downloaded invoice")
    lines = invoice.read_text().splitlines()
    assert lines[0].startswith("line_type,") and lines[-1].startswith("total,")
    assert lines[-1].split(",")[11] == "1.42"  # 0.86 + 0.43 + 0.13: each line rounded to the cent

    assert severe_console_messages(browser) == []

    # Another account's job: the same 404 as for a job that does not exist.
    browser.get(server.url + f"/ui/jobs/{foreign_job}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "404: not_found"
    assert "their private job" not in browser.page_source
    assert severe_console_messages(browser, allowed=(f"/ui/jobs/{foreign_job} - Failed to load resource",)) == []


def test_an_admin_reads_the_report(
    start_server: Callable[..., Server], browser: WebDriver, settings: Settings, slurm_account: str, billed: str, tmp_path: Path
) -> None:
    server = start_server(workers=2)
    sign_in(browser, server, recorded_token(settings, slurm_account, sub="ops", role="admin"))
    browser.get(server.url + f"/ui/admin/report?period={billed}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Operator report"
    assert browser.find_element(By.ID, "gpu-hours-sold").text == "3.50"
    account_bars = browser.find_elements(By.CSS_SELECTOR, "#revenue-by-account rect.bar")
    # The account's invoice lines, each rounded to the cent: 0.864 -> 0.86, 0.432 -> 0.43, 0.126 -> 0.13.
    assert [(bar.get_attribute("data-column"), bar.get_attribute("data-value")) for bar in account_bars] == [(slurm_account, "1.42")]
    assert browser.find_elements(By.CSS_SELECTOR, "#revenue-by-day rect.bar")
    assert browser.find_elements(By.CSS_SELECTOR, "#utilization-by-node rect.bar")
    save_screenshot(browser, tmp_path, "report", docs=True)
    browser.get(server.url + "/ui/admin/nodes")
    assert browser.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]")
    browser.get(server.url + "/ui/admin/accounts")
    assert browser.find_element(By.CSS_SELECTOR, f'#accounts tr[data-account="{slurm_account}"]')
    assert severe_console_messages(browser) == []


@pytest.fixture
def team_account(settings: Settings) -> Iterator[str]:
    """An account of its own (no Slurm: these pages submit nothing), so its members lock out no other test's subject."""
    engine = create_engine(db.normalize_url(settings.database_url))
    name = f"t{secrets.token_hex(4)}"
    with db.make_session_factory(engine)() as session, session.begin():
        session.add(Account(name=name, gpu_limit=2))
    yield name
    engine.dispose()


def test_an_account_admin_makes_keys_and_members_and_reads_the_activity(
    start_server: Callable[..., Server], browser: WebDriver, settings: Settings, team_account: str, tmp_path: Path
) -> None:
    server = start_server(workers=2)
    sign_in(browser, server, recorded_token(settings, team_account, sub="ada"))

    # A key made on the page: its secret shown once, working as a bearer token, then revoked there.
    browser.get(server.url + "/ui/keys")
    browser.find_element(By.ID, "key-name").send_keys("ci <b>runner</b>")
    browser.find_element(By.CSS_SELECTOR, "#key-scope option[value=submit]").click()
    browser.find_element(By.ID, "key-days").send_keys("7")
    browser.find_element(By.ID, "key-create").click()
    secret = browser.find_element(By.ID, "new-key-secret").text
    assert secret.startswith("gpk_")
    assert http("GET", server.url + "/jobs", token=secret).status == 200
    browser.get(server.url + "/ui/keys")
    assert secret not in browser.page_source
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#keys tr[data-key]")
    assert row.find_element(By.CSS_SELECTOR, "td.name").text == "ci <b>runner</b>"  # text, never markup
    row.find_element(By.CSS_SELECTOR, "button.revoke").click()
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, "#keys button.revoke"), timeout_s=15, what="the revoked key")
    assert http("GET", server.url + "/jobs", token=secret).status == 401

    # Members: bob with a GPU limit of his own (ada is enrolled as the admin); a bad limit is the API's 422 message.
    browser.get(server.url + "/ui/members")
    browser.find_element(By.ID, "member-subject").send_keys("bob")
    browser.find_element(By.ID, "member-gpu-limit").send_keys("1")
    browser.find_element(By.ID, "member-save").click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#members tr[data-member="bob"]'), timeout_s=15, what="bob's row")
    rows = {row.get_attribute("data-member"): row.text for row in browser.find_elements(By.CSS_SELECTOR, "#members tr[data-member]")}
    assert set(rows) == {"ada", "bob"} and "admin" in rows["ada"] and "member 1" in rows["bob"]
    browser.find_element(By.ID, "member-subject").send_keys("carol")
    browser.find_element(By.ID, "member-monthly-limit").send_keys("lots")
    browser.find_element(By.ID, "member-save").click()
    # The form posts and the page comes back with the error: wait for that page, not the one clicked on.
    (error,) = wait_for(lambda: browser.find_elements(By.ID, "member-error"), timeout_s=15, what="the member form's error")
    assert "monthly_limit" in error.text
    browser.get(server.url + "/ui/members")
    browser.find_element(By.CSS_SELECTOR, '#members tr[data-member="bob"] button.remove').click()
    wait_for(lambda: not browser.find_elements(By.CSS_SELECTOR, '#members tr[data-member="bob"]'), timeout_s=15, what="bob removed")

    # The activity page: each of those, newest first, by whom and through what.
    browser.get(server.url + "/ui/activity")
    actions = [(row.get_attribute("data-action"), row.find_element(By.CSS_SELECTOR, "td.actor").text)
               for row in browser.find_elements(By.CSS_SELECTOR, "#activity tr[data-action]")]
    assert actions == [("member.remove", "ada"), ("member.set", "ada"), ("key.revoke", "ada"), ("key.create", "ada"), ("signin", "ada")]
    save_screenshot(browser, tmp_path, "activity")
    assert severe_console_messages(browser, allowed=("/ui/members - Failed to load resource",)) == []  # the 422 answer
