"""bench/invoice: export an invoice of 1,000,000 ledger lines through ``gpupool invoice``.

The ledger rows are generated inside PostgreSQL (one job run each, so one
invoice line each), then the operator's command writes the CSV while this
script measures its wall time and peak resident memory (ru_maxrss of the child).
Baseline, in the same script: PostgreSQL's own ``COPY (SELECT ...) TO STDOUT``
of the same rows, the fastest export the database can do.
Targets: >= 100,000 rows/s and < 200 MB.

Usage: python -m bench.invoice [--lines 1000000]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from bench._harness import BIN, filled_database, table

FILL = """
INSERT INTO billing_passes (id, kind, started_at, finished_at, source, source_sha256, sacct_rows, ledger_rows, adjustment_rows)
VALUES (1, 'bench', now(), now(), 'bench', '', 0, 0, 0);
INSERT INTO accounts (name, gpu_limit, created_at) VALUES ('acme', NULL, now());
INSERT INTO ledger_entries (pass_id, account, cluster, slurm_job_id, job_id_raw, run_start, gpupool_job_id, job_name,
    state, gpu_type, gpus, period, interval_from, interval_to, seconds, gpu_seconds, unit_price_nanos, amount_nanos,
    correction, final)
SELECT 1, 'acme', 'gpupool', i::text, i, t, NULL, 'job "' || i || '", sweep|' || (i % 7), 'COMPLETED',
       CASE WHEN i % 3 = 0 THEN 'rtx3090' ELSE 'rtx4090' END, 1 + i % 4, '2026-11', t, t + d, s, s * (1 + i % 4),
       120000, s * (1 + i % 4) * 120000, false, true
FROM (SELECT i, timestamptz '2026-11-01 00:00:00+00' + (i % 2500000) * interval '1 second' AS t,
             (1 + i % 7200)::bigint AS s, (1 + i % 7200) * interval '1 second' AS d
      FROM generate_series(1, :lines) AS i) AS g;
ANALYZE ledger_entries;
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with filled_database(FILL, {"lines": args.lines}) as (url, engine), tempfile.TemporaryDirectory() as tmp_name:
        out = Path(tmp_name) / "invoice.csv"
        env = {"PATH": "/usr/bin:/bin", "GPUPOOL_DATABASE_URL": url, "HOME": os.environ.get("HOME", "/root")}
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.perf_counter()
        subprocess.run(
            [str(BIN / "gpupool"), "invoice", "--account", "acme", "--period", "2026-11", "-o", str(out)],
            env=env, check=True, capture_output=True, timeout=1800,
        )
        export_s = time.perf_counter() - started
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        lines = sum(1 for _ in out.open(newline="")) if out.stat().st_size < 2**31 else -1
        size_mb = out.stat().st_size / 1e6

        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            started = time.perf_counter()
            with open(Path(tmp_name) / "copy.csv", "w") as sink:
                cursor.copy_expert(
                    "COPY (SELECT slurm_job_id, job_name, gpu_type, gpus, interval_from, interval_to, seconds, "
                    "gpu_seconds, unit_price_nanos, amount_nanos FROM ledger_entries WHERE account = 'acme' "
                    "AND period = '2026-11' ORDER BY interval_from, cluster, job_id_raw) TO STDOUT WITH (FORMAT csv)",
                    sink,
                )
            copy_s = time.perf_counter() - started
        finally:
            raw.close()

    rate = args.lines / export_s
    table(
        f"bench/invoice: {args.lines:,} ledger lines -> one CSV ({size_mb:,.0f} MB, {lines:,} lines with header and total)",
        [
            ("gpupool invoice", f"{rate:>10,.0f} rows/s  ({export_s:.1f} s)  target >= 100,000"),
            ("peak memory (ru_maxrss)", f"{max(peak_kib, before) / 1024:>10,.0f} MB  target < 200"),
            ("PostgreSQL COPY TO (baseline)", f"{args.lines / copy_s:>10,.0f} rows/s  ({copy_s:.1f} s)"),
            ("gpupool / COPY", f"{rate / (args.lines / copy_s):.2f}"),
        ],
    )


if __name__ == "__main__":
    main()
