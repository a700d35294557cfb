"""Abuse at the API: CPU and memory beyond a GPU's share, rate limits per caller and per address, invoice formulas."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from bench.support.services import TENANT_PREFIX
from billing import passes
from billing.prices import set_price
from billing.sacct import SACCT_FIELDS
from gpupool.config import Settings
from gpupool.models import Adjustment
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_delimited, parse_gres
from tests.conftest import bearer, create_app_for_tests, sacct_row, slurm_cmd, utc, wait_for
from tests.support.sacct_dumps import as_pass_output

HELLO = {"template": "hello", "params": {"message": "share", "seconds": 0}}


def node_share(partition: str) -> tuple[int, int]:
    """(CPUs, GB of memory) per GPU on the partition's leanest node, from sinfo itself."""
    rows = parse_delimited(slurm_cmd("sinfo", "--Node", f"--partition={partition}", "--format=%N|%G|%c|%m"))
    shares = []
    for row in rows:
        gpus = sum(gres.count for gres in parse_gres(row["GRES"]) if gres.name == "gpu")
        if gpus:
            shares.append((int(row["CPUS"]) // gpus, int(row["MEMORY"]) // gpus // 1024))
    return min(cpus for cpus, _ in shares), min(mem for _, mem in shares)


# --- CPUs and memory per GPU -----------------------------------------------------------


def test_cpus_beyond_the_nodes_share_per_gpu_are_refused(client: FlaskClient, settings: Settings, account: str) -> None:
    cpus_per_gpu, _ = node_share(settings.slurm_partition)
    headers = bearer(settings, account)
    over = client.post("/submit", headers=headers, json={**HELLO, "gpus": 1, "cpus": cpus_per_gpu + 1})
    assert over.status_code == 422
    assert over.get_json()["error"] == "validation_failed"
    assert f"cpus may be at most {cpus_per_gpu} for 1 GPU(s)" in over.get_json()["message"]
    assert f"{cpus_per_gpu} CPU(s) per GPU" in over.get_json()["message"]
    at_cap = client.post("/submit", headers=headers, json={**HELLO, "gpus": 1, "cpus": cpus_per_gpu})
    assert at_cap.status_code == 201, at_cap.get_json()
    assert at_cap.get_json()["cpus"] == cpus_per_gpu


def test_operator_caps_bound_cpus_and_memory_per_gpu(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    client = create_app_for_tests(settings.replace(max_cpus_per_gpu=1, max_mem_gb_per_gpu=3), slurm, session_factory).test_client()
    headers = bearer(settings, account)
    cpus = client.post("/submit", headers=headers, json={**HELLO, "gpus": 2, "cpus": 3})
    assert cpus.status_code == 422
    assert cpus.get_json()["message"].startswith("cpus may be at most 2 for 2 GPU(s): this cluster allows 1 CPU(s) per GPU")
    memory = client.post("/submit", headers=headers, json={**HELLO, "gpus": 2, "mem_gb": 7})
    assert memory.status_code == 422
    assert memory.get_json()["message"].startswith("mem_gb may be at most 6 for 2 GPU(s): this cluster allows 3 GB per GPU")
    at_cap = client.post("/submit", headers=headers, json={**HELLO, "gpus": 2, "cpus": 2, "mem_gb": 6})
    assert at_cap.status_code == 201, at_cap.get_json()
    job = at_cap.get_json()
    assert (job["cpus"], job["mem_gb"]) == (2, 6)
    # What leaving a field out gives is never refused by name (default_mem_gb 4 > 3 per GPU).
    assert settings.default_mem_gb == 4
    default = client.post("/submit", headers=headers, json={**HELLO, "gpus": 1, "mem_gb": 4})
    assert default.status_code == 201, default.get_json()
    too_much = client.post("/submit", headers=headers, json={**HELLO, "gpus": 1, "mem_gb": 5})
    assert too_much.status_code == 422
    # Slurm gave the job what it asked for, once it ran.
    allocated = wait_for(lambda: sacct_row(job["slurm_job_id"], "AllocTRES").get("AllocTRES"), timeout_s=60, what="the job's allocation")
    assert {"cpu=2", "mem=6G", "gres/gpu=2"} <= set(allocated.split(","))


# --- rate limits -------------------------------------------------------------------------


@pytest.fixture
def limited(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> FlaskClient:
    small = settings.replace(ratelimit_default="3/minute", ratelimit_unauthenticated="2/minute")
    return create_app_for_tests(small, slurm, session_factory).test_client()


def statuses(client: FlaskClient, count: int, headers: dict[str, str], address: str = "10.1.0.1") -> list[int]:
    return [client.get("/templates", headers=headers, environ_base={"REMOTE_ADDR": address}).status_code for _ in range(count)]


def test_rate_limit_is_per_account_and_subject(limited: FlaskClient, settings: Settings, account: str, other_account: str) -> None:
    alice = bearer(settings, account, sub="alice")
    assert statuses(limited, 4, alice) == [200, 200, 200, 429]
    # Another subject of the same account, and the same subject of another account, count apart.
    assert statuses(limited, 3, bearer(settings, account, sub="bob")) == [200, 200, 200]
    assert statuses(limited, 3, bearer(settings, other_account, sub="alice")) == [200, 200, 200]
    assert statuses(limited, 1, alice) == [429]


def test_unauthenticated_requests_are_limited_per_address(limited: FlaskClient, settings: Settings, account: str) -> None:
    first = limited.get("/templates", environ_base={"REMOTE_ADDR": "10.2.0.1"})
    assert first.status_code == 401
    assert first.get_json() == {"error": "unauthorized", "message": "send a token as `Authorization: Bearer <token>`"}
    bad_token = {"Authorization": "Bearer not-a-token"}
    assert statuses(limited, 1, bad_token, "10.2.0.1") == [401]
    over = limited.get("/jobs", environ_base={"REMOTE_ADDR": "10.2.0.1"})
    assert over.status_code == 429
    assert over.get_json()["error"] == "rate_limited"
    assert "2 per 1 minute" in over.get_json()["message"]
    assert int(over.headers["Retry-After"]) > 0
    # Another address is counted apart; a valid token from the blocked address is not refused.
    assert statuses(limited, 1, {}, "10.2.0.2") == [401]
    assert statuses(limited, 1, bearer(settings, account, sub="carol"), "10.2.0.1") == [200]


def test_behind_a_trusted_proxy_the_forwarded_address_is_limited_and_nobody_can_forge_one(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker
) -> None:
    def unauthenticated(client: FlaskClient, forwarded_for: str) -> int:
        headers = {"X-Forwarded-For": forwarded_for}
        return client.get("/templates", headers=headers, environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code

    small = settings.replace(ratelimit_unauthenticated="1/minute")
    behind_nginx = create_app_for_tests(small.replace(proxy_hops=1), slurm, session_factory).test_client()
    assert [unauthenticated(behind_nginx, "203.0.113.7") for _ in range(2)] == [401, 429]
    assert unauthenticated(behind_nginx, "203.0.113.8") == 401  # another client behind the same proxy

    exposed = create_app_for_tests(small, slurm, session_factory).test_client()
    # Without a trusted proxy the header is the caller's own word: it opens no new bucket.
    assert [unauthenticated(exposed, "203.0.113.7"), unauthenticated(exposed, "203.0.113.9")] == [401, 429]


# --- invoice cells -------------------------------------------------------------------------


def test_invoice_cells_a_spreadsheet_would_run_are_shown_as_text(
    client: FlaskClient, settings: Settings, session_factory: sessionmaker, account: str, tmp_path: Path
) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, utc("2020-01-01T00:00:00Z"))
    dump = tmp_path / "nov.psv"
    dump.write_text(
        as_pass_output([
            "|".join(SACCT_FIELDS),
            f"gpupool|911|911|{account}|{TENANT_PREFIX}{account}|COMPLETED|2026-11-03T10:00:00|2026-11-03T10:00:00|2026-11-03T11:00:00"
            '|3600|gres/gpu:rtx4090=1,gres/gpu=1|=HYPERLINK("http://x")',
        ])
    )
    passes.replay(session_factory, settings.replace(billing_archive_dir=str(tmp_path / "archive")), dump)
    with session_factory() as session, session.begin():
        session.add(
            Adjustment(account=account, period="2026-11", amount_nanos=-12_500_000_000, reason="@SUM(1)", kind="manual", created_by="ops")
        )
    response = client.get("/invoices/2026-11", headers=bearer(settings, account))
    assert response.status_code == 200
    lines = list(csv.reader(io.StringIO(response.get_data(as_text=True), newline="")))
    job, adjustment, total = lines[1:]
    assert job[3] == '\'=HYPERLINK("http://x")'
    assert (job[4], job[11]) == ("rtx4090", "0.43")
    # gpupool's own numbers stay numbers: a credit is -12.50, not text.
    assert (adjustment[3], adjustment[11]) == ("'@SUM(1)", "-12.50")
    assert total[11] == "-12.07"
