"""MLflow's side of the ckptlab/MLflow comparison (issue 24): ingest and metric-history reads
of one run's per-step metrics, in MLflow's own SQLite tracking store.

Run with a Python that has MLflow (a benchmark-only install, never a ckptlab dependency)::

    make bench-mlflow    # .bench-mlflow/, a venv with mlflow==3.17.2
    .bench-mlflow/bin/python bench/bench_mlflow.py --steps 10000,100000 [--cold 3] [--warm 5]

For each size: a fresh ``sqlite:///`` tracking store, one run, the 7 step metrics ckptlab
stores per step (``SERIES``) logged with ``MlflowClient.log_batch`` (1,000 metrics per call,
MLflow's limit); **ingest** is steps per second over the whole load. **Cold**: a fresh
process per sample opens the store and times its first ``get_metric_history(run,
"step_ms")`` (the import and the client's start excluded); **warm**: the same call repeated
in one process. Prints JSON: ``{steps: {"ingest_steps_per_s", "cold_ms": [...],
"warm_ms": [...], "peak_rss_bytes"}}`` (the read's resident set, from a cold sample).

``--bulk-from N``: a size of at least N steps is not logged through MLflow (10,000,000
steps would take about two hours at MLflow's 1,300 steps/s) but loaded into its tables by
plain SQL, the one metric that is read only (``step_ms``, rows as ``log_batch`` writes
them); its ingest is then ``null``. The read goes through MLflow as for every size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERIES = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms", "allocated_bytes", "peak_allocated_bytes", "loss")
BATCH = 1000  # MLflow's limit of metrics per log_batch call


def ingest(uri: str, steps: int) -> tuple[str, float]:
    """Log ``steps`` steps of :data:`SERIES` to a new run; returns (run id, steps/s)."""
    import random

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("bench")).info.run_id
    rng = random.Random(0)
    pending: list = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        ts = 1_700_000_000_000 + step
        pending.extend(Metric(k, rng.random(), ts, step) for k in SERIES)
        if len(pending) >= BATCH - len(SERIES):
            client.log_batch(run, metrics=pending)
            pending = []
    if pending:
        client.log_batch(run, metrics=pending)
    return run, steps / (time.perf_counter() - t0)


def bulk_load(uri: str, steps: int) -> str:
    """A run whose ``step_ms`` history has ``steps`` steps, written into MLflow's SQLite
    tables by ``executemany`` (``metrics`` rows as ``log_batch`` stores them, and the
    ``latest_metrics`` row); returns the run id. The run and its experiment are made by
    MLflow, so the schema is MLflow's own."""
    import random
    import sqlite3

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("bench")).info.run_id
    rng = random.Random(0)
    con = sqlite3.connect(uri.removeprefix("sqlite:///"))
    try:
        chunk = 500_000
        for start in range(1, steps + 1, chunk):
            rows = [
                ("step_ms", rng.random(), 1_700_000_000_000 + step, run, step, 0)
                for step in range(start, min(start + chunk, steps + 1))
            ]
            con.executemany(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)", rows
            )
            con.commit()
        con.execute(
            "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
            ("step_ms", rows[-1][1], rows[-1][2], steps, 0, run),
        )
        con.commit()
    finally:
        con.close()
    return run


def read_once(uri: str, run: str) -> float:
    """One ``get_metric_history`` of ``step_ms`` in this process, ms."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    t0 = time.perf_counter()
    history = client.get_metric_history(run, "step_ms")
    ms = (time.perf_counter() - t0) * 1e3
    assert history, "no history"
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="10000,100000")
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--bulk-from", type=int, default=None, help="load sizes of at least this many steps by SQL")
    ap.add_argument("--read", nargs=2, metavar=("URI", "RUN"), help=argparse.SUPPRESS)  # a cold sample's child
    args = ap.parse_args()
    if args.read:
        import resource

        ms = read_once(*args.read)
        print(json.dumps({"ms": ms, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        return
    out: dict[int, dict] = {}
    for steps in (int(s) for s in args.steps.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
            if args.bulk_from is not None and steps >= args.bulk_from:
                run, rate = bulk_load(uri, steps), None
            else:
                run, rate = ingest(uri, steps)
            cold = [
                json.loads(
                    subprocess.run(
                        [sys.executable, __file__, "--read", uri, run], capture_output=True, text=True, check=True
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                for _ in range(args.cold)
            ]
            warm = [read_once(uri, run) for _ in range(args.warm)]
        out[steps] = {
            "ingest_steps_per_s": rate,
            "cold_ms": [c["ms"] for c in cold],
            "warm_ms": warm,
            "peak_rss_bytes": max(c["peak_rss_bytes"] for c in cold) if cold else None,
        }
        print(json.dumps({steps: out[steps]}), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
