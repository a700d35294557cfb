"""The OpenAPI document tells the truth, checked by a generator no one here wrote: schemathesis.

A real gunicorn on the suite's PostgreSQL database, Redis for its limits, the real
cluster behind it, and an account admin's token: schemathesis generates requests from
/openapi.json (valid and invalid, then sequences of them) and runs all its checks: no
5xx, every status and body as documented, valid data accepted and invalid data
refused. schemathesis.toml beside this file lists the refusals of valid data that
depend on what a schema cannot say (a webhook host that does not resolve, a sweep of a
parameter the template lacks, a cursor the API never gave out). POST /submit and the
DELETEs are left out: they start and end real jobs, which the other suites test.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from billing.prices import set_price
from gpupool import db
from gpupool.config import Settings
from tests.conftest import recorded_token
from tests.live.conftest import Server

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CONFIG = Path(__file__).parent / "schemathesis" / "schemathesis.toml"
ST = Path(sys.executable).parent / "st"
# A minute or two on the 2-core machine: a few examples of every operation, then its stateful phase.
MAX_EXAMPLES, MAX_TIME_S = 5, 90


def test_no_request_schemathesis_makes_breaks_the_documented_contract(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    # The limits stay on, and high enough for a generator's burst. gunicorn's own request-line
    # limit is lifted here: its 414 comes before the app and is no part of the document.
    server = start_server(
        workers=2, gunicorn_args=("--limit-request-line", "0"), ratelimit_default="100000/minute", ratelimit_submit="100000/minute"
    )
    # Priced, as make run's demo and any site selling GPUs are: a quote without a price is the operator's 503.
    engine = db.make_engine(live_settings.database_url)
    with db.make_session_factory(engine)() as session, session.begin():
        set_price(session, "*", 120_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    engine.dispose()
    token = recorded_token(live_settings, slurm_account, sub="contract-admin")
    run = subprocess.run(
        [
            str(ST), "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json",
            "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME_S),
            "--header", f"Authorization: Bearer {token}",
            "--exclude-path", "/submit", "--exclude-method", "DELETE",
            "--generation-database", "none", "--warnings", "off",
        ],
        capture_output=True, text=True, timeout=MAX_TIME_S + 120, check=False, cwd=tmp_path,
    )
    # On a failure, schemathesis's report and what the server logged (a 500's traceback).
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:] + "\n--- gunicorn ---\n" + server.log()[-20000:]
    assert "Tested:" in run.stdout
