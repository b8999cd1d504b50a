"""The benchmark command runs in quick mode and prints every row (not its numbers: those
are machine-dependent and recorded in docs/benchmarks.md)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmarks_print_one_table():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    names = " ".join(table)
    for row in (
        "timing-pass overhead",
        "claim -> first step",
        "rows/s written, SQLite",
        "rows/s written, PostgreSQL",
        "stream latency",
        "series at 100,000 steps",
        "sweep throughput, 1 worker",
        "sweep throughput, 2 worker",
    ):
        assert row in names, f"missing row {row!r} in\n{result.stdout}"
    assert "ms" in names and "experiments/min" in names
    # ckptlab's side of the ckptlab/MLflow table (MLflow itself is not installed here)
    versus = [line for line in table if line.startswith("| 10,000 |")]
    assert len(versus) == 1 and "not run (no --mlflow-python)" in versus[0], result.stdout
