"""The limits Slurm itself enforces on a tenant's own sbatch, srun and salloc.

A tenant's job runs arbitrary code, which can call Slurm's commands as
``gp-<account>`` with any option. Each path that used to get free or unbounded
work (no GPU, ``--mem=0``, ``--time=UNLIMITED``, CPUs or memory above the
per-GPU caps, another partition or QOS, ``--exclusive``, changing a pending
job afterwards, an account whose money is spent) is run here the way such code
would run it, and the test asserts Slurm's own answer: refused with its
message, or accepted and bounded (scontrol), and billed (the invoice).
"""

from __future__ import annotations

import csv
import io
import pwd
import subprocess
from collections.abc import Iterator

import pytest

from bench.support.services import TENANT_PREFIX
from billing.calendar import period_of
from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_delimited
from tests.billing.conftest import RTX4090_NANOS, LedgerDb, pg_ledger  # noqa: F401 (pg_ledger: a fixture)
from tests.conftest import SUITE_NOW, slurm_cmd, throwaway_slurm_account, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PARTITION = "gpu"


def as_tenant(account: str, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``argv`` run as the account's Unix user, as code inside one of its jobs would run it."""
    user = TENANT_PREFIX + account
    return subprocess.run(
        ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv],
        capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/tmp",
        env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
    )


def submit(account: str, command: str, *options: str, run: str = "true") -> subprocess.CompletedProcess[str]:
    """One job by ``command`` (sbatch, srun or salloc) under the account's own association, running ``run``."""
    base = [command, f"--account={account}", *options]
    if command == "sbatch":
        return as_tenant(account, *base, "--parsable", "--output=/dev/null", f"--wrap={run}")
    return as_tenant(account, *base, *run.split())


def account_jobs(account: str) -> str:
    return slurm_cmd("squeue", "-h", f"--account={account}", "-o", "%i").strip()


def job_detail(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields, keyed on their names (the command's --oneliner form)."""
    text = slurm_cmd("scontrol", "--oneliner", "show", "job", job_id)
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def caps() -> tuple[int, int]:
    """One GPU's share of the leanest GPU node, as job_submit.lua counts it: CPUs, and MB in whole GB."""
    rows = parse_delimited(slurm_cmd("sinfo", "--Node", "-p", PARTITION, "--format=%N|%c|%m|%G"))
    shares = []
    for row in rows:
        gpus = sum(int(part.split("(")[0].rsplit(":", 1)[1]) for part in row["GRES"].split(",") if part.startswith("gpu"))
        shares.append((int(row["CPUS"]) // gpus, int(row["MEMORY"]) // gpus // 1024 * 1024))
    return min(share[0] for share in shares), min(share[1] for share in shares)


@pytest.fixture(scope="module")
def account(slurm: SlurmClient) -> Iterator[str]:
    with throwaway_slurm_account(slurm, "lim") as name:
        yield name


@pytest.fixture
def no_jobs_left(account: str) -> Iterator[None]:
    yield
    slurm_cmd("scancel", f"--account={account}", check=False)


@pytest.fixture(scope="module")
def other_qos() -> Iterator[str]:
    """A QOS that exists but is not sold to tenants."""
    name = "gpupoolpremium"
    slurm_cmd("sacctmgr", "-i", "add", "qos", name, check=False)
    yield name
    slurm_cmd("sacctmgr", "-i", "delete", "qos", name, check=False)


def test_the_partition_caps_the_time_limit_at_the_operators_maximum() -> None:
    # MaxTime and DefaultTime in minutes, with EnforcePartLimits=ALL refusing above them at submit.
    row = parse_delimited(slurm_cmd("sinfo", "-p", PARTITION, "--format=%P|%l|%L"))[0]
    assert row["TIMELIMIT"] == "7-00:00:00" and Settings.max_time_limit_min == 7 * 24 * 60
    assert row["DEFAULTTIME"] == "1:00:00" and Settings.default_time_limit_min == 60
    config = slurm_cmd("scontrol", "show", "config")
    assert "EnforcePartLimits       = ALL" in config
    assert "AccountingStorageEnforce = associations,limits,qos,safe" in config
    assert "JobSubmitPlugins        = lua" in config


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        # What used to be accepted: no GPU, the whole node's memory and CPUs, no end.
        (["--gres=gpu:0", "--mem=0", "--cpus-per-task=8", "--time=UNLIMITED"], "every job needs at least one GPU"),
        ([], "every job needs at least one GPU"),
        (["--gres=gpu:1", "--time=UNLIMITED"], "the time limit may be at most 10080 minutes (--time), not UNLIMITED"),
        (["--gres=gpu:1", "--time=10081"], "the time limit may be at most 10080 minutes"),
        (["--gres=gpu:1", "--mem=0"], "--mem=0 (all of a node's memory) is not offered"),
        (["--gres=gpu:1", "--exclusive"], "--exclusive would hold a whole node"),
        # Other users' jobs kept off the node's other GPUs, or the node's CPUs shared past what was sold.
        (["--gres=gpu:1", "--exclusive=user"], "--exclusive=user would keep other users' jobs off the node's other GPUs"),
        (["--gres=gpu:1", "--exclusive=mcs"], "--exclusive=mcs would keep other users' jobs off the node's other GPUs"),
        (["--gres=gpu:1", "--oversubscribe"], "--oversubscribe would share CPUs and memory sold whole"),
        (["--gpus=1"], "ask for GPUs per node with --gres=gpu:N"),
        (["--gres=gpu:1", f"--partition={PARTITION}x"], f"partition {PARTITION}x is not offered"),
    ],
)
def test_a_tenants_own_job_beyond_the_bounds_is_refused_by_slurm(
    account: str, no_jobs_left: None, command: str, options: list[str], message: str
) -> None:
    refused = submit(account, command, *options)
    assert refused.returncode != 0, refused.stdout
    assert f"{command}: error: gpupool: {message}" in refused.stderr
    assert account_jobs(account) == ""


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
def test_cpus_and_memory_above_the_per_gpu_caps_are_refused(account: str, no_jobs_left: None, command: str) -> None:
    cpus_per_gpu, mem_mb_per_gpu = caps()
    floor_mb = Settings.default_mem_gb * 1024  # what the API gives by default is never refused
    too_many_cpus = submit(account, command, "--gres=gpu:1", f"--cpus-per-task={cpus_per_gpu + 1}")
    assert f"gpupool: {cpus_per_gpu + 1} CPU(s) for 1 GPU(s) is above the cap: at most {cpus_per_gpu} per GPU" in too_many_cpus.stderr
    too_much_memory = max(mem_mb_per_gpu, floor_mb) + 1
    refused = submit(account, command, "--gres=gpu:1", f"--mem={too_much_memory}M")
    assert f"gpupool: {too_much_memory} MB of memory for 1 GPU(s) is above the cap: at most {mem_mb_per_gpu} MB per GPU" in refused.stderr
    # Memory per CPU counts times the CPUs; per GPU, times the GPUs.
    per_cpu = submit(account, command, "--gres=gpu:1", f"--cpus-per-task={cpus_per_gpu}", f"--mem-per-cpu={too_much_memory}M")
    assert "MB of memory for 1 GPU(s) is above the cap" in per_cpu.stderr
    per_gpu = submit(account, command, "--gres=gpu:2", f"--mem-per-gpu={too_much_memory}M")
    assert "MB of memory for 2 GPU(s) is above the cap" in per_gpu.stderr
    assert account_jobs(account) == ""


def test_a_qos_not_sold_to_tenants_is_refused(account: str, no_jobs_left: None, other_qos: str) -> None:
    for command in ("sbatch", "srun", "salloc"):
        refused = submit(account, command, "--gres=gpu:1", f"--qos={other_qos}")
        assert f"{command}: error: gpupool: QOS {other_qos} is not offered" in refused.stderr
    assert account_jobs(account) == ""


def test_a_job_within_the_bounds_runs_bounded_by_the_default_time_limit(account: str, no_jobs_left: None) -> None:
    cpus_per_gpu, mem_mb_per_gpu = caps()
    accepted = submit(account, "sbatch", "--gres=gpu:2", f"--cpus-per-task={2 * cpus_per_gpu}", f"--mem={2 * mem_mb_per_gpu}M", "--hold")
    assert accepted.returncode == 0, accepted.stderr
    job = job_detail(accepted.stdout.strip().split(";")[0])
    assert job["TimeLimit"] == "01:00:00"  # the partition's DefaultTime, not INFINITE
    assert job["Partition"] == PARTITION and job["QOS"] == "normal"
    assert "gres/gpu=2" in job["TRES"] and f"cpu={2 * cpus_per_gpu}" in job["TRES"]


def test_a_pending_job_cannot_be_changed_past_the_bounds(account: str, no_jobs_left: None) -> None:
    accepted = submit(account, "sbatch", "--gres=gpu:1", "--hold", "--time=30")
    job_id = accepted.stdout.strip().split(";")[0]
    before = job_detail(job_id)
    for change in ("MinMemoryNode=0", "Gres=gpu:0", "NumCPUs=8", f"Partition={PARTITION}", "TimeLimit=UNLIMITED"):
        refused = as_tenant(account, "scontrol", "update", f"JobId={job_id}", change)
        assert refused.returncode != 0 and f"for job {job_id}" in refused.stderr, change
    shorter = as_tenant(account, "scontrol", "update", f"JobId={job_id}", "TimeLimit=10")
    assert shorter.returncode == 0, shorter.stderr
    after = job_detail(job_id)
    unchanged = ("TRES", "NumCPUs", "Partition", "TresPerNode", "MinMemoryCPU")
    assert {key: after.get(key) for key in unchanged} == {key: before.get(key) for key in unchanged}
    assert after["TimeLimit"] == "00:10:00"
    # Lowered, never raised again: not even back to what it was.
    longer = as_tenant(account, "scontrol", "update", f"JobId={job_id}", "TimeLimit=30")
    assert longer.returncode != 0 and f"for job {job_id}" in longer.stderr
    assert job_detail(job_id)["TimeLimit"] == "00:10:00"


@pytest.mark.parametrize("held", [False, True], ids=["begins-later", "held"])
def test_a_pending_jobs_time_limit_cannot_be_raised(account: str, no_jobs_left: None, held: bool) -> None:
    # Slurm itself lets a user raise a pending job's limit up to the partition's MaxTime:
    # the quote, the admission and the budget priced the 5 minutes it was submitted with.
    pending = ["--hold"] if held else ["--begin=now+3600"]
    accepted = submit(account, "sbatch", "--gres=gpu:1", "--time=5", *pending)
    assert accepted.returncode == 0, accepted.stderr
    job_id = accepted.stdout.strip().split(";")[0]
    for longer in ("TimeLimit=10080", "TimeLimit=6", "TimeLimit=+60"):
        refused = as_tenant(account, "scontrol", "update", f"JobId={job_id}", longer)
        assert refused.returncode != 0 and f"for job {job_id}" in refused.stderr, longer
    assert job_detail(job_id)["TimeLimit"] == "00:05:00"


def test_an_account_cannot_fill_the_controllers_job_table(account: str, no_jobs_left: None) -> None:
    # GrpSubmitJobs on the account's association: each array task counts as a job.
    rows = parse_delimited(slurm_cmd("sacctmgr", "--parsable2", "show", "association", f"account={account}", "format=User,GrpSubmit"))
    cap = int(next(row["GrpSubmit"] for row in rows if not row["User"]))
    assert cap == Settings.max_submit_jobs == 1000
    refused = submit(account, "sbatch", "--gres=gpu:1", "--hold", f"--array=0-{cap}")
    assert refused.returncode != 0
    assert "Job violates accounting/QOS policy" in refused.stderr
    assert account_jobs(account) == ""
    accepted = submit(account, "sbatch", "--gres=gpu:1", "--hold", f"--array=0-{cap - 2}")
    assert accepted.returncode == 0, accepted.stderr
    one_more = submit(account, "sbatch", "--gres=gpu:1", "--hold")
    assert one_more.returncode == 0, one_more.stderr
    past = submit(account, "sbatch", "--gres=gpu:1", "--hold")
    assert past.returncode != 0 and "Job violates accounting/QOS policy" in past.stderr


@pytest.fixture
def budget_account(pg_ledger: LedgerDb, slurm: SlurmClient) -> Iterator[str]:  # noqa: F811
    with throwaway_slurm_account(slurm, "bud") as name:
        pg_ledger.add_account(name)
        try:
            yield name
        finally:
            slurm_cmd("scancel", f"--account={name}", check=False)


def grp_tres_mins(account: str) -> str:
    rows = parse_delimited(slurm_cmd("sacctmgr", "--parsable2", "show", "association", f"account={account}",
                                     "format=Account,User,GrpTRESMins"))
    return next(row["GrpTRESMins"] for row in rows if not row["User"])


def reason_of(job_id: str) -> str:
    return slurm_cmd("squeue", "-h", "-j", job_id, "-o", "%T %r", check=False).strip()


def test_an_account_whose_money_is_spent_starts_nothing_by_any_path(pg_ledger: LedgerDb, budget_account: str) -> None:  # noqa: F811
    # The operator's `account set` puts the money into Slurm at once: 10 GPU-minutes at the dearest price.
    ten_minutes = 10 * 60 * RTX4090_NANOS
    assert pg_ledger.cli("account", "set", budget_account, "--credit", f"0.{ten_minutes:09d}").returncode == 0
    assert grp_tres_mins(budget_account) == "gres/gpu=10"

    # safe: a job whose GPUs x time limit does not fit in the money never starts; one that fits does.
    too_long = submit(budget_account, "sbatch", "--gres=gpu:1", "--time=11").stdout.strip()
    fits = submit(budget_account, "sbatch", "--gres=gpu:1", "--time=10", run="sleep 300").stdout.strip()
    wait_for(lambda: reason_of(too_long) == "PENDING AssocGrpGRESMinutes", what="the 11-minute job held back")
    wait_for(lambda: reason_of(fits).startswith("RUNNING"), what="the 10-minute job to start")
    # The running job's unused minutes count: nothing else fits beside it.
    another = submit(budget_account, "sbatch", "--gres=gpu:1", "--time=1").stdout.strip()
    wait_for(lambda: reason_of(another) == "PENDING AssocGrpGRESMinutes", what="a third job held back")
    slurm_cmd("scancel", fits, too_long, another)

    # Spent: the billing pass (and `account set`) make the budget 0, and nothing starts, by any path.
    assert pg_ledger.cli("account", "set", budget_account, "--credit", "0").returncode == 0
    assert grp_tres_mins(budget_account) == "gres/gpu=0"
    queued = submit(budget_account, "sbatch", "--gres=gpu:1", "--time=1").stdout.strip()
    wait_for(lambda: reason_of(queued) == "PENDING AssocGrpGRESMinutes", what="the spent account's job held back")
    for command in ("srun", "salloc"):
        immediate = submit(budget_account, command, "--gres=gpu:1", "--time=1", "--immediate=3")
        assert immediate.returncode != 0
        assert "AssocGrpGRESMinutes" in immediate.stderr or "Unable to allocate resources" in immediate.stderr, immediate.stderr
    assert pg_ledger.cli("billing", "run").returncode == 0
    assert grp_tres_mins(budget_account) == "gres/gpu=0"

    # No budget at all: the limit goes.
    slurm_cmd("scancel", queued)
    removed = pg_ledger.cli("account", "set", budget_account, "--credit", "none")
    assert removed.returncode == 0 and "Slurm budget set to no limit" in removed.stdout
    assert grp_tres_mins(budget_account) == ""


def test_a_tenants_direct_job_is_billed_on_its_invoice(pg_ledger: LedgerDb, budget_account: str) -> None:  # noqa: F811
    ran = submit(budget_account, "sbatch", "--gres=gpu:1", "--time=1", "--wait", run="sleep 2")
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stdout.strip().split(";")[0]

    def billed() -> list[dict[str, str]] | None:
        assert pg_ledger.cli("billing", "run").returncode == 0
        invoice = pg_ledger.cli("invoice", "--account", budget_account, "--period", period_of(SUITE_NOW), "-o", "-")
        lines = [line for line in csv.DictReader(io.StringIO(invoice.stdout)) if line["slurm_job_id"] == job_id]
        return lines if lines and int(lines[0]["gpu_seconds"]) > 0 else None

    lines = wait_for(billed, timeout_s=120, interval_s=2, what=f"job {job_id} on the invoice")
    assert lines[0]["gpus"] == "1" and lines[0]["line_type"] == "job"
    assert pwd.getpwnam(TENANT_PREFIX + budget_account)  # the job ran as the tenant, under its association
