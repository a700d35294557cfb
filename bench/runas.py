"""bench/runas: what acting as the tenant costs per submit, for each way of getting there.

The same held job, submitted as the bench account's tenant user three ways,
interleaved round by round:

- sbatch started as the tenant by its root parent (the floor: no privilege step);
- through gpupool's run-as helper over its Unix socket (what the API does);
- through ``sudo -u <tenant> sbatch`` (what a sudoers drop-in would cost; sudo
  runs its PAM session for every call). Under the API's systemd unit this path
  cannot work at all: NoNewPrivileges=yes stops every setuid program.

Jobs are held (``--hold``) so nothing starts; all are cancelled at the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from bench._harness import bench_env, median, percentile, slurm, table
from bench.submit import timed
from gpupool.config import load_settings
from gpupool.proc import minimal_env, run_command
from gpupool.render import JobSpec, render
from gpupool.slurm.runas.client import RunasClient
from gpupool.slurm.runas.request import Sbatch
from gpupool.slurm.tenants import ensure_tenant_folder, lookup_tenant
from gpupool.templates import load_templates

ROUNDS = 40
SUDO = "/usr/bin/sudo"
HELLO = load_templates(Path(__file__).resolve().parent.parent / "slurm_templates")["hello"]


def rendered_for(account: str, job_root: Path) -> tuple[str, str, tuple[str, ...]]:
    job_id = str(uuid.uuid4())
    spec = JobSpec(
        job_id=job_id, account=account, name="bench", template="hello", body=HELLO.body,
        params={"message": "bench", "seconds": 0}, gpus=1, gpu_type=None, cpus=1, mem_gb=4,
        time_limit_min=60, partition="gpu", job_dir=str(job_root / account / job_id),
    )
    rendered = render(spec)
    return job_id, rendered.script, rendered.options


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp), slurm_gpu_limit=0) as env:
        account, job_root = env["account"], Path(env["job_root"])
        settings = load_settings(
            environ={}, overrides={"job_root": str(job_root), "runas_socket": env["runas_socket"],
                                   "service_user": "gpupool", "service_group": "gpupool"},
        )
        tenant = lookup_tenant(settings, account)
        helper = RunasClient(settings)
        direct_dir = ensure_tenant_folder(settings, tenant, str(uuid.uuid4()))
        _, script, options = rendered_for(account, job_root)
        script_path = direct_dir / "job.sbatch"
        script_path.write_text(script)
        shutil.chown(script_path, tenant.uid, tenant.gid)
        # The direct and sudo sides reuse one folder: chdir/output options point into it.
        fixed_options = [opt for opt in options if not opt.startswith(("--chdir", "--output", "--error", "--comment"))]
        fixed_options += [f"--chdir={direct_dir}", f"--output={direct_dir}/out.log", "--hold"]
        sbatch = ["/usr/bin/sbatch", "--parsable", *fixed_options, str(script_path)]

        def as_tenant() -> None:
            run_command(sbatch, timeout_s=30, env=minimal_env({"HOME": str(direct_dir)}), run_as=tenant.run_as(), cwd=str(direct_dir))

        def via_helper() -> None:
            job_id, helper_script, helper_options = rendered_for(account, job_root)
            helper.submit(Sbatch(account, job_id, helper_script, [*helper_options]), timeout_s=30)

        def via_sudo() -> None:
            run_command([SUDO, "-n", "-u", tenant.user, *sbatch], timeout_s=30, env=minimal_env(), cwd=str(direct_dir))

        sides: dict[str, Callable[[], None]] = {
            "sbatch as the tenant (floor)": as_tenant,
            "run-as helper (socket)": via_helper,
        }
        if Path(SUDO).exists():
            sides["sudo -u tenant sbatch"] = via_sudo
        else:
            print(f"{SUDO} is not installed: the sudo side is left out (apt-get install sudo to measure it)")
        for action in sides.values():  # warm caches: nss, munge, the helper's imports
            action()
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(ROUNDS):
            for name, action in sides.items():
                samples[name].append(timed(action))
        slurm("scancel", f"--account={account}", check=False)
        floor = median(samples["sbatch as the tenant (floor)"])
        rows = [
            (name, f"p50 {median(values) * 1000:6.1f} ms   p95 {percentile(values, 0.95) * 1000:6.1f} ms   "
                   f"+{(median(values) - floor) * 1000:5.1f} ms over the floor")
            for name, values in samples.items()
        ]
        table(f"bench/runas: one held submit as the tenant, {ROUNDS} rounds", rows)


if __name__ == "__main__":
    main()
