"""Sweep throughput: experiments per minute with 1, 2 and 4 workers on one SQLite database.

Queues ``--experiments`` tiny MLP experiments (CPU, no gradient check), starts N
``ckptlab worker --once`` processes (each exits when the queue is empty) and times from
their start until every experiment has finished. Worker start-up (importing torch, the
pre-started child) is included, as it is for a user who starts workers for a sweep.

Usage: python bench/bench_sweep.py [--experiments 24] [--workers 1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402

from ckptlab.db.engine import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.db.models import FINISHED_STATUSES, Experiment  # noqa: E402
from ckptlab.db.store import create_experiment  # noqa: E402
from ckptlab.spec import ExperimentSpec  # noqa: E402

TINY = {
    "model": {"kind": "mlp", "depth": 8, "width": 128},
    "batch_size": 32,
    "steps": 5,
    "device": "cpu",
    "verify_gradients": False,
    "checkpoint": {"strategy": "sequential", "segments": 4},
}


def run(workers: int, experiments: int) -> dict:
    """Time ``experiments`` tiny runs through ``workers`` worker processes; returns the row."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        engine = make_engine(url)
        migrate(engine)
        Session = make_sessionmaker(engine)
        with Session() as s:
            for i in range(experiments):
                create_experiment(s, spec=ExperimentSpec.model_validate({**TINY, "seed": i}))
        env = {**os.environ, "CKPTLAB_DATABASE_URL": url, "CKPTLAB_POLL_INTERVAL_S": "0.1"}
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "ckptlab", "worker", "--once"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(workers)
        ]
        for p in procs:
            p.wait(timeout=600)
        elapsed = time.perf_counter() - t0
        with Session() as s:
            done = s.scalar(
                select(func.count()).select_from(Experiment).where(Experiment.status.in_(FINISHED_STATUSES))
            )
            ok = s.scalar(select(func.count()).select_from(Experiment).where(Experiment.status == "succeeded"))
        engine.dispose()
    return {
        "workers": workers,
        "experiments": experiments,
        "finished": done,
        "succeeded": ok,
        "seconds": round(elapsed, 2),
        "per_minute": round(60 * done / elapsed, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=24)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    ap.add_argument("--json", action="store_true", help="JSON lines instead of text")
    args = ap.parse_args()
    for n in (int(w) for w in args.workers.split(",")):
        row = run(n, args.experiments)
        print(
            json.dumps(row)
            if args.json
            else f"{n} worker(s): {row['finished']}/{row['experiments']} finished in {row['seconds']} s "
            f"= {row['per_minute']} experiments/min",
            flush=True,
        )


if __name__ == "__main__":
    main()
