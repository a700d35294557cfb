"""Two customers who do not trust each other, on the real cluster, as production runs it.

gunicorn runs as the unprivileged service user under no_new_privs (what the
systemd unit's NoNewPrivileges=yes does) and submits through the root run-as
helper, so each account's jobs run as its own tenant user. Tenant A's job runs
arbitrary code (the threat model), tries every way across to tenant B or to
the service, and prints what the kernel and Slurm answered; the test asserts
each attempt was refused in their own words and then asks Slurm that nothing
changed.
"""

from __future__ import annotations

import json
import pwd
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.support.services import TENANT_PREFIX, cancel_account_jobs
from bench.support.tenancy import runas_helper
from gpupool.config import Settings
from gpupool.errors import RunasUnavailable, TenantError
from gpupool.render import JobSpec, RenderedJob, render
from gpupool.slurm.runas.client import RunasClient
from gpupool.slurm.runas.request import Sbatch
from tests.conftest import (
    JWT_SECRET,
    base_settings,
    recorded_token,
    sacct_row,
    slurm_cmd,
    wait_for,
)
from tests.live.conftest import Server, http

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The customer's own code, run by bash: what any customer can do inside a job.
SHELL_TEMPLATE = (
    'description = "Run the script given as a parameter."\n'
    "[params.script]\n"
    'type = "string"\n'
    "max_length = 20000\n",
    'set +e +o pipefail\nbash -c "$GPUPOOL_PARAM_SCRIPT"\n',
)

# Each line: attempt<TAB>exit status<TAB>what it printed. Values come in as positional
# arguments of `bash -c`, set by the test; nothing here is gpupool's code.
# Each sbatch asks for a GPU, which the cluster's job_submit plugin requires before
# slurmctld looks at the account at all.
ATTACKS = r"""
attempt_rc() { local name=$1; shift; local out; out=$("$@" 2>&1 </dev/null); local rc=$?; printf '%s\t%s\t%s\n' "$name" "$rc" "$(printf %s "$out" | head -c 400 | tr '\n\t' '  ')"; }
B_PID=$(pgrep -u "$B_USER" -x sleep | head -n1)
attempt_rc list_b_folder ls "$B_DIR"
attempt_rc read_b_log cat "$B_DIR/stdout.log"
attempt_rc write_b_folder touch "$B_DIR/planted-by-a"
attempt_rc read_b_environ cat "/proc/$B_PID/environ"
attempt_rc read_service_environ cat "/proc/$SERVICE_PID/environ"
attempt_rc list_job_root ls "$JOB_ROOT"
attempt_rc reach_runas_helper python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])" "$RUNAS_SOCKET"
attempt_rc scancel_b scancel "$B_SLURM_ID"
attempt_rc hold_b scontrol hold "$B_SLURM_ID"
attempt_rc extend_b scontrol update "JobId=$B_SLURM_ID" TimeLimit=600
attempt_rc sbatch_as_b sbatch "--account=$B_ACCOUNT" --partition=gpu --gres=gpu:1 --wrap "sleep 1"
attempt_rc sbatch_as_root_account sbatch --account=root --partition=gpu --gres=gpu:1 --wrap "sleep 1"
attempt_rc raise_own_gpu_limit sacctmgr -i modify account where "name=$A_ACCOUNT" set GrpTRES=gres/gpu=99
attempt_rc forge_b_tag sbatch "--account=$A_ACCOUNT" --partition=gpu --gres=gpu:1 --hold "--comment=$B_TAG" --wrap "sleep 1"
# Its own logs: planted links and a FIFO the API must not follow.
rm -f "$GPUPOOL_JOB_DIR/stderr.log" && ln -s /etc/shadow "$GPUPOOL_JOB_DIR/stderr.log"
echo done
"""


@pytest.fixture(scope="module")
def templates_dir() -> Iterator[Path]:
    """Templates the service user can read (pytest's own folders are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-templates-", dir="/var/tmp"))
    root.chmod(0o755)
    shutil.copytree(Path(__file__).resolve().parents[2] / "slurm_templates" / "hello", root / "hello")
    (root / "shell").mkdir()
    (root / "shell" / "template.toml").write_text(SHELL_TEMPLATE[0])
    (root / "shell" / "run.sh").write_text(SHELL_TEMPLATE[1])
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def submit_script(server: Server, token: str, script: str, **extra: Any) -> dict[str, Any]:
    reply = http("POST", server.url + "/submit", token=token, body={"template": "shell", "gpus": 1, "params": {"script": script}, **extra})
    assert reply.status == 201, reply.body
    return reply.body


def job_state(server: Server, token: str, job_id: str) -> dict[str, Any]:
    return http("GET", f"{server.url}/jobs/{job_id}", token=token).body


def parse_attempts(log: str) -> dict[str, tuple[int, str]]:
    attempts = {}
    for line in log.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            attempts[parts[0]] = (int(parts[1]), parts[2])
    return attempts


def test_a_tenant_job_cannot_reach_another_tenant_or_the_service(
    start_server: Callable[..., Server],
    live_settings: Settings,
    slurm_account: str,
    tenant_b: str,
    templates_dir: Path,
    job_root: Path,
    runas_socket: str,
) -> None:
    server = start_server(as_service=True, templates_dir=str(templates_dir))
    service_pid = server.process.pid
    assert pwd.getpwuid(int(Path(f"/proc/{service_pid}").stat().st_uid)).pw_name == "gpupool"
    token_a = recorded_token(live_settings, slurm_account, sub=f"a-{secrets.token_hex(3)}")
    token_b = recorded_token(live_settings, tenant_b, sub=f"b-{secrets.token_hex(3)}")

    victim = submit_script(server, token_b, "echo secret-of-b; sleep 300")
    running = wait_for(lambda: (s := job_state(server, token_b, victim["job_id"]))["state"] == "RUNNING" and s, what="B's job to run")
    b_dir = job_root / tenant_b / victim["job_id"]
    wait_for(lambda: "secret-of-b" in http("GET", f"{server.url}/jobs/{victim['job_id']}/logs", token=token_b).body, what="B's log")

    values = {
        "B_USER": TENANT_PREFIX + tenant_b,
        "B_DIR": str(b_dir),
        "B_SLURM_ID": str(running["slurm_job_id"]),
        "B_ACCOUNT": tenant_b,
        "B_TAG": f"gpupool:{victim['job_id']}",
        "A_ACCOUNT": slurm_account,
        "SERVICE_PID": str(service_pid),
        "JOB_ROOT": str(job_root),
        "RUNAS_SOCKET": runas_socket,
    }
    script = "".join(f"{name}={json.dumps(value)}\n" for name, value in values.items()) + ATTACKS
    attacker = submit_script(server, token_a, script)
    done = wait_for(
        lambda: (s := job_state(server, token_a, attacker["job_id"]))["state"] == "COMPLETED" and s,
        timeout_s=90,
        what="A's job to finish",
    )
    log = http("GET", f"{server.url}/jobs/{attacker['job_id']}/logs?tail=200", token=token_a).body
    assert log.rstrip().endswith("done"), log
    attempts = parse_attempts(log)

    # The job ran as A's tenant user, not as the service or root.
    assert sacct_row(done["slurm_job_id"], "User,Account")["User"] == TENANT_PREFIX + slurm_account

    # The kernel's answers.
    for name in ("list_b_folder", "read_b_log", "write_b_folder", "read_b_environ", "read_service_environ", "list_job_root"):
        status, said = attempts[name]
        assert status != 0 and "Permission denied" in said, (name, said)
    assert "PermissionError" in attempts["reach_runas_helper"][1], attempts["reach_runas_helper"]
    # Slurm's answers.
    # slurmctld answers a hold or an update of someone else's job with ESLURM_USER_ID_MISSING.
    refusals = {"scancel_b": "Access/permission denied", "hold_b": "Invalid user id", "extend_b": "Invalid user id"}
    for name, refusal in refusals.items():
        status, said = attempts[name]
        assert status != 0 and refusal in said, (name, said)
    for name in ("sbatch_as_b", "sbatch_as_root_account"):
        status, said = attempts[name]
        assert status != 0 and "Invalid account" in said, (name, said)
    status, said = attempts["raise_own_gpu_limit"]
    assert status != 0, said

    # And Slurm confirms nothing moved: B's job still runs, unheld, with its limit; A's cap is as set.
    detail = slurm_cmd("scontrol", "show", "job", str(running["slurm_job_id"]))
    assert "JobState=RUNNING" in detail and "TimeLimit=01:00:00" in detail and "Priority=0" not in detail
    limits = slurm_cmd("sacctmgr", "-n", "-P", "show", "assoc", "where", f"account={slurm_account}", "format=User,GrpTRES")
    assert "gres/gpu=4" in limits and "gres/gpu=99" not in limits, limits
    assert not slurm_cmd("squeue", "-h", f"--account={tenant_b}", f"--user={TENANT_PREFIX}{slurm_account}")
    assert not Path(b_dir / "planted-by-a").exists()
    # A's forged tag did not make its job B's: B's record is unchanged, and A's job stays A's.
    assert job_state(server, token_b, victim["job_id"])["slurm_job_id"] == running["slurm_job_id"]

    # A's job planted a link to /etc/shadow as its own stderr: the API refuses to follow it.
    planted = http("GET", f"{server.url}/jobs/{attacker['job_id']}/logs?stream=stderr", token=token_a)
    assert planted.status == 409 and planted.body["error"] == "log_unavailable", planted.body
    assert "root:" not in json.dumps(planted.body)

    # B's job is still B's, and B can cancel it through the API.
    assert http("DELETE", f"{server.url}/jobs/{victim['job_id']}", token=token_b).status == 202
    wait_for(lambda: job_state(server, token_b, victim["job_id"])["state"] == "CANCELLED", what="B's job to be cancelled")


def test_a_64_mb_line_is_served_capped_by_the_service(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, templates_dir: Path
) -> None:
    server = start_server(as_service=True, templates_dir=str(templates_dir), workers=2)
    token = recorded_token(live_settings, slurm_account, sub=f"a-{secrets.token_hex(3)}")
    job = submit_script(server, token, "head -c 67108864 /dev/zero | tr '\\0' x")
    wait_for(lambda: job_state(server, token, job["job_id"])["state"] == "COMPLETED", timeout_s=120, what="the 64 MB job")
    cap = live_settings.log_read_max_bytes
    tail = http("GET", f"{server.url}/jobs/{job['job_id']}/logs?tail=1", token=token)
    assert tail.status == 200 and tail.body == "x" * cap
    page = http("GET", f"{server.url}/jobs/{job['job_id']}/logs?offset=0", token=token)
    assert page.status == 200 and len(page.body) == cap
    assert int(page.headers["Gpupool-Next-Offset"]) == cap


# -- the run-as helper itself, against a caller that is not the API's code ----------
#
# The service user can reach the helper's socket; these tests speak to a real
# helper directly, as a compromised API process could, and read what it answered,
# what Slurm holds afterwards, and what the kernel shows of the helper.

DATABASE_URL_OF_THE_API = "postgresql://gpupool_api:pw-of-the-api@127.0.0.1/gpupool"


@pytest.fixture(scope="module")
def strict_helper(job_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A helper started with the API's secrets in its environment, a 1 s request timeout and room for 2 callers."""
    extra = {
        "GPUPOOL_JWT_SECRET": JWT_SECRET,
        "GPUPOOL_DATABASE_URL": DATABASE_URL_OF_THE_API,
        "GPUPOOL_RUNAS_TIMEOUT_S": "1",
        "GPUPOOL_RUNAS_MAX_CONNECTIONS": "2",
    }
    with runas_helper(job_root, tmp_path_factory.mktemp("strict-runas"), extra) as socket_path:
        yield socket_path


def helper_client(socket_path: str, job_root: Path) -> RunasClient:
    return RunasClient(base_settings(runas_socket=socket_path, job_root=str(job_root)))


def job_for(account: str, job_root: Path) -> tuple[str, RenderedJob]:
    job_id = str(uuid.uuid4())
    spec = JobSpec(
        job_id=job_id, account=account, name="strict", template="hello", body="echo hi", params={}, gpus=1,
        gpu_type=None, cpus=1, mem_gb=1, time_limit_min=1, partition="gpu", job_dir=str(job_root / account / job_id),
    )
    return job_id, render(spec)


def with_directive(script: str, directive: str) -> str:
    """``directive`` after a blank line and a comment, still before the first command: where sbatch reads it."""
    lines = script.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("set -euo"))
    return "\n".join([*lines[:at], "", "# planted", directive, *lines[at:]])


def account_jobs(account: str) -> str:
    """Every job slurmctld holds for ``account``, with its comment (gpupool's tag)."""
    return slurm_cmd("squeue", "-h", "--states=all", f"--account={account}", "--format=%i|%k")


@pytest.mark.parametrize(
    "directive",
    ["#SBATCH --account=root", "#SBATCH --partition=x", "#SBATCH --gres=gpu:8", "#SBATCH --qos=high", "#SLURM --time=600"],
)
def test_the_helper_refuses_a_script_whose_sbatch_lines_say_more_than_its_options(
    strict_helper: str, job_root: Path, slurm_account: str, directive: str
) -> None:
    client = helper_client(strict_helper, job_root)
    job_id, job = job_for(slurm_account, job_root)
    with pytest.raises(TenantError, match="not one of the options gpupool submits it with") as refused:
        client.submit(Sbatch(slurm_account, job_id, with_directive(job.script, directive), list(job.options)), timeout_s=10)
    assert directive.split(None, 1)[1] in str(refused.value)
    # Refused before anything was made or run: no folder, no job in Slurm.
    assert not (job_root / slurm_account / job_id).exists()
    assert f"gpupool:{job_id}" not in account_jobs(slurm_account)


def test_the_same_script_without_the_planted_line_is_submitted(strict_helper: str, job_root: Path, slurm_account: str) -> None:
    """The control: what the renderer wrote goes through the same helper and reaches Slurm."""
    client = helper_client(strict_helper, job_root)
    job_id, job = job_for(slurm_account, job_root)
    try:
        result = client.submit(Sbatch(slurm_account, job_id, with_directive(job.script, "# no directive"), list(job.options)), timeout_s=10)
        slurm_job_id = int(result.stdout.strip().split(";")[0])
        # slurmdbd may record a pending job before its comment arrives: wait for the comment too.
        def recorded() -> dict[str, str] | None:
            row = sacct_row(slurm_job_id, "Account,Comment,User")
            return row if row and row.get("Comment") else None

        record = wait_for(recorded, what="the job's accounting record with its comment")
        assert record == {"Account": slurm_account, "Comment": f"gpupool:{job_id}", "User": TENANT_PREFIX + slurm_account}
    finally:
        cancel_account_jobs(slurm_account)


def test_the_helper_refuses_a_path_that_climbs_out_of_the_job_folder(
    strict_helper: str, job_root: Path, slurm_account: str
) -> None:
    client = helper_client(strict_helper, job_root)
    job_id, job = job_for(slurm_account, job_root)
    job_dir = job_root / slurm_account / job_id
    options = [f"--chdir={job_dir}/.." if o.startswith("--chdir=") else o for o in job.options]
    with pytest.raises(TenantError, match="a path with '..'"):
        client.submit(Sbatch(slurm_account, job_id, job.script, options), timeout_s=10)
    assert not job_dir.exists()


def test_a_silent_connection_is_closed_after_the_timeout(strict_helper: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)  # a guard against a helper that never closes, not a measurement
        conn.connect(strict_helper)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    assert json.loads(answer) == {"outcome": "refused", "message": "no whole request within 1 s; closing the connection"}


def test_connections_beyond_the_bound_are_refused_until_one_ends(job_root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Its own helper: holders here must outlast the wait for a free slot, so a long request timeout.
    extra = {"GPUPOOL_RUNAS_TIMEOUT_S": "60", "GPUPOOL_RUNAS_MAX_CONNECTIONS": "2"}
    with runas_helper(job_root, tmp_path_factory.mktemp("bounded-runas"), extra) as socket_path:
        client = helper_client(socket_path, job_root)
        holders = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for holder in holders:
            holder.connect(socket_path)
        with pytest.raises(RunasUnavailable, match="busy: 2 requests in progress"):
            client.ping()
        for holder in holders:
            holder.close()
        wait_for(lambda: _pings(client), what="the helper to serve again once its callers left")


def test_a_burst_of_callers_waits_for_a_slot_instead_of_being_refused_at_connect(runas_socket: str, job_root: Path) -> None:
    """More callers at once than the helper has slots (16) or than socketserver's default listen queue held (5)."""
    client = helper_client(runas_socket, job_root)
    callers = 40
    start = threading.Barrier(callers)
    refusals: list[str] = []

    def ping() -> None:
        start.wait()
        try:
            client.ping()
        except RunasUnavailable as exc:
            refusals.append(exc.message)  # list.append is atomic

    threads = [threading.Thread(target=ping) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert refusals == []


def _pings(client: RunasClient) -> bool:
    try:
        client.ping()
    except RunasUnavailable:
        return False
    return True


def test_the_helper_holds_none_of_the_secrets_it_was_started_with(strict_helper: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(strict_helper)
        # The kernel's word on who listens on the socket.
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    assert uid == 0
    assert b"gpupool.slurm.runas" in Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = dict(
        entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if entry
    )
    assert environ["GPUPOOL_RUNAS_MAX_CONNECTIONS"] == "2"  # what it uses is there
    assert "GPUPOOL_JWT_SECRET" not in environ and "GPUPOOL_DATABASE_URL" not in environ
    assert not any(JWT_SECRET in value or "pw-of-the-api" in value for value in environ.values())
