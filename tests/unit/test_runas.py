"""The run-as helper's checks on what the service asks it to submit, and tag ownership."""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.config import Settings, load_settings
from gpupool.errors import RunasUnavailable, SubmissionUncertain, TenantError
from gpupool.render import JobSpec, RenderedJob, render
from gpupool.slurm.client import QueueEntry, SlurmClient
from gpupool.slurm.runas.checks import _ACCOUNT, check_script, check_submit_options, job_folder
from gpupool.slurm.runas.client import RunasClient
from gpupool.slurm.runas.directives import script_directives
from gpupool.slurm.runas.launch import HELPER_SETTINGS, helper_environment
from gpupool.slurm.runas.request import Sbatch
from gpupool.slurm.tenants import UNIX_USER_NAME, member_user_name, tenant_user_name

JOB_ID = "0b0e4c8e-8a8f-4a2b-9a59-0f6b3c1d2e4f"
JOB_DIR = Path("/var/lib/gpupool/jobs/acme") / JOB_ID
IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"
SETTINGS = Settings(
    service_user="gpupool", service_group="gpupool", job_root="/var/lib/gpupool/jobs", slurm_partition="gpu",
    container_runtime="pyxis", container_allowlist=("nvcr.io#nvidia/*",), container_mounts=("/datasets:/datasets:ro",),
    storage_root="/var/lib/gpupool/data",
)


def rendered(runtime: str = "none", **changes: object) -> RenderedJob:
    values: dict[str, object] = {
        "job_id": JOB_ID, "account": "acme", "name": "a'; echo foo", "template": "hello", "body": "echo hi", "params": {},
        "gpus": 1, "gpu_type": "rtx4090", "cpus": 2, "mem_gb": 8, "time_limit_min": 30, "partition": "gpu",
        "job_dir": str(JOB_DIR), "runtime": runtime, "container_image": IMAGE if runtime == "pyxis" else None,
        "container_mounts": SETTINGS.container_mounts, "data_dir": "/var/lib/gpupool/data/acme",
    }
    values.update(changes)
    return render(JobSpec(**values))  # type: ignore[arg-type]


def rendered_options(runtime: str = "none") -> list[str]:
    return list(rendered(runtime).options)


def check(options: list[str], settings: Settings = SETTINGS) -> list[str]:
    return check_submit_options(settings, options, "acme", JOB_ID)


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_every_option_the_renderer_emits_passes(runtime: str) -> None:
    assert check(rendered_options(runtime)) == rendered_options(runtime)


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_a_spot_job_passes_with_the_spot_qos_and_requeue(runtime: str) -> None:
    options = list(rendered(runtime, preemptible=True).options)
    assert {"--qos=spot", "--requeue", "--signal=B:TERM@30", "--open-mode=append"} <= set(options)
    assert check(options) == options


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_a_requeue_on_failure_job_passes_with_requeue_alone(runtime: str) -> None:
    options = list(rendered(runtime, requeue_on_failure=True).options)
    assert {"--requeue", "--open-mode=append"} <= set(options)
    assert "--no-requeue" not in options and not any(o.startswith(("--qos", "--signal")) for o in options)
    assert check(options) == options


def test_any_other_job_says_no_requeue() -> None:
    options = rendered_options()
    assert "--no-requeue" in options and "--requeue" not in options
    assert check(options) == options


def replaced(name: str, value: str | None) -> Callable[[list[str]], list[str]]:
    """The options with ``name``'s value changed (None: ``name`` left out)."""
    def change(options: list[str]) -> list[str]:
        kept = [o for o in options if o.partition("=")[0] != name]
        return kept if value is None else [*kept, f"{name}={value}"]
    return change


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda opts: [*opts, "--uid=0"], "not one gpupool submits"),
        (lambda opts: [*opts, "--export=ALL,LD_PRELOAD=/tmp/x.so"], "not one gpupool submits"),
        (lambda opts: [*opts, "--wrap=id"], "not one gpupool submits"),
        # Only the helper's own test operation adds it: a caller cannot make a submit a test, or the reverse.
        (lambda opts: [*opts, "--test-only"], "not one gpupool submits"),
        (lambda opts: [*opts, "--qos=high", "--requeue", "--signal=B:TERM@30", "--open-mode=append"], "--qos='high' is not a value"),
        (lambda opts: [*opts, "--qos=normal", "--requeue", "--signal=B:TERM@30", "--open-mode=append"], "--qos='normal' is not a value"),
        (lambda opts: [*opts, "--qos=spot,normal", "--requeue", "--signal=B:TERM@30", "--open-mode=append"], "is not a value"),
        (lambda opts: [*opts, "--qos=spot", "--requeue", "--signal=KILL@1", "--open-mode=append"], "--signal='KILL@1' is not a value"),
        (lambda opts: [*opts, "--qos=spot", "--requeue", "--signal=B:TERM@30", "--open-mode=truncate"], "is not a value"),
        (lambda opts: [*opts, "--qos=spot"], "a spot job carries all of --open-mode, --qos, --requeue, --signal"),
        (lambda opts: [*opts, "--requeue"], "a job Slurm may requeue carries both of --open-mode, --requeue"),
        (lambda opts: [*opts, "--requeue", "--open-mode=append"], "'--requeue' and '--no-requeue' contradict"),
        (lambda opts: [*opts, "--signal=B:TERM@30"], "a spot job carries all of --open-mode, --qos, --requeue, --signal"),
        (lambda opts: [*opts, "--requeue=1", "--qos=spot", "--signal=B:TERM@30", "--open-mode=append"], "as --requeue"),
        (lambda opts: [*opts, "--container-name=other"], "not one gpupool submits"),
        (lambda opts: [*opts, "--acc=root"], "not one gpupool submits"),  # getopt would take the prefix
        (lambda opts: [*opts, "-A", "root"], "not one gpupool submits"),
        (replaced("--account", "root"), "--account=acme"),
        (replaced("--account", None), "lacks"),
        (lambda opts: [*opts, "--account=acme"], "given twice"),
        (lambda opts: [*replaced("--job-name", None)(opts), "--job-name", "--chdir=/etc"], "--job-name=<value>"),
        (lambda opts: [*opts, "--ignore-pbs=no"], "as --ignore-pbs"),
        (replaced("--ignore-pbs", None), "lacks"),
        (replaced("--output", "/etc/cron.d/x"), "own folder"),
        (replaced("--output", f"{JOB_DIR}/%x.log"), "own folder"),
        (replaced("--chdir", f"{JOB_DIR}/.."), "'..'"),
        (replaced("--chdir", f"{JOB_DIR}/../other"), "'..'"),
        (replaced("--chdir", f"{JOB_DIR}/."), "'..', '.'"),
        (replaced("--error", f"{JOB_DIR}//stderr.log"), "'//'"),
        (replaced("--error", f"{JOB_DIR}/../{JOB_ID}/stderr.log"), "'..'"),
        (replaced("--comment", "gpupool:other"), "own gpupool tag"),
        (replaced("--partition", "x"), "--partition must be 'gpu'"),
        (replaced("--nodes", "4"), "--nodes must be '1'"),
        (replaced("--gres", "gpu:8,mps:100"), "not a value"),
        (replaced("--gres", "gpu:rtx4090:1(S:0)"), "not a value"),
        (replaced("--mem", "0"), "not a value"),
        (replaced("--time", "UNLIMITED"), "not a value"),
        (lambda opts: [*opts, "--mem=1G\x00--uid=0"], "not one gpupool submits"),
    ],
)
def test_anything_else_is_refused(change: Callable[[list[str]], list[str]], refusal: str) -> None:
    with pytest.raises(TenantError, match=re.escape(refusal)):
        check(change(rendered_options()))


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (replaced("--container-mounts", f"{JOB_DIR}:{JOB_DIR},/:/host"), "--container-mounts must be"),
        (replaced("--container-mounts", f"{JOB_DIR}/..:{JOB_DIR}"), "'..'"),
        (replaced("--container-workdir", "/"), "--container-workdir must be"),
        (replaced("--container-image", "docker.io#evil/miner"), "allowlist"),
        (replaced("--no-container-remap-root", None), "carries all of"),
    ],
)
def test_container_options_are_the_renderers_own(change: Callable[[list[str]], list[str]], refusal: str) -> None:
    with pytest.raises(TenantError, match=re.escape(refusal)):
        check(change(rendered_options("pyxis")))


def test_container_options_need_the_pyxis_runtime() -> None:
    with pytest.raises(TenantError, match="container_runtime pyxis"):
        check(rendered_options("pyxis"), SETTINGS.replace(container_runtime="none"))


def test_options_must_be_a_list_of_strings() -> None:
    with pytest.raises(TenantError, match="list of strings"):
        check_submit_options(SETTINGS, "--account=acme", "acme", JOB_ID)  # type: ignore[arg-type]


@pytest.mark.parametrize("account", ["../acme", "acme/..", "Acme", "", "a" * 33])
def test_only_account_names_name_a_folder(account: str) -> None:
    with pytest.raises(TenantError, match="not a gpupool account name"):
        job_folder(SETTINGS, account, JOB_ID)


def test_the_helpers_account_rule_is_the_models() -> None:
    from gpupool.models.accounts import ACCOUNT_NAME

    assert _ACCOUNT.pattern == ACCOUNT_NAME.pattern


# -- #SBATCH lines, read as sbatch 22.05 reads them ----------------------------------


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_the_renderers_script_repeats_only_its_own_options(runtime: str) -> None:
    job = rendered(runtime)
    directives = script_directives(job.script.encode())
    # Every option but the job name (customer text, argv only), unquoted as sbatch unquotes them.
    assert directives == [o for o in job.options if not o.startswith("--job-name=")]
    assert check_script(job.script, check(list(job.options))) == job.script.encode()


def test_a_body_that_prints_sbatch_lines_is_not_read() -> None:
    job = rendered(body="#SBATCH --account=other\necho '#SBATCH --gres=gpu:8'\n")
    assert check_script(job.script, list(job.options))


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("#!/bin/bash\n#SBATCH --time=5\necho\n#SBATCH --time=9\n", ["--time=5"]),
        # Blank lines, whitespace-only lines (C's isspace: \v and \f too) and comment lines do not stop it.
        ("#!/bin/bash\n\n  \t\n\v\f\n# note\n   # indented note\n#SBATCH --time=5\nrun\n", ["--time=5"]),
        # A prefix, not a word: "#SBATCH--time" is a directive; so is "#SLURM".
        ("#!/bin/bash\n#SBATCH--time=5\n#SLURM --time=6\n", ["--time=5", "--time=6"]),
        # Only in the first column: an indented one is a comment.
        ("#!/bin/bash\n  #SBATCH --time=5\n", []),
        # Several words on a line; quotes group and vanish; a backslash escapes a quote, but whitespace
        # ends a word before sbatch looks at what came before it; '#' starts a comment.
        ("#!/bin/bash\n#SBATCH --time=5   --mem=1G # --account=x\n", ["--time=5", "--mem=1G"]),
        ("#!/bin/bash\n#SBATCH --job-name='a b' --comment=\"x\\\"y\" --x=a\\ b\n", ["--job-name=a b", '--comment=x"y', "--x=a", "b"]),
        ("#!/bin/bash\n#SBATCH --comment=\"a#b\" --x=c#d e\n", ["--comment=a#b", "--x=c"]),
        ("#!/bin/bash\n#SBATCH\n#SBATCH   \n", []),
    ],
)
def test_directives_are_read_as_sbatch_reads_them(script: str, expected: list[str]) -> None:
    assert script_directives(script.encode()) == expected


@pytest.mark.parametrize(
    ("script", "refusal"),
    [
        ("#!/bin/bash\n#SBATCH --time=5 hetjob\n#SBATCH --account=other\n", "another job"),
        ("#!/bin/bash\n#SBATCH PackJob\n", "another job"),
        ("#!/bin/bash\n#SBATCH :\n", "':'"),
        ("#!/bin/bash\n#SBATCH --comment='x\n", "unmatched"),
        ("#!/bin/bash\n#SBATCH \"\" --account=other\n", "empty word"),
        ("#!/bin/bash\n\x00\n#SBATCH --account=other\n", "NUL"),
    ],
)
def test_what_sbatch_would_read_oddly_is_refused(script: str, refusal: str) -> None:
    with pytest.raises(TenantError, match=refusal):
        script_directives(script.encode())


@pytest.mark.parametrize(
    "directive",
    [
        "#SBATCH --account=other",
        "#SBATCH --partition=x",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --qos=high",
        "#SBATCH --export=ALL,LD_PRELOAD=/tmp/x.so",
        "#SBATCH -A other",
        "#SBATCH --acc=other",
        f"#SBATCH --chdir={JOB_DIR}/..",
        "#SLURM --account=other",
        "#SBATCH--account=other",
    ],
)
def test_a_script_with_a_directive_argv_would_not_carry_is_refused(directive: str) -> None:
    job = rendered()
    lines = job.script.split("\n")
    # After the renderer's own, before its first command: where sbatch still reads it.
    at = next(i for i, line in enumerate(lines) if line.startswith("set -euo"))
    script = "\n".join([*lines[:at], "", "# a comment", directive, *lines[at:]])
    with pytest.raises(TenantError, match="not one of the options gpupool submits it with"):
        check_script(script, check(list(job.options)))


def test_a_script_that_is_not_utf8_text_is_refused() -> None:
    with pytest.raises(TenantError, match="UTF-8"):
        check_script("#!/bin/bash\n\udc80\n", [])


# -- the helper's own environment ----------------------------------------------------


def test_the_helper_environment_holds_only_what_it_reads() -> None:
    settings = SETTINGS.replace(jwt_secret="s3cret", database_url="postgresql://u:pw@db/gpupool", web_session_secret="w")
    env = helper_environment(settings, {"SLURM_CONF": "/etc/slurm/other.conf", "GPUPOOL_CONFIG": "/etc/gpupool.toml", "HOME": "/root"})
    assert not any(secret in value for value in env.values() for secret in ("s3cret", "pw@db", "gpupool.toml"))
    assert set(env) == {"PATH", "LANG", "LC_ALL", "TZ", "SLURM_CONF", *(f"GPUPOOL_{name.upper()}" for name in HELPER_SETTINGS)}
    # Read back, it gives the helper the same settings, and the same environment again.
    again = load_settings(environ=env)
    assert all(getattr(again, name) == getattr(settings, name) for name in HELPER_SETTINGS)
    assert helper_environment(again, env) == env
    assert again.jwt_secret == "" and again.database_url.startswith("sqlite:")


def test_every_setting_the_helper_reads_is_a_setting() -> None:
    assert set(HELPER_SETTINGS) <= {field.name for field in dataclasses.fields(Settings)}


def entry(user: str, account: str) -> QueueEntry:
    return QueueEntry(1, "PENDING", None, None, None, None, None, f"gpupool:{JOB_ID}", user=user, account=account)


def test_a_tag_counts_only_from_the_accounts_own_tenant() -> None:
    settings = Settings(service_user="gpupool", service_group="gpupool")
    client = SlurmClient(settings, tenants=object())  # type: ignore[arg-type]
    assert client.owns(entry("gp-acme", "acme"), "acme")
    assert not client.owns(entry("gp-evil", "evil"), "acme")  # another tenant forging acme's tag
    assert not client.owns(entry("gp-evil", "acme"), "acme")  # a human with an association on acme
    assert not client.owns(entry("gpupool", "acme"), "acme")  # the service itself


def test_a_members_tag_counts_only_from_that_members_own_user() -> None:
    client = SlurmClient(Settings(service_user="gpupool", service_group="gpupool"), tenants=object())  # type: ignore[arg-type]
    assert client.owns(entry("gp-200101-acme", "acme"), "acme", "gp-200101-acme")
    assert not client.owns(entry("gp-200102-acme", "acme"), "acme", "gp-200101-acme")  # another member of acme
    assert not client.owns(entry("gp-acme", "acme"), "acme", "gp-200101-acme")  # the account's own user
    assert not client.owns(entry("gp-200101-acme", "evil"), "acme", "gp-200101-acme")  # under another account


def test_tenant_user_names_fit_useradd() -> None:
    settings = Settings(service_user="gpupool", service_group="gpupool")
    assert tenant_user_name(settings, "acme") == "gp-acme"
    with pytest.raises(TenantError, match="too long"):
        tenant_user_name(settings, "a" * 30)


@pytest.mark.parametrize(
    ("account", "uid", "name"),
    [
        ("acme", 200123, "gp-200123-acme"),
        # Cut to useradd's 32 characters; the uid before the cut keeps it unique.
        ("a" * 29, 299999, "gp-299999-" + "a" * 22),
        # Never ending in a separator.
        ("abcdefghijklmnopqrstu-xy", 200000, "gp-200000-abcdefghijklmnopqrstu"),
    ],
)
def test_member_user_names_are_made_of_the_uid_and_fit_useradd(account: str, uid: int, name: str) -> None:
    settings = Settings(service_user="gpupool", service_group="gpupool")
    made = member_user_name(settings, account, uid)
    assert made == name and len(made) <= 32 and UNIX_USER_NAME.fullmatch(made)
    # What follows the prefix is no account name (those start with a letter): never taken for an account's user.
    assert not _ACCOUNT.match(made[len("gp-"):])


def test_a_helper_that_takes_a_submit_and_drops_the_connection_leaves_it_uncertain(tmp_path: Path) -> None:
    """The helper may have run sbatch: the API must look for the tag, never free the request."""
    path = str(tmp_path / "runas.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def take_and_drop() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)

    taker = threading.Thread(target=take_and_drop)
    taker.start()
    client = RunasClient(Settings(service_user="gpupool", service_group="gpupool", runas_socket=path))
    with pytest.raises(SubmissionUncertain):
        client.submit(Sbatch("acme", JOB_ID, "#!/bin/bash\n", rendered_options()), timeout_s=2)
    taker.join()
    listener.close()


def test_no_helper_at_all_is_unavailable_and_nothing_was_sent(tmp_path: Path) -> None:
    client = RunasClient(Settings(service_user="gpupool", service_group="gpupool", runas_socket=str(tmp_path / "none.sock")))
    with pytest.raises(RunasUnavailable, match="not answering"):
        client.submit(Sbatch("acme", JOB_ID, "#!/bin/bash\n", rendered_options()), timeout_s=2)
