"""``gpupool status`` against the real local PostgreSQL, Redis and slurmctld; Patroni's /cluster served by the test.

The test's HTTP server answers /cluster with a recorded answer (tests/unit/fixtures/status), as
a Patroni member's REST API would: no Patroni runs here. A host list whose first host is gone is
the database after a failover; PostgreSQL's own default_transaction_read_only is a standby's refusal.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url

from bench.support.services import PG_ADMIN_URL
from gpupool.cluster_status import parse_scontrol_ping
from tests.conftest import REDIS_URL, slurm_cmd
from tests.live.test_cli import run_cli

RECORDED = Path(__file__).resolve().parent.parent / "unit" / "fixtures" / "status"



@pytest.fixture
def patroni_url() -> Iterator[str]:
    """A loopback server that answers GET /cluster as a Patroni member would, with a recorded three-member cluster."""
    body = (RECORDED / "patroni-three-members.json").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            found = self.path == "/cluster"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if found else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.fixture
def db_url(live_db: str) -> str:
    """The module's database (live_db names it) at the local PostgreSQL's TCP address."""
    return make_url(PG_ADMIN_URL).set(database=live_db).render_as_string(hide_password=False)


def controllers_here() -> list[dict[str, object]]:
    """What this machine's slurmctld says, read apart from the command under test."""
    return [{"role": c.role, "host": c.host, "up": c.up} for c in parse_scontrol_ping(slurm_cmd("scontrol", "ping", check=False))]


def test_status_names_the_leader_its_members_and_the_controllers(
    db_url: str, closed_port: int, patroni_url: str
) -> None:
    listed = db_url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{closed_port},127.0.0.1:5432/") + "?target_session_attrs=read-write"
    assert listed != db_url
    env = {"GPUPOOL_PATRONI_URLS": f"http://127.0.0.1:{closed_port},{patroni_url}", "GPUPOOL_RATELIMIT_STORAGE_URI": REDIS_URL}
    result = run_cli("status", "--json", database_url=listed, extra_env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["database"] == {"backend": "postgresql", "address": "127.0.0.1", "port": 5432, "writable": True, "error": None}
    assert document["patroni"]["url"] == f"{patroni_url}/cluster"
    assert [(m["name"], m["role"], m["lag_bytes"]) for m in document["patroni"]["members"]] == [
        ("db1", "leader", None), ("db2", "sync_standby", 0), ("db3", "replica", 16384),
    ]
    assert len(document["patroni"]["errors"]) == 1  # the first URL, where nothing listens
    assert document["slurm"] == {"controllers": controllers_here(), "error": None}
    assert document["ratelimit_store"] == "ok"
    assert document["healthy"] is True
    text = run_cli("status", database_url=listed, extra_env=env)
    assert text.returncode == 0
    assert text.stdout.splitlines()[0] == "database: 127.0.0.1:5432 (leader, takes writes)"


def test_status_exits_1_without_a_database_that_takes_writes(db_url: str, closed_port: int) -> None:
    gone = run_cli("status", database_url=f"postgresql://postgres@127.0.0.1:{closed_port}/gpupool")
    assert gone.returncode == 1
    assert gone.stdout.startswith("database: NOT ANSWERING (")
    read_only = db_url + "?options=" + quote("-c default_transaction_read_only=on")
    standby = run_cli(
        "status", database_url=read_only, extra_env={"GPUPOOL_RATELIMIT_STORAGE_URI": f"redis://127.0.0.1:{closed_port}/0"}
    )
    assert standby.returncode == 1
    assert standby.stdout.splitlines()[0] == "database: 127.0.0.1:5432 (READ-ONLY: a standby, or a failover under way)"
    assert standby.stdout.splitlines()[-1] == (
        "rate-limit store: NOT ANSWERING: each API worker limits on its own until it answers again"
    )
