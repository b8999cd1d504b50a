"""Run-to-run noise of the step time: the same work, timed in separate runs through a real
worker, and what ckptlab's overhead rule says about it.

Queues ``--runs`` experiments alternating strategy ``none`` and ``sequential`` with
``segments: 1`` (which checkpoints nothing: the same work) of one model, runs them through
one ``ckptlab worker --once`` (each run in its own child process, as in production), and
compares every ``segments: 1`` run with every ``none`` run using
:func:`ckptlab.analysis.stats.ratio_ci`. Every true difference is 0, so every estimate is noise:
the report gives the spread of the run medians, the distribution of |estimate|, and the
share of pairs the product would call a measurable difference
(:attr:`ckptlab.analysis.stats.RatioInterval.measurable`), against which
:data:`ckptlab.analysis.stats.NOISE_THRESHOLD_PCT` is chosen.

Usage: python bench/bench_noise.py [--runs 12] [--width 128,512] [--timed-steps 30] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import select  # noqa: E402

from ckptlab.analysis.stats import NOISE_THRESHOLD_PCT, ratio_ci  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.db.models import Experiment  # noqa: E402
from ckptlab.db.store import create_experiment  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402


def _spec(width: int, timed_steps: int, strategy: dict) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "model": {"kind": "mlp", "depth": 8, "width": width},
            "batch_size": 64,
            "steps": 3,
            "timed_steps": timed_steps,
            "device": "cpu",
            "verify_gradients": False,
            "checkpoint": strategy,
        }
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(width: int, runs: int, timed_steps: int) -> dict:
    """Time ``runs`` alternating none / segments-1 experiments of an MLP 8 x ``width``."""
    specs = {
        "none": _spec(width, timed_steps, {"strategy": "none"}),
        "same": _spec(width, timed_steps, {"strategy": "sequential", "segments": 1}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        engine = make_engine(url)
        migrate(engine)
        Session = make_sessionmaker(engine)
        with Session() as s:
            for i in range(runs):
                create_experiment(s, spec=specs["none" if i % 2 == 0 else "same"])
        env = {**os.environ, "CKPTLAB_DATABASE_URL": url, "CKPTLAB_POLL_INTERVAL_S": "0.1"}
        subprocess.run(
            [sys.executable, "-m", "ckptlab.cli", "worker", "--once", "--devices", "cpu"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=1800,
            check=True,
        )
        with Session() as s:
            rows = s.scalars(select(Experiment).order_by(Experiment.id)).all()
            done = [e for e in rows if e.status == Status.SUCCEEDED and e.summary]
            times = {e.id: (e.strategy, e.summary["step_times_ms"]) for e in done}
        engine.dispose()
    base = [t for strategy, t in times.values() if strategy == "none"]
    same = [t for strategy, t in times.values() if strategy != "none"]
    medians = [statistics.median(t) for t in base + same]
    intervals = [ratio_ci(b, s) for b, s in itertools.product(base, same)]
    estimates = [abs(i.estimate_pct) for i in intervals]
    excluding_zero = sum(i.low_pct > 0 or i.high_pct < 0 for i in intervals)
    return {
        "width": width,
        "runs": len(times),
        "timed_steps": timed_steps,
        "median_step_ms": round(statistics.median(medians), 3),
        "run_median_cv_pct": round(100 * statistics.pstdev(medians) / statistics.mean(medians), 2),
        "pairs": len(intervals),
        "abs_estimate_pct": {
            "median": round(statistics.median(estimates), 2),
            "p95": round(_pct(estimates, 0.95), 2),
            "max": round(max(estimates), 2),
        },
        "ci_excludes_zero_pct": round(100 * excluding_zero / len(intervals), 1),
        "measurable_pct": round(100 * sum(i.measurable for i in intervals) / len(intervals), 1),
        "noise_threshold_pct": NOISE_THRESHOLD_PCT,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12, help="experiments per model, alternating none / segments 1")
    ap.add_argument("--width", default="128,512", help="comma-separated MLP widths (depth 8, batch 64)")
    ap.add_argument("--timed-steps", type=int, default=30)
    ap.add_argument("--json", action="store_true", help="JSON lines instead of text")
    args = ap.parse_args()
    for width in (int(w) for w in args.width.split(",")):
        row = run(width, args.runs, args.timed_steps)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            e = row["abs_estimate_pct"]
            print(
                f"MLP 8x{width}: {row['runs']} runs, step {row['median_step_ms']} ms, run medians CV "
                f"{row['run_median_cv_pct']}%; {row['pairs']} none/segments-1 pairs: |estimate| median "
                f"{e['median']}%, p95 {e['p95']}%, max {e['max']}%; CI excludes 0 in "
                f"{row['ci_excludes_zero_pct']}%, measurable (threshold {row['noise_threshold_pct']}%) in "
                f"{row['measurable_pct']}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
