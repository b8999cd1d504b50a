"""Worker benchmarks: warm start (claim to first step) and batched step-write throughput.

Run from the repository root::

    .venv/bin/python bench/bench_worker.py [--experiments 10] [--rows 20000]
    .venv/bin/python bench/bench_worker.py --rollup-cost ROUNDS [--rows 50000]

- **Warm start.** Starts a real ``ckptlab worker`` on a fresh SQLite database, runs one
  warm-up experiment, then submits tiny CPU experiments one at a time and reads
  ``summary["claim_to_first_step_s"]`` (recorded by the worker: wall time from the claim to
  the end of the first step) and the submit-to-first-step-visible latency (what the live
  view waits for: polling, claim, first step, batched write).
- **Write throughput.** Pushes ``--rows`` step records through
  :class:`ckptlab.worker.service.writer.StepWriter` as fast as possible and times until all are
  committed, into SQLite and into PostgreSQL (a throwaway cluster from Debian's binaries,
  or ``--postgres-url``); also the cost of one ``put`` on the training loop.
- **Rollup cost** (``--rollup-cost ROUNDS``, nothing else runs): the write benchmark with
  the steps' rollup and with ``add_steps(rollup=False)``, alternating (:func:`bench_rollup_cost`);
  batches of 4,096 steps with and without it, interleaved (:func:`bench_batch_cost`); and
  the share of the writer's time spent in the rollup's own code (:func:`bench_rollup_share`).

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from ckptlab.db import rollups, store  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.db.models import Step  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.service import writer as writer_module  # noqa: E402
from ckptlab.worker.service.writer import StepWriter  # noqa: E402
from tests.support import wait_for  # noqa: E402

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
    worker = subprocess.Popen(
        [sys.executable, "-m", "ckptlab.cli", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
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


def bench_writes(url: str, rows: int, *, rollup: bool = True) -> dict[str, float]:
    """Rows per second through the batch writer into ``url``, and µs per ``put``.

    Records are built before the clock starts, a million at a time; past a million the next
    million is built while the writer works, and ``put`` waits while a million records are
    pending (a training loop is slower than the writer; an unbounded buffer of 10,000,000
    records would take about 10 GB), so the writer never runs dry and the rate is its own.

    Args:
        rollup: write the steps' rollup with them, as the product does (default). False:
            the writer calls :func:`ckptlab.db.store.add_steps` with ``rollup=False`` (the
            steps alone, as before the rollup), to price it.
    """
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as s:
        exp = store.create_experiment(s, spec=SPEC, status=Status.RUNNING)
    chunk = 1_000_000
    records = [_record(i) for i in range(1, min(rows, chunk) + 1)]
    no_rollup = mock.patch.object(writer_module, "add_steps", functools.partial(store.add_steps, rollup=False))
    with contextlib.nullcontext() if rollup else no_rollup:
        writer = StepWriter(Session, experiment_id=exp.id, attempt=1).start()
        t0, cpu0 = time.perf_counter(), time.process_time()
        for start in range(1, rows + 1, chunk):
            if start > 1:
                records = [_record(i) for i in range(start, min(rows, start + chunk - 1) + 1)]
                while writer.pending > chunk:
                    time.sleep(0.05)
            for rec in records:
                writer.put(rec)
        put_s = time.perf_counter() - t0
        writer.close(timeout_s=max(120.0, rows / 5_000))
        total_s = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
    with Session() as s:
        stored = s.scalar(select(func.count()).select_from(Step).where(Step.experiment_id == exp.id))
        rolled = rollups.coverage(s, experiment_id=exp.id, attempt=1)
    engine.dispose()
    if stored != rows:
        raise RuntimeError(f"{stored} of {rows} rows stored")
    if rollup and (rolled is None or rolled[2] != rows):
        raise RuntimeError(f"the rollup holds {rolled} instead of {rows} rows")
    return {"rows_per_s": rows / total_s, "rows_per_cpu_s": rows / cpu_s, "put_us": put_s / rows * 1e6}


def bench_rollup_cost(url_for: Callable[[str], str], rows: int, rounds: int) -> dict[str, Any]:
    """Step-write throughput with and without the rollup, alternating for ``rounds`` rounds
    (a fresh database from ``url_for(name)`` each run), so load on a shared machine falls
    on both alike.

    Returns:
        ``with`` and ``without``: rows/s (wall clock) of each round; ``cost_pct``: the
        median over rounds of ``1 - with / without`` in percent (positive: the rollup slows
        the writes) and ``range_pct`` its smallest and largest round; ``cpu_cost_pct`` and
        ``cpu_range_pct``: the same for rows per CPU second of this process (the writer's
        work, less sensitive to other processes on the machine; on PostgreSQL the server's
        share is not in it).
    """
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(rounds):
        for rollup in (True, False) if i % 2 == 0 else (False, True):
            runs[rollup].append(bench_writes(url_for(f"r{i}-{int(rollup)}"), rows, rollup=rollup))

    def costs(key: str) -> list[float]:
        return [100 * (1 - w[key] / wo[key]) for w, wo in zip(runs[True], runs[False], strict=True)]

    wall, cpu = costs("rows_per_s"), costs("rows_per_cpu_s")
    return {
        "with": [r["rows_per_s"] for r in runs[True]],
        "without": [r["rows_per_s"] for r in runs[False]],
        "cost_pct": statistics.median(wall),
        "range_pct": (min(wall), max(wall)),
        "cpu_cost_pct": statistics.median(cpu),
        "cpu_range_pct": (min(cpu), max(cpu)),
    }


def bench_batch_cost(url: str, *, batches: int = 60, rows: int = 4096) -> dict[str, Any]:
    """The rollup's cost per batch, measured finely: ``batches`` pairs of one
    :func:`ckptlab.db.store.add_steps` call of ``rows`` records with the rollup (into one
    experiment) and one with ``rollup=False`` (into another), alternating in one process
    and database, so a load that comes and goes falls on both of a pair. Each call is timed
    in wall time and in CPU time of this thread (``time.thread_time``: SQLite runs in it, so
    that is all of the work on SQLite, and what other processes take of the cores is not
    in it; on PostgreSQL the server's share is not in it).

    Returns:
        For ``wall`` and ``cpu``: ``with_ms`` / ``without_ms``, the median ms per batch, and
        ``cost_pct``, ``with_ms / without_ms - 1`` in percent.
    """
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as s:
        ids = {flag: store.create_experiment(s, spec=SPEC, status=Status.RUNNING).id for flag in (True, False)}
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    with Session() as s:
        for i in range(batches):
            records = [_record(step) for step in range(i * rows + 1, (i + 1) * rows + 1)]
            for rollup in (True, False) if i % 2 == 0 else (False, True):
                t, c = time.perf_counter(), time.thread_time()
                store.add_steps(s, experiment_id=ids[rollup], attempt=1, records=records, rollup=rollup)
                cpu[rollup].append(1000 * (time.thread_time() - c))
                wall[rollup].append(1000 * (time.perf_counter() - t))
    engine.dispose()

    def summary(times: dict[bool, list[float]]) -> dict[str, float]:
        w, wo = statistics.median(times[True]), statistics.median(times[False])
        return {"with_ms": w, "without_ms": wo, "cost_pct": 100 * (w / wo - 1)}

    return {"wall": summary(wall), "cpu": summary(cpu)}


def bench_rollup_share(url: str, rows: int) -> float:
    """The share of the batch writer's time spent on the rollup, in percent: time inside
    the rollup's own steps (turning the values into arrays,
    :func:`ckptlab.db.rollups.add_rollup`) over time inside
    :func:`ckptlab.db.store.add_steps`, both summed over one :func:`bench_writes` run with
    the rollup. Measured within the same calls, so a machine busy with other work slows
    both alike; what the rollup adds inside the insert itself (``RETURNING``) is not in it."""
    spent = {"rollup": 0.0, "all": 0.0}

    def timed(fn: Callable, key: str) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t

        return wrapper

    with contextlib.ExitStack() as stack:
        for name in ("_rollup_input", "add_rollup"):
            stack.enter_context(mock.patch.object(store, name, timed(getattr(store, name), "rollup")))
        stack.enter_context(mock.patch.object(writer_module, "add_steps", timed(store.add_steps, "all")))
        bench_writes(url, rows)
    return 100 * spent["rollup"] / spent["all"]


def print_rollup_cost(rows: int, rounds: int, postgres_url: str | None) -> None:
    """Run :func:`bench_rollup_cost` on SQLite and PostgreSQL (a throwaway cluster unless
    ``postgres_url``) and print a Markdown table."""
    from tests.postgres import PostgresCluster, find_pg_bin

    print(f"machine: {os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}")
    print(
        "| database | rows/s with rollup (median) | rows/s without (median) "
        f"| cost in wall time, median of {rounds} rounds (range) | cost in CPU time of the writing process (range) |"
    )
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="ckptlab-bench-") as tmp:
        cluster = None
        if postgres_url is None and (pg_bin := find_pg_bin()) is not None:
            cluster = PostgresCluster(pg_bin)
        databases = {"SQLite": lambda name: f"sqlite:///{Path(tmp) / name}.db"}
        if postgres_url or cluster:
            databases["PostgreSQL"] = lambda name: postgres_url or cluster.create_database()
        batch_rows = []
        share_rows = []
        try:
            for name, url_for in databases.items():
                shares = [bench_rollup_share(url_for(f"share{i}"), rows) for i in range(3)]
                share_rows.append(
                    f"| {name} | {statistics.median(shares):.1f}% ({min(shares):.1f} ... {max(shares):.1f}%) |"
                )
                b = bench_batch_cost(url_for("batches"))
                for clock in ("cpu", "wall"):
                    m = b[clock]
                    batch_rows.append(
                        f"| {name} | {clock} | {m['with_ms']:.1f} ms | {m['without_ms']:.1f} ms "
                        f"| {m['cost_pct']:+.1f}% |"
                    )
                r = bench_rollup_cost(url_for, rows, rounds)
                lo, hi = r["range_pct"]
                clo, chi = r["cpu_range_pct"]
                print(
                    f"| {name} | {statistics.median(r['with']):,.0f} | {statistics.median(r['without']):,.0f} | "
                    f"{r['cost_pct']:+.1f}% ({lo:+.1f} ... {hi:+.1f}%) | "
                    f"{r['cpu_cost_pct']:+.1f}% ({clo:+.1f} ... {chi:+.1f}%) |"
                )
            print("\n| database | clock | one batch of 4,096 steps with the rollup (median of 60) | without | cost |")
            print("| --- | --- | --- | --- | --- |")
            print("\n".join(batch_rows))
            print("\n| database | share of the batch writer's time in the rollup, median of 3 runs (range) |")
            print("| --- | --- |")
            print("\n".join(share_rows))
        finally:
            if cluster is not None:
                cluster.stop()


def main() -> None:
    """Run both benchmarks and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10, help="warm-start samples (default 10)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows per write benchmark (default 20000)")
    parser.add_argument("--postgres-url", help="PostgreSQL database to write into (default: a throwaway cluster)")
    parser.add_argument(
        "--rollup-cost",
        type=int,
        metavar="ROUNDS",
        help="only price the rollup: write throughput with and without it, ROUNDS alternating rounds",
    )
    args = parser.parse_args()
    if args.rollup_cost:
        print_rollup_cost(args.rows, args.rollup_cost, args.postgres_url)
        return

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
