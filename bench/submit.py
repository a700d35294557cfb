"""bench/submit: POST /submit under gunicorn against raw `sbatch --parsable`, side by side.

Both sides submit the same rendered hello script (1 GPU) to the same cluster,
interleaved so queue growth affects them alike. The bench account's Slurm GPU
limit is 0, so every job stays pending: on 2 cores, jobs starting and ending
would otherwise steal CPU from whichever side happens to be timed. Reports the
median latency of each, their ratio (target <= 1.3) and jobs/s at concurrency 8.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import bench_env, gunicorn, http, median, percentile, slurm, table  # noqa: E402
from gpupool.proc import minimal_env, run_command  # noqa: E402
from gpupool.render import JobSpec, render  # noqa: E402
from gpupool.templates import load_templates  # noqa: E402

ROUNDS = 60
CONCURRENT_JOBS = 96
BODY = {"template": "hello", "gpus": 1, "params": {"message": "bench"}}


def raw_sbatch(account: str, job_dir: Path) -> Callable[[], None]:
    hello = load_templates(Path(__file__).resolve().parent.parent / "slurm_templates")["hello"]
    spec = JobSpec(
        job_id="00000000-0000-4000-8000-000000000000", account=account, name="hello", template="hello",
        body=hello.body, params={"message": "bench", "seconds": 0}, gpus=1, gpu_type=None, cpus=1, mem_gb=4,
        time_limit_min=60, partition="gpu", job_dir=str(job_dir),
    )
    job_dir.mkdir(parents=True, exist_ok=True)
    rendered = render(spec)
    script = job_dir / "job.sbatch"
    script.write_text(rendered.script)
    argv = ["/usr/bin/sbatch", "--parsable", *rendered.options, str(script)]

    def submit() -> None:
        run_command(argv, timeout_s=30, env=minimal_env())

    return submit


def timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def throughput(action: Callable[[], None], jobs: int, concurrency: int) -> float:
    remaining = [jobs]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            action()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return jobs / (time.perf_counter() - started)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp), slurm_gpu_limit=0) as env:
        sbatch = raw_sbatch(env["account"], Path(tmp) / "raw")
        with gunicorn(env, workers=4) as url:

            def api_submit() -> None:
                reply = http("POST", url + "/submit", token=env["token"], body=BODY)
                if reply.status != 201:
                    raise RuntimeError(f"submit failed: {reply.status} {reply.body}")

            for action in (sbatch, api_submit):  # warm caches, connections, imports
                action()
            api_times, raw_times = [], []
            for _ in range(ROUNDS):
                raw_times.append(timed(sbatch))
                api_times.append(timed(api_submit))
            raw_rate = throughput(sbatch, CONCURRENT_JOBS, 8)
            slurm("scancel", f"--account={env['account']}", check=False)
            api_rate = throughput(api_submit, CONCURRENT_JOBS, 8)
            slurm("scancel", f"--account={env['account']}", check=False)
    ratio = median(api_times) / median(raw_times)
    table(
        f"bench/submit ({ROUNDS} interleaved rounds; {CONCURRENT_JOBS} jobs at concurrency 8)",
        [
            ("raw sbatch median", f"{median(raw_times) * 1000:.1f} ms (p90 {percentile(raw_times, 0.9) * 1000:.1f} ms)"),
            ("POST /submit median", f"{median(api_times) * 1000:.1f} ms (p90 {percentile(api_times, 0.9) * 1000:.1f} ms)"),
            ("latency ratio", f"{ratio:.2f} (target <= 1.3)"),
            ("raw sbatch, conc. 8", f"{raw_rate:.0f} jobs/s"),
            ("POST /submit, conc. 8", f"{api_rate:.0f} jobs/s"),
        ],
    )


if __name__ == "__main__":
    main()
