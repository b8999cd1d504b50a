"""MLflow's side of the ckptlab/MLflow comparison (issue 24): ingest and metric-history reads
of one run's per-step metrics, in MLflow's own SQLite tracking store.

Run with a Python that has MLflow (a benchmark-only install, never a ckptlab dependency)::

    python3 -m venv /tmp/mlvenv && /tmp/mlvenv/bin/pip install mlflow==3.17.2
    /tmp/mlvenv/bin/python bench/bench_mlflow.py --steps 10000,100000 [--cold 3] [--warm 5]

For each size: a fresh ``sqlite:///`` tracking store, one run, the 7 step metrics ckptlab
stores per step (``SERIES``) logged with ``MlflowClient.log_batch`` (1,000 metrics per call,
MLflow's limit); **ingest** is steps per second over the whole load. **Cold**: a fresh
process per sample opens the store and times its first ``get_metric_history(run,
"step_ms")`` (the import and the client's start excluded); **warm**: the same call repeated
in one process. Prints JSON: ``{steps: {"ingest_steps_per_s", "cold_ms": [...],
"warm_ms": [...]}}``.
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
    ap.add_argument("--read", nargs=2, metavar=("URI", "RUN"), help=argparse.SUPPRESS)  # a cold sample's child
    args = ap.parse_args()
    if args.read:
        print(read_once(*args.read))
        return
    out: dict[int, dict] = {}
    for steps in (int(s) for s in args.steps.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
            run, rate = ingest(uri, steps)
            cold = [
                float(
                    subprocess.run(
                        [sys.executable, __file__, "--read", uri, run], capture_output=True, text=True, check=True
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                for _ in range(args.cold)
            ]
            warm = [read_once(uri, run) for _ in range(args.warm)]
        out[steps] = {"ingest_steps_per_s": rate, "cold_ms": cold, "warm_ms": warm}
        print(json.dumps({steps: out[steps]}), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
