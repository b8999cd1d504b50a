"""ckptlab beside MLflow in one run (issue 24): step ingest and cold/warm series reads of one
run at each size, ckptlab and MLflow measured back to back, size by size, on the same
machine and hour.

    .venv/bin/python bench/bench_vs_mlflow.py --mlflow-python /tmp/mlvenv/bin/python \\
        [--steps 10000,100000,1000000,10000000] [--cold 3] [--warm 3] [--bulk-from 10000000]

(``bench/run_all.py --mlflow-python PATH`` prints the same table among its rows.) MLflow is
never a ckptlab dependency: it runs in the Python named by ``--mlflow-python``, one with
``mlflow==3.17.2`` (``make bench-mlflow`` makes ``.bench-mlflow/``), through
``bench/bench_mlflow.py``; without it the MLflow columns say "not run".

Per size:

- **ingest**, steps per second: ckptlab's worker path (:func:`bench_worker.bench_writes`:
  the ``StepWriter`` thread, SQLite, rollup included); MLflow's ``log_batch`` into its
  SQLite store, 7 metrics per step both. At ``--bulk-from`` steps and above MLflow's
  ingest is not run (about 2 hours at 10,000,000 steps): its one read metric is loaded by
  SQL and the ingest cell says so, and MLflow's reads there are one cold and one warm
  (each takes about 5 minutes).
- **cold read**, ms, median of ``--cold``: ckptlab's first ``GET /series?max_points=2000``
  of a fresh ``ckptlab serve`` over HTTP (:func:`bench_series.bench_cold`); MLflow's first
  ``get_metric_history`` of a fresh process on its store (no server: MLflow's own client on
  the database, which favours MLflow).
- **warm read**, ms, median of ``--warm``: the same request repeated in one process.

The ratios are ckptlab over MLflow for ingest, MLflow over ckptlab for reads (how many times
faster ckptlab is), from numbers of the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import bench_series  # noqa: E402
import bench_worker  # noqa: E402

from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)


def ckptlab_side(steps: int, *, cold: int, warm: int) -> dict[str, Any]:
    """ckptlab at one size: ``ingest_steps_per_s``, ``cold_ms`` and ``warm_ms`` (medians)."""
    tmp = Path(tempfile.mkdtemp(prefix="ckptlab-vs-mlflow-"))
    try:
        ingest = bench_worker.bench_writes(f"sqlite:///{tmp / 'writes.db'}", steps)["rows_per_s"]
        url = f"sqlite:///{tmp / 'reads.db'}"
        engine = make_engine(url)
        migrate(engine)
        exp_id = bench_series.insert_run(make_sessionmaker(engine), steps, rollup=True, seed=0)
        engine.dispose()
        runs = {"run": (exp_id, steps)}
        cold_ms = bench_series.bench_cold(url, runs, cold)["run"]["first"]["median"]
        warm_ms = bench_series.bench_warm(url, runs, warm)["run"]["median"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"ingest_steps_per_s": ingest, "cold_ms": cold_ms, "warm_ms": warm_ms}


def mlflow_side(python: str, steps: int, *, cold: int, warm: int, bulk_from: int) -> dict[str, Any]:
    """MLflow at one size, through ``bench/bench_mlflow.py`` in ``python``: the same keys
    as :func:`ckptlab_side` (``ingest_steps_per_s`` None when the run was loaded by SQL).

    Raises:
        subprocess.CalledProcessError: the MLflow side failed (its stderr is in the error).
    """
    done = subprocess.run(
        [python, str(HERE / "bench_mlflow.py"), "--steps", str(steps), "--cold", str(cold), "--warm", str(warm)]
        + ["--bulk-from", str(bulk_from)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])[str(steps)]
    return {
        "ingest_steps_per_s": result["ingest_steps_per_s"],
        "cold_ms": statistics.median(result["cold_ms"]),
        "warm_ms": statistics.median(result["warm_ms"]),
    }


def compare(
    sizes: tuple[int, ...] | list[int],
    *,
    mlflow_python: str | None,
    cold: int = 3,
    warm: int = 3,
    bulk_from: int = 10_000_000,
) -> list[dict[str, Any]]:
    """Both sides at every size, size by size (ckptlab, then MLflow); ``mlflow`` is None
    without ``mlflow_python``. Returns one dict per size: ``steps``, ``ckptlab``, ``mlflow``."""
    rows = []
    for steps in sizes:
        ours = ckptlab_side(steps, cold=cold, warm=warm)
        # one read each past bulk_from: MLflow's read of 10^7 steps takes about 5 minutes
        n = 1 if steps >= bulk_from else None
        theirs = (
            mlflow_side(mlflow_python, steps, cold=n or cold, warm=n or warm, bulk_from=bulk_from)
            if mlflow_python
            else None
        )
        rows.append({"steps": steps, "ckptlab": ours, "mlflow": theirs})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a / b:,.0f}x"


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    out = [
        "| steps | ingest, ckptlab (steps/s) | MLflow | ckptlab / MLflow | cold read, ckptlab | MLflow | "
        "MLflow / ckptlab | warm read, ckptlab | MLflow | MLflow / ckptlab |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        c, m = row["ckptlab"], row["mlflow"] or {}
        if not m:
            ingest = "not run (no --mlflow-python)"
        elif m["ingest_steps_per_s"] is None:
            ingest = "not run (loaded by SQL)"
        else:
            ingest = f"{m['ingest_steps_per_s']:,.0f}"
        m_cold = f"{m['cold_ms']:,.0f} ms" if m else "—"
        m_warm = f"{m['warm_ms']:,.0f} ms" if m else "—"
        out.append(
            f"| {row['steps']:,} | {c['ingest_steps_per_s']:,.0f} | {ingest} | "
            f"{_ratio(c['ingest_steps_per_s'], m.get('ingest_steps_per_s'))} | "
            f"{c['cold_ms']:,.0f} ms | {m_cold} | {_ratio(m.get('cold_ms'), c['cold_ms'])} | "
            f"{c['warm_ms']:,.1f} ms | {m_warm} | {_ratio(m.get('warm_ms'), c['warm_ms'])} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mlflow-python", help="a Python with mlflow==3.17.2 (without: ckptlab's side only)")
    ap.add_argument("--steps", default=",".join(map(str, SIZES)))
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--bulk-from", type=int, default=10_000_000)
    args = ap.parse_args()
    sizes = [int(s) for s in args.steps.split(",")]
    rows = compare(sizes, mlflow_python=args.mlflow_python, cold=args.cold, warm=args.warm, bulk_from=args.bulk_from)
    print(table(rows))


if __name__ == "__main__":
    main()
