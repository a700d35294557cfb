"""bench/poll: 200 concurrent pollers of GET /jobs/<id> for 30 s, under gunicorn.

The load comes from wrk (C, so the 2 cores go to the server). Reports req/s,
p50/p99 latency, and how many squeue/sacct calls the service made, counted by
wrapper scripts in GPUPOOL_SLURM_BIN_DIR. Targets: >= 1000 req/s on 2 cores,
Slurm calls <= duration/interval + 2. The baseline beside it is the naive
design, one `squeue -j` per poll, run at concurrency 8 for a few seconds.
With ``--array N`` the polled job is an array of N tasks, one running at a time
(the others pending in one squeue row): its state still costs the one batched squeue.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from pathlib import Path

from bench._harness import bench_env, gunicorn, http, require_wrk, slurm, table
from gpupool.proc import minimal_env, run_command

INTERVAL_S = 5.0


def naive_rate(slurm_job_id: int, seconds: float = 5.0, concurrency: int = 8) -> float:
    count = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop_at:
            run_command(["/usr/bin/squeue", "-h", "-j", str(slurm_job_id), "-o", "%T"], timeout_s=30, env=minimal_env())
            with lock:
                count[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count[0] / seconds


def wrk_ms(text: str, label: str) -> float:
    match = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.MULTILINE)
    if not match:
        raise RuntimeError(f"no {label} latency in wrk output:\n{text}")
    value, unit = float(match[1]), match[2]
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--array", type=int, default=0, help="poll an array job of this many tasks, one running at a time")
    args = parser.parse_args()
    wrk = require_wrk("bench/poll")
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp)) as env:
        # gunicorn runs as the service user: it must reach the counting wrappers and write their log.
        Path(tmp).chmod(0o755)
        env["calls"].chmod(0o666)
        with gunicorn(env, workers=args.workers, slurm_bin_dir=str(env["wrappers"]), refresh_interval_s=str(INTERVAL_S)) as url:
            body: dict[str, object] = {"template": "hello", "gpus": 1, "params": {"seconds": 600}}
            if args.array:
                body["array"] = {"count": args.array, "max_parallel": 1}
            submitted = http("POST", url + "/submit", token=env["token"], body=body)
            assert submitted.status == 201, submitted.body
            job = submitted.body
            while http("GET", f"{url}/jobs/{job['job_id']}", token=env["token"]).body["state"] != "RUNNING":
                time.sleep(0.5)
            env["calls"].write_text("")
            result = run_command(
                [wrk, "-t", "2", "-c", str(args.connections), "-d", f"{args.duration}s", "--latency", "--timeout", "10s",
                 "-H", f"Authorization: Bearer {env['token']}", f"{url}/jobs/{job['job_id']}"],
                timeout_s=args.duration + 60,
                env=minimal_env(),
            )
            calls = env["calls"].read_text().split()
            queries = sum(1 for name in calls if name in ("squeue", "sacct"))
            final = http("GET", f"{url}/jobs/{job['job_id']}", token=env["token"]).body
        baseline = naive_rate(job["slurm_job_id"])
        slurm("scancel", str(job["slurm_job_id"]), check=False)
    out = result.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors:.*", out)
    budget = args.duration / INTERVAL_S + 2
    table(
        f"bench/poll ({args.connections} pollers, {args.duration} s, {args.workers} gunicorn workers, refresh every {INTERVAL_S:g} s"
        + (f", an array of {args.array} tasks)" if args.array else ")"),
        [
            ("GET /jobs/<id>", f"{rate:.0f} req/s (target >= 1000)"),
            ("latency p50 / p99", f"{wrk_ms(out, '50%'):.1f} ms / {wrk_ms(out, '99%'):.1f} ms"),
            ("non-2xx responses", errors[1] if errors else "0"),
            ("socket errors", socket_errors[0] if socket_errors else "none"),
            ("squeue + sacct calls", f"{queries} (budget {budget:.0f})"),
            ("job state at the end", final["state"] + (f" (tasks {final['array']['states']})" if args.array else "")),
            ("baseline: squeue per poll", f"{baseline:.0f} req/s at concurrency 8"),
            ("ratio to baseline", f"{rate / baseline:.1f}x"),
        ],
    )


if __name__ == "__main__":
    main()
