"""Worker benchmarks: warm start (claim to first step) and batched step-write throughput.

Run from the repository root::

    .venv/bin/python bench/bench_worker.py [--experiments 10] [--rows 20000]

- **Warm start.** Starts a real ``ckptlab worker`` on a fresh SQLite database, runs one
  warm-up experiment, then submits tiny CPU experiments one at a time and reads
  ``summary["claim_to_first_step_s"]`` (recorded by the worker: wall time from the claim to
  the end of the first step) and the submit-to-first-step-visible latency (what the live
  view waits for: polling, claim, first step, batched write).
- **Write throughput.** Pushes ``--rows`` step records through
  :class:`worker.writer.StepWriter` as fast as possible and times until all are
  committed, into SQLite and into PostgreSQL (a throwaway cluster from Debian's binaries,
  or ``--postgres-url``); also the cost of one ``put`` on the training loop.

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptlab.db import store  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.spec import ExperimentSpec  # noqa: E402
from tests.support import wait_for  # noqa: E402
from worker.writer import StepWriter  # noqa: E402

SPEC = ExperimentSpec.model_validate(
    {
        "model": {"kind": "mlp", "depth": 8, "width": 64},
        "batch_size": 16,
        "steps": 3,
        "device": "cpu",
        "verify_gradients": False,
    }
)


def bench_warm_start(n: int, workdir: Path) -> dict[str, float]:
    """Median and max claim-to-first-step and submit-to-visible-step latency (s) over ``n``."""
    url = f"sqlite:///{workdir / 'warm.db'}"
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    env = {
        **os.environ,
        "CKPTLAB_DATABASE_URL": url,
        "CKPTLAB_DATA_DIR": str(workdir),
        "CKPTLAB_POLL_INTERVAL_S": "0.1",
    }
    log = open(workdir / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "cli", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    claim_to_step: list[float] = []
    submit_to_visible: list[float] = []
    try:
        for i in range(n + 1):  # the first is the warm-up: the worker starts its forkserver
            with Session() as s:
                exp_id = store.create_experiment(s, spec=SPEC).id
            t0 = time.monotonic()

            def first_step(exp_id=exp_id):
                with Session() as s:
                    return store.list_steps(s, experiment_id=exp_id, attempt=1)

            wait_for(first_step, timeout=120, interval=0.005)
            visible = time.monotonic() - t0

            def finished(exp_id=exp_id):
                with Session() as s:
                    exp = store.get_experiment(s, experiment_id=exp_id)
                    return exp if exp.status not in (Status.QUEUED, Status.RUNNING) else None

            exp = wait_for(finished, timeout=120, interval=0.005)
            if exp.status != Status.SUCCEEDED:
                raise RuntimeError(f"experiment {exp_id} ended {exp.status}: {exp.error}")
            if i:
                claim_to_step.append(exp.summary["claim_to_first_step_s"])
                submit_to_visible.append(visible)
            time.sleep(0.5)  # let the next child warm up, as between a sweep's experiments
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
        engine.dispose()
    return {
        "claim_to_first_step_median_s": statistics.median(claim_to_step),
        "claim_to_first_step_max_s": max(claim_to_step),
        "submit_to_visible_median_s": statistics.median(submit_to_visible),
        "submit_to_visible_max_s": max(submit_to_visible),
    }


def _record(step: int) -> dict:
    return {
        "step": step,
        "forward_ms": 1.25,
        "backward_ms": 2.5,
        "optimizer_ms": 0.75,
        "step_ms": 4.5,
        "allocated_bytes": 123_456_789,
        "peak_allocated_bytes": 234_567_890,
        "reserved_bytes": None,
        "loss": 0.5,
        "extra": {"recompute_bytes": 1024},
    }


def bench_writes(url: str, rows: int) -> dict[str, float]:
    """Rows per second through the batch writer into ``url``, and µs per ``put``."""
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as s:
        exp = store.create_experiment(s, spec=SPEC, status=Status.RUNNING)
    records = [_record(i) for i in range(1, rows + 1)]
    writer = StepWriter(Session, experiment_id=exp.id, attempt=1).start()
    t0 = time.perf_counter()
    for rec in records:
        writer.put(rec)
    put_s = time.perf_counter() - t0
    writer.close()
    total_s = time.perf_counter() - t0
    with Session() as s:
        stored = len(store.list_steps(s, experiment_id=exp.id, attempt=1))
    engine.dispose()
    if stored != rows:
        raise RuntimeError(f"{stored} of {rows} rows stored")
    return {"rows_per_s": rows / total_s, "put_us": put_s / rows * 1e6}


def main() -> None:
    """Run both benchmarks and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10, help="warm-start samples (default 10)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per write benchmark (default 20000)")
    parser.add_argument("--postgres-url", help="PostgreSQL database to write into (default: a throwaway cluster)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ckptlab-bench-") as tmp:
        workdir = Path(tmp)
        warm = bench_warm_start(args.experiments, workdir)
        sqlite = bench_writes(f"sqlite:///{workdir / 'writes.db'}", args.rows)
        cluster = None
        pg_url = args.postgres_url
        if pg_url is None:
            from tests.postgres import PostgresCluster, find_pg_bin

            pg_bin = find_pg_bin()
            if pg_bin is not None:
                cluster = PostgresCluster(pg_bin)
                pg_url = cluster.create_database()
        try:
            pg = bench_writes(pg_url, args.rows) if pg_url else None
        finally:
            if cluster is not None:
                cluster.stop()

    print(f"machine: {os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}")
    print("| measure | value |\n| --- | --- |")
    print(
        f"| claim → first step, warm worker (median / max of {args.experiments}) | "
        f"{warm['claim_to_first_step_median_s']:.3f} s / {warm['claim_to_first_step_max_s']:.3f} s |"
    )
    print(
        f"| submit → first step committed (median / max) | "
        f"{warm['submit_to_visible_median_s']:.3f} s / {warm['submit_to_visible_max_s']:.3f} s |"
    )
    print(f"| SQLite: rows/s through StepWriter ({args.rows} rows) | {sqlite['rows_per_s']:,.0f} |")
    if pg:
        print(f"| PostgreSQL: rows/s through StepWriter ({args.rows} rows) | {pg['rows_per_s']:,.0f} |")
    print(f"| `StepWriter.put` on the training loop (SQLite run) | {sqlite['put_us']:.1f} µs |")


if __name__ == "__main__":
    main()
