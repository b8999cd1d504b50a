"""Sweep throughput: experiments per minute with 1, 2 and 4 workers on one SQLite database,
or with one worker and 1, 2 ... CPU slots.

Queues ``--experiments`` tiny MLP experiments (CPU, no gradient check), starts N
``ckptlab worker --once`` processes (each exits when the queue is empty) and times from
their start until every experiment has finished. Worker start-up (importing torch, the
pre-started child) is included, as it is for a user who starts workers for a sweep.
``--cpu-slots 1,2`` instead starts one worker with ``--cpu-slots N`` per run (each slot's
child then runs ``cpu_count // N`` torch threads). ``--repeats R`` runs R interleaved
rounds (every configuration once per round) and reports each configuration's median.

Usage: python bench/bench_sweep.py [--experiments 24] [--workers 1,2,4 | --cpu-slots 1,2]
[--repeats 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402

from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.db.models import Experiment  # noqa: E402
from ckptlab.db.store import create_experiment  # noqa: E402
from ckptlab.domain import FINISHED_STATUSES, Status  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402

TINY = {
    "model": {"kind": "mlp", "depth": 8, "width": 128},
    "batch_size": 32,
    "steps": 5,
    "device": "cpu",
    "verify_gradients": False,
    "checkpoint": {"strategy": "sequential", "segments": 4},
}


def run(workers: int, experiments: int, cpu_slots: int | None = None) -> dict:
    """Time ``experiments`` tiny runs through ``workers`` worker processes (each with
    ``--cpu-slots cpu_slots`` when given); returns the row."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        engine = make_engine(url)
        migrate(engine)
        Session = make_sessionmaker(engine)
        with Session() as s:
            for i in range(experiments):
                create_experiment(s, spec=ExperimentSpec.model_validate({**TINY, "seed": i}))
        env = {**os.environ, "CKPTLAB_DATABASE_URL": url, "CKPTLAB_POLL_INTERVAL_S": "0.1"}
        slots = [] if cpu_slots is None else ["--devices", "cpu", "--cpu-slots", str(cpu_slots)]
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "ckptlab.cli", "worker", "--once", *slots],
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
            ok = s.scalar(select(func.count()).select_from(Experiment).where(Experiment.status == Status.SUCCEEDED))
        engine.dispose()
    return {
        "workers": workers,
        "cpu_slots": cpu_slots,
        "experiments": experiments,
        "finished": done,
        "succeeded_count": ok,
        "seconds": round(elapsed, 2),
        "per_minute": round(60 * done / elapsed, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=24)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    ap.add_argument("--cpu-slots", default=None, help="comma-separated CPU slot counts of one worker")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved rounds; the median is reported")
    ap.add_argument("--json", action="store_true", help="JSON lines instead of text")
    args = ap.parse_args()
    if args.cpu_slots:
        configs = [(1, int(n)) for n in args.cpu_slots.split(",")]
    else:
        configs = [(int(w), None) for w in args.workers.split(",")]
    runs: dict[tuple[int, int | None], list[dict]] = {c: [] for c in configs}
    for _round in range(args.repeats):
        for workers, slots in configs:
            row = run(workers, args.experiments, slots)
            runs[(workers, slots)].append(row)
            if args.repeats > 1 and not args.json:
                print(f"  round {_round + 1}: {_label(workers, slots)} {row['seconds']} s", flush=True)
    for (workers, slots), rows in runs.items():
        row = {**rows[0], "seconds": statistics.median(r["seconds"] for r in rows)}
        row["per_minute"] = round(60 * row["finished"] / row["seconds"], 1)
        row["all_seconds"] = [r["seconds"] for r in rows]
        print(
            json.dumps(row)
            if args.json
            else f"{_label(workers, slots)}: {row['finished']}/{row['experiments']} finished in {row['seconds']} s "
            f"(median of {len(rows)}) = {row['per_minute']} experiments/min",
            flush=True,
        )


def _label(workers: int, slots: int | None) -> str:
    return f"{workers} worker(s)" if slots is None else f"1 worker, {slots} cpu slot(s)"


if __name__ == "__main__":
    main()
