"""Run every benchmark and print one table.

    python bench/run_all.py [--quick]

Rows: timing-pass overhead (engine step against a bare step, CPU or CUDA), claim to
first step on a warm worker, step rows per second written through the batch writer
(SQLite, and PostgreSQL when Debian's binaries are there), series latency at 1,000,000
steps, stream latency (step commit to SSE client), sweep throughput with 1, 2 and 4
workers. Then ckptlab beside MLflow (:mod:`bench_vs_mlflow`): ingest and cold/warm series
reads at 10^4 to 10^7 steps, MLflow run in the Python given by ``--mlflow-python`` (one with
``mlflow==3.17.2``: ``make bench-mlflow``), its columns "not run" without it. ``--quick``
(CI) uses fewer samples and smaller models, a 100,000-step series, 1 and 2 workers and the
comparison at 10^4 steps only; the numbers in docs/benchmarks.md come from the full mode.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import bench_api  # noqa: E402
import bench_overhead  # noqa: E402
import bench_sweep  # noqa: E402
import bench_vs_mlflow  # noqa: E402
import bench_worker  # noqa: E402
import torch  # noqa: E402


def _postgres_rows(rows: int) -> float | None:
    from tests.postgres import PostgresCluster, find_pg_bin

    pg_bin = find_pg_bin()
    if pg_bin is None:
        return None
    cluster = PostgresCluster(pg_bin)
    try:
        return bench_worker.bench_writes(cluster.create_database(), rows)["rows_per_s"]
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, smaller models (CI, < 2 min)")
    ap.add_argument("--mlflow-python", help="a Python with mlflow==3.17.2 for the ckptlab/MLflow table")
    ap.add_argument(
        "--mlflow-steps",
        help="run sizes of the ckptlab/MLflow table, comma-separated (default 10^4..10^7; quick: 10^4)",
    )
    args = ap.parse_args()
    q = args.quick
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows: list[tuple[str, str]] = []
    t0 = time.perf_counter()

    for name, cfg in bench_overhead.CONFIGS.items():
        if q and name not in bench_overhead.QUICK:
            continue
        r = bench_overhead.measure(name, cfg, device, rounds=1 if q else 4, steps=5 if q else 8)
        rows.append(
            (
                f"timing-pass overhead over a bare loop, {name} ({device})",
                f"{r['timed_overhead_pct']:+.1f}% ({r['bare_ms']:.1f} -> {r['timed_ms']:.1f} ms; "
                f"memory pass {r['memory_pass_overhead_pct']:+.1f}%)",
            )
        )

    with tempfile.TemporaryDirectory(prefix="ckptlab-bench-") as tmp:
        warm = bench_worker.bench_warm_start(3 if q else 10, Path(tmp))
        rows.append(
            (
                "claim -> first step, warm worker (median / max)",
                f"{warm['claim_to_first_step_median_s']:.3f} s / {warm['claim_to_first_step_max_s']:.3f} s",
            )
        )
        n_rows = 5_000 if q else 20_000
        sqlite = bench_worker.bench_writes(f"sqlite:///{Path(tmp) / 'writes.db'}", n_rows)
        rows.append((f"rows/s written, SQLite ({n_rows} rows)", f"{sqlite['rows_per_s']:,.0f}"))
    pg = _postgres_rows(5_000 if q else 20_000)
    rows.append(("rows/s written, PostgreSQL", f"{pg:,.0f}" if pg else "skipped (no PostgreSQL binaries)"))

    # Quick mode (CI) reads a 100,000-step run: the rollup makes the read's cost independent
    # of the length, and inserting a million rows is most of the quick mode's time.
    series_steps = 100_000 if q else 1_000_000
    at = f"series at {series_steps:,} steps"
    stream, series = bench_api.run(
        stream_steps=60 if q else 300,
        interval=0.05 if q else 0.1,
        series_steps=series_steps,
        series_repeats=5,
        live=not q,
    )
    rows.append(("stream latency commit -> client (p50 / p95)", f"{stream['p50_ms']:.0f} / {stream['p95_ms']:.0f} ms"))
    if "live_first_ms" in series:  # full mode only: a second 1,000,000-step run
        rows.append(
            (
                f"{at}, run seen running, first request (max over metrics)",
                f"{max(series['live_first_ms'].values()):.0f} ms",
            )
        )
    rows.append(
        (
            f"{at}, repeated request (p50 / p95)",
            f"{series['warm_p50_ms']:.0f} / {series['warm_p95_ms']:.0f} ms",
        )
    )
    rows.append(
        (
            f"{at}, finished run's first request after a restart (max)",
            f"{max(series['cold_ms'].values()):.0f} ms",
        )
    )

    for n in (1, 2) if q else (1, 2, 4):  # quick mode (CI) checks the command, not the scaling
        r = bench_sweep.run(n, 6 if q else 24)
        rows.append(
            (
                f"sweep throughput, {n} worker(s)",
                f"{r['per_minute']} experiments/min ({r['finished']} in {r['seconds']} s)",
            )
        )

    if args.mlflow_steps:
        sizes = [int(s) for s in args.mlflow_steps.split(",")]
    else:
        sizes = [10_000] if q else list(bench_vs_mlflow.SIZES)
    versus = bench_vs_mlflow.compare(sizes, mlflow_python=args.mlflow_python, cold=1 if q else 3, warm=3)

    print(
        f"ckptlab benchmarks ({'quick' if q else 'full'}) on {os.cpu_count()} cores, {platform.machine()}, "
        f"{device}, torch {torch.__version__}, {datetime.date.today()}, {time.perf_counter() - t0:.0f} s"
    )
    print("| benchmark | result |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\nckptlab beside MLflow (same run; ratios: how many times faster ckptlab is)\n")
    print(bench_vs_mlflow.table(versus))


if __name__ == "__main__":
    main()
