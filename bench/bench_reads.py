"""Benchmark: heavy reads stay cheap (issue 33).

1. **Comparisons**: ``ckptlab serve`` on a fresh SQLite database holding one finished
   ``sequential`` run of ``--steps`` (default 20,000) paired timed steps (its CPU-time rounds
   and its paired copy's, stored as a worker stores them, ``paired_overhead`` included) and
   its ``none`` baseline. ``--clients`` (default 6) threads ask
   ``GET /api/experiments/{id}/comparison`` ``--rounds`` times each, all at once, while
   another asks ``GET /api/health`` every 20 ms. Reported: comparison and health latency
   p50 / p90 / max (ms). Targets: comparison p90 <= 200 ms, health p90 <= 50 ms.
2. **Finishing a long run**: the statistics a worker computes when a run of ``--long-steps``
   (default 90,000) timed steps finishes (the median, quartiles and bootstrap interval of
   each phase, and the paired overhead), timed in this process (CPU and wall seconds).
   Target: <= 10 s.

Usage::

    .venv/bin/python bench/bench_reads.py [--steps 20000] [--clients 6] [--rounds 20] [--long-steps 90000]

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import _free_port, start_server  # noqa: E402

from ckptlab.analysis.stats import describe, stored_paired_overhead  # noqa: E402
from ckptlab.db import queue, store  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.summary import RunSummary  # noqa: E402


def _paired_summary(n: int, rng: random.Random) -> RunSummary:
    """A finished paired run of ``n`` timed steps, about 30% slower than its copy."""
    copy = [10 + rng.random() for _ in range(n)]
    run = [1.3 * t * (1 + 0.05 * rng.random()) for t in copy]
    summary = RunSummary(
        step_times_ms=run,
        step_cpu_ms=run,
        step_time_ms=float(np.median(run)),
        paired_with="none",
        paired_baseline_step_times_ms=copy,
        paired_baseline_cpu_ms=copy,
        device="cpu",
    )
    summary.paired_overhead = stored_paired_overhead(summary)
    return summary


def _store(Session, n: int) -> int:
    """The run and its baseline, finished; returns the run's id."""
    rng = random.Random(1)
    ids = []
    for strategy in ("none", "sequential"):
        spec = ExperimentSpec.model_validate({"device": "cpu", "checkpoint": {"strategy": strategy}})
        with Session() as s:
            exp = store.create_experiment(s, spec=spec, status=Status.RUNNING, worker_id="bench:1")
            queue.finish_experiment(s, experiment_id=exp.id, status=Status.SUCCEEDED, summary=_paired_summary(n, rng))
            ids.append(exp.id)
    return ids[1]


def _stats(values: list[float]) -> str:
    a = np.asarray(values)
    return f"{np.percentile(a, 50):.1f} | {np.percentile(a, 90):.1f} | {a.max():.1f}"


def bench_comparisons(n: int, clients: int, rounds: int) -> tuple[list[float], list[float]]:
    folder = tempfile.mkdtemp(prefix="ckptlab-bench-reads-")
    url = f"sqlite:///{folder}/bench.db"
    engine = make_engine(url)
    migrate(engine)
    run_id = _store(make_sessionmaker(engine), n)
    port = _free_port()
    server = start_server(url, port)
    base = f"http://127.0.0.1:{port}"
    comparisons: list[float] = []
    health: list[float] = []
    done = threading.Event()

    def ask() -> None:
        with httpx.Client(timeout=120) as c:
            for _ in range(rounds):
                t0 = time.perf_counter()
                assert c.get(f"{base}/api/experiments/{run_id}/comparison").status_code == 200
                comparisons.append(1000 * (time.perf_counter() - t0))

    def beat() -> None:
        with httpx.Client(timeout=60) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                c.get(f"{base}/api/health")
                health.append(1000 * (time.perf_counter() - t0))
                time.sleep(0.02)

    try:
        threads = [threading.Thread(target=ask) for _ in range(clients)]
        watcher = threading.Thread(target=beat)
        watcher.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
    finally:
        server.kill()
        server.wait()
        engine.dispose()
        shutil.rmtree(folder, ignore_errors=True)
    return comparisons, health


def bench_finishing(n: int) -> tuple[float, float]:
    """CPU and wall seconds of a finishing worker's statistics for ``n`` timed steps."""
    summary = _paired_summary(n, random.Random(2))
    phases = [summary.step_times_ms, [t / 3 for t in summary.step_times_ms], [t / 2 for t in summary.step_times_ms]]
    phases.append([t / 6 for t in summary.step_times_ms])
    cpu, wall = time.process_time(), time.perf_counter()
    for values in phases:
        describe(values)
    stored_paired_overhead(summary.model_copy(update={"paired_overhead": None}))
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--long-steps", type=int, default=90_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n")
    comparisons, health = bench_comparisons(args.steps, args.clients, args.rounds)
    print(f"{args.clients} clients x {args.rounds} comparisons of a {args.steps:,}-step paired run\n")
    print("| read | n | p50 ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|")
    print(f"| comparison | {len(comparisons)} | {_stats(comparisons)} |")
    print(f"| health (every 20 ms meanwhile) | {len(health)} | {_stats(health)} |\n")
    cpu, wall = bench_finishing(args.long_steps)
    print(f"finishing statistics of a {args.long_steps:,}-step run: {cpu:.2f} s CPU, {wall:.2f} s wall")


if __name__ == "__main__":
    main()
