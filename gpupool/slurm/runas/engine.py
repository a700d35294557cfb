"""What the run-as helper does as root: act as a tenant through sbatch, scancel and sacctmgr, and make the job folder.

``DirectTenantActions`` checks each request (``gpupool.slurm.runas.checks``)
before it acts, creates the job folder and its files without following links,
and runs each command as the tenant (``setpriv``, through ``gpupool.proc``)
with a minimal environment. The helper's server runs it; an operator's shell
that is root uses it directly.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from gpupool.config import Settings
from gpupool.errors import CommandFailed, ConfigError, TenantError
from gpupool.proc import CommandResult, minimal_env, run_command
from gpupool.render import ARRAY_VALUES_DIR, SESSION_PORT_FILE, SESSION_SECRET_FILE, log_path
from gpupool.slurm.runas.checks import (
    array_count,
    cancel_target,
    check_account,
    check_array_values,
    check_job_id,
    check_script,
    check_session_secret,
    check_submit_options,
    job_folder,
)
from gpupool.slurm.runas.request import Sbatch
from gpupool.slurm.tenants import Tenant, account_users, ensure_tenant_folder, lookup_member, lookup_tenant, service_gid

SCRIPT_NAME = "job.sbatch"
# The job's umask, which sbatch hands slurmstepd as SLURM_UMASK: what a job writes
# is its tenant's alone unless its own code says otherwise (gpupool.slurm.tenants).
JOB_UMASK = "0077"
# The TRES an account's Slurm budget counts: GPU-minutes of any type (billing.enforcement).
BUDGET_TRES = "gres/gpu"


class DirectTenantActions:
    """Acts as tenants itself: needs root. The helper's engine, and the operator's when root."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _tenant(self, account: str, user: str | None = None) -> Tenant:
        """The account's own user, or its member user ``user``, as this host's users say, never the caller."""
        if os.geteuid() != 0:
            raise ConfigError(
                "acting as a tenant needs root: set runas_socket to the gpupool runas helper's socket, "
                "or run this command as root"
            )
        if user is None:
            return lookup_tenant(self.settings, check_account(account))
        if not isinstance(user, str):
            raise TenantError("a member user is a user name")
        return lookup_member(self.settings, check_account(account), user)

    def _env(self, tenant: Tenant, job_dir: Path) -> dict[str, str]:
        # Exported to the job by sbatch: nothing of root's or the service's environment.
        return minimal_env(
            {"PATH": self.settings.job_path, "HOME": str(job_dir), "USER": tenant.user, "LOGNAME": tenant.user,
             "SLURM_UMASK": JOB_UMASK}
        )

    def submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult:
        job_dir = job_folder(self.settings, sbatch.account, sbatch.job_id)
        tenant = self._tenant(sbatch.account, sbatch.user)
        argv_options = check_submit_options(self.settings, list(sbatch.options), sbatch.account, sbatch.job_id)
        data = check_script(sbatch.script, argv_options)
        check_session_secret(sbatch.session_secret)
        tasks = array_count(argv_options)
        values = check_array_values(sbatch.array_values, tasks)
        ensure_tenant_folder(self.settings, tenant, sbatch.job_id)
        self._write_service_files(job_dir, data, tenant, sbatch.session_secret, tasks)
        if values is not None:
            self._write_array_values(job_dir, values, tenant)
        # On standard input, not by path: the folder is the tenant's, and a tenant's
        # process could swap the file between this check and sbatch's read.
        argv = [self.settings.slurm_bin("sbatch"), "--parsable", *argv_options]
        return run_command(
            argv, timeout_s=timeout_s, input_text=sbatch.script, env=self._env(tenant, job_dir), run_as=tenant.run_as(),
            cwd=str(job_dir),
        )

    def test_submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult:
        """``sbatch --test-only`` as the tenant, on what ``submit`` would send: Slurm's estimate, and no job.

        The flag is added here, never taken from the caller (it is not in the
        option list), so ``submit`` cannot be made a test and this cannot submit.
        Nothing is written: the folder the options name need not exist, since
        sbatch only reads it at the job's start, which a test never has. The
        session secret and array values are not looked at: nothing runs.
        """
        tenant = self._tenant(sbatch.account, sbatch.user)
        argv_options = check_submit_options(self.settings, list(sbatch.options), sbatch.account, sbatch.job_id)
        check_script(sbatch.script, argv_options)
        argv = [self.settings.slurm_bin("sbatch"), "--test-only", *argv_options]
        return run_command(
            argv, timeout_s=timeout_s, input_text=sbatch.script, env=self._env(tenant, Path("/")), run_as=tenant.run_as(), cwd="/",
        )

    def _write_service_files(
        self, job_dir: Path, script: bytes, tenant: Tenant, session_secret: str | None, tasks: int | None = None
    ) -> None:
        """The job's script, the record of what was submitted, and its two logs, empty.

        The only files in the folder the service may read (group service, 0640):
        slurmstepd opens an existing output file as the tenant and truncates it,
        keeping its owner, group and mode, so the logs stay readable to the API
        while everything else the job writes does not. A session job also gets
        its port file (written by the job, read by the service like a log) and
        its secret, 0600: the tenant's alone (the service has it in its database).
        An array job's tasks each get their own two logs (``stdout-<index>.log``).
        """
        group = service_gid(self.settings)
        files = {SCRIPT_NAME: (script, 0o640)}
        for task in range(tasks) if tasks is not None else [None]:
            files |= {os.path.basename(log_path(str(job_dir), stream, task)): (b"", 0o640) for stream in ("stdout", "stderr")}
        if session_secret is not None:
            files[SESSION_PORT_FILE] = (b"", 0o640)
            files[SESSION_SECRET_FILE] = (session_secret.encode() + b"\n", 0o600)
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name, (data, mode) in files.items():
                # Made 0600 first, so the service group never reads a secret before its mode is set.
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as handle:
                    os.fchown(handle.fileno(), tenant.uid, group)
                    os.fchmod(handle.fileno(), mode)  # whatever the helper's umask
                    handle.write(data)
        finally:
            os.close(dir_fd)

    def _write_array_values(self, job_dir: Path, values: Sequence[str], tenant: Tenant) -> None:
        """Each task's sweep value in ``array-values/<index>``: data the task reads, the tenant's alone."""
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.mkdir(ARRAY_VALUES_DIR, 0o700, dir_fd=dir_fd)
            values_fd = os.open(ARRAY_VALUES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            os.fchown(values_fd, tenant.uid, tenant.gid)
            for index, value in enumerate(values):
                fd = os.open(
                    str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=values_fd
                )
                with os.fdopen(fd, "wb") as handle:
                    os.fchown(handle.fileno(), tenant.uid, tenant.gid)
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(value.encode("utf-8"))
        finally:
            os.close(values_fd)

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult:
        """scancel the jobs as ``user`` (a member user of the account; None: the account's own user).

        Without ids, every job of the account, as each of its users that this
        host has (``account_users``): the account's own and every member's.
        """
        if slurm_job_ids is None:
            if user is not None:
                raise TenantError("cancelling every job of an account names no user: each of its users cancels its own")
            self._tenant(account)  # root, and a tenant account, before anything else
            results: list[CommandResult] = []
            failure: CommandFailed | None = None
            for tenant in account_users(self.settings, account):
                try:
                    results.append(self._scancel(tenant, [f"--account={account}", f"--user={tenant.user}"]))
                except CommandFailed as exc:  # the others' jobs are still cancelled
                    failure = failure or exc
            if failure is not None:
                raise failure
            return results[0]
        tenant = self._tenant(account, user)
        if not slurm_job_ids or not all(cancel_target(job) for job in slurm_job_ids):
            raise TenantError("scancel needs positive Slurm job ids, or <array job id>_<task index>")
        return self._scancel(tenant, [str(job) for job in slurm_job_ids])

    def _scancel(self, tenant: Tenant, targets: list[str]) -> CommandResult:
        return run_command(
            [self.settings.slurm_bin("scancel"), *targets],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/", "USER": tenant.user}),
            run_as=tenant.run_as(),
            cwd="/",
        )

    def discard(self, account: str, job_id: str) -> None:
        self._tenant(account)
        check_job_id(job_id)
        account_dir = Path(self.settings.job_root) / account
        account_fd = os.open(account_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # rmtree with dir_fd never follows a link the tenant may have planted.
            shutil.rmtree(job_id, dir_fd=account_fd, ignore_errors=True)
        finally:
            os.close(account_fd)

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult:
        """GrpTRESMins=gres/gpu of a tenant account's association (None: no limit), as root.

        Only a tenant account (checked as for every other operation), only this
        one limit, only a whole number: the service gains no other Slurm right.
        """
        self._tenant(account)
        if gpu_minutes is not None and (not isinstance(gpu_minutes, int) or isinstance(gpu_minutes, bool) or gpu_minutes < 0):
            raise TenantError("a budget is a whole number of GPU-minutes, 0 or more, or none")
        value = "-1" if gpu_minutes is None else str(gpu_minutes)
        return self._sacctmgr_modify(["account", "where", f"name={account}", "set", f"GrpTRESMins={BUDGET_TRES}={value}"])

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult:
        """GrpTRES and GrpTRESMins (gres/gpu) of a member user's own association under ``account``, as root.

        Only a user this host shows to be a member user of that account, only
        these two limits, only whole numbers (None: no limit): a member's GPUs
        at once and what is left of their monthly limit, which Slurm then holds
        their jobs to however they are submitted. The account's own limits
        stay on the account's association, above it.
        """
        tenant = self._tenant(account, user)
        if not tenant.is_member:
            raise TenantError("member limits are set on a member's user, not on the account's own")
        values = []
        for what, number in (("GPU limit", gpu_limit), ("budget", gpu_minutes)):
            if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 0):
                raise TenantError(f"a member's {what} is a whole number, 0 or more, or none")
            values.append("-1" if number is None else str(number))
        return self._sacctmgr_modify(
            ["user", "where", f"name={tenant.user}", f"account={account}",
             "set", f"GrpTRES={BUDGET_TRES}={values[0]}", f"GrpTRESMins={BUDGET_TRES}={values[1]}"]
        )

    def _sacctmgr_modify(self, args: list[str]) -> CommandResult:
        """``sacctmgr --immediate modify ARGS`` as root; a limit already at that value is no failure."""
        result = run_command(
            [self.settings.slurm_bin("sacctmgr"), "--immediate", "modify", *args],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/"}),
            check=False,
            cwd="/",
        )
        # sacctmgr exits 1 with "Nothing modified" when the limit is already set.
        if result.returncode != 0 and "Nothing modified" not in result.stdout + result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result
