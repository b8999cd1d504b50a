"""Benchmark of the series endpoint on long runs, read from their rollups.

Run from the repository root::

    .venv/bin/python bench/bench_series.py [--steps 1000000,10000000] [--cold 7] [--warm 30] [--json]

1. **Data.** A fresh SQLite database (WAL) with one finished run per ``--steps`` size,
   stored in bulk (``executemany`` on the raw connection, 200,000 steps per transaction)
   with their rollup computed per transaction as :func:`ckptlab.db.store.add_steps` does
   it, and one 1,000,000-step run stored without a rollup: what every run read like
   before the rollup (the whole column, then MinMaxLTTB).
2. **Cold.** A fresh ``ckptlab serve`` process per sample (new database connections, empty
   series cache; the operating system's file cache stays warm): the time of its first
   ``GET /api/experiments/{id}/series?metric=step_ms&max_points=2000`` over HTTP, then of
   its first request of a second metric (``peak_allocated_bytes``).
3. **Warm.** ``--warm`` repeated requests of the same series on one server.
4. **Rebuild.** The time :func:`ckptlab.db.rollups.rebuild_attempt` (what ``ckptlab db
   rebuild-rollups`` runs per attempt) takes for the 1,000,000-step run stored without one.

Prints the median and the spread (min ... max) of each in ms, and the rollup's size
against the steps table's (SQLite ``dbstat``), as a Markdown table (or JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptlab.db import queue, rollups, store  # noqa: E402
from ckptlab.db.buckets import summarize  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.domain import SERIES_METRICS, Status  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.summary import RunSummary  # noqa: E402

CHUNK = 200_000
COLUMNS = ("experiment_id", "attempt", "step", *SERIES_METRICS, "loss_nonfinite", "extra")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chunk(start: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Steps ``start .. start + n - 1`` and their metrics (``SERIES_METRICS`` order): a slow
    wave with noise and rare spikes in the times, memory that saw-tooths, no reserved bytes
    (CPU), a decaying loss."""
    steps = np.arange(start, start + n, dtype=np.int64)
    wave = np.sin(steps / 50_000)
    step_ms = 10 + wave + rng.normal(0, 0.05, n)
    step_ms[rng.random(n) < 1e-5] *= 4
    values = np.empty((n, len(SERIES_METRICS)))
    values[:, 0] = step_ms * 0.3
    values[:, 1] = step_ms * 0.6
    values[:, 2] = step_ms * 0.1
    values[:, 3] = step_ms
    values[:, 4] = 1e9 + (steps % 1000) * 1e4
    values[:, 5] = 2e9 + (steps % 1000) * 2e4 + rng.integers(0, 1000, n)
    values[:, 6] = np.nan
    values[:, 7] = 2.0 / np.log(steps + 2) + rng.normal(0, 0.01, n)
    return steps, values


def insert_run(Session, n_steps: int, *, rollup: bool, seed: int) -> int:
    """Store a finished run of ``n_steps`` steps, with its rollup unless told not to."""
    rng = np.random.default_rng(seed)
    placeholders = ", ".join("?" * len(COLUMNS))
    sql = f"INSERT INTO steps ({', '.join(COLUMNS)}) VALUES ({placeholders})"
    with Session() as s:
        exp = store.create_experiment(s, spec=ExperimentSpec(device="cpu"), status=Status.RUNNING, worker_id="bench")
        for start in range(1, n_steps + 1, CHUNK):
            steps, values = _chunk(start, min(CHUNK, n_steps - start + 1), rng)
            n = len(steps)
            cols = [values[:, j].tolist() for j in range(len(SERIES_METRICS))]
            cols[SERIES_METRICS.index("reserved_bytes")] = [None] * n
            rows = zip([exp.id] * n, [1] * n, steps.tolist(), *cols, [None] * n, [None] * n, strict=True)
            s.connection().connection.dbapi_connection.cursor().executemany(sql, rows)
            if rollup:
                rollups.merge_buckets(s, experiment_id=exp.id, attempt=1, buckets=summarize(steps, values))
            s.commit()
        queue.finish_experiment(s, experiment_id=exp.id, status=Status.SUCCEEDED, summary=RunSummary())
        return exp.id


def start_server(database_url: str) -> tuple[subprocess.Popen, str]:
    """A fresh ``ckptlab serve`` on a free port; returns it and its base URL once
    ``/api/health`` answers."""
    port = _free_port()
    env = {**os.environ, "CKPTLAB_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptlab.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/api/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def _timed(http: httpx.Client, base: str, exp_id: int, metric: str, n_steps: int) -> tuple[float, dict]:
    t = time.perf_counter()
    r = http.get(f"{base}/api/experiments/{exp_id}/series", params={"metric": metric, "max_points": 2000})
    elapsed = 1000 * (time.perf_counter() - t)
    r.raise_for_status()
    body = r.json()
    if body["total"] != n_steps or len(body["x"]) > 2000:
        raise RuntimeError(f"unexpected answer: total {body['total']}, {len(body['x'])} points")
    return elapsed, body


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_cold(url: str, runs: dict[str, tuple[int, int]], samples: int) -> dict[str, dict]:
    """Per run: the first step_ms request and the first peak_allocated_bytes request of a
    fresh server process, ``samples`` processes (ms)."""
    first: dict[str, list[float]] = {name: [] for name in runs}
    second: dict[str, list[float]] = {name: [] for name in runs}
    resolution: dict[str, int] = {}
    for _ in range(samples):
        for name, (exp_id, n_steps) in runs.items():
            proc, base = start_server(url)
            try:
                with httpx.Client(timeout=120) as http:
                    ms, body = _timed(http, base, exp_id, "step_ms", n_steps)
                    first[name].append(ms)
                    second[name].append(_timed(http, base, exp_id, "peak_allocated_bytes", n_steps)[0])
                    resolution[name] = body["resolution"]
            finally:
                proc.terminate()
                proc.wait(30)
    return {
        name: {"first": _spread(first[name]), "second_metric": _spread(second[name]), "resolution": resolution[name]}
        for name in runs
    }


def bench_warm(url: str, runs: dict[str, tuple[int, int]], repeats: int) -> dict[str, dict]:
    """Per run: ``repeats`` requests of the same series on one server, after a first one (ms)."""
    proc, base = start_server(url)
    out = {}
    try:
        with httpx.Client(timeout=120) as http:
            for name, (exp_id, n_steps) in runs.items():
                _timed(http, base, exp_id, "step_ms", n_steps)
                times = [_timed(http, base, exp_id, "step_ms", n_steps)[0] for _ in range(repeats)]
                out[name] = {**_spread(times), "p95": float(np.percentile(times, 95))}
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes of the steps table and of the rollup table, each with its indexes (SQLite
    ``dbstat``), and the step rows stored and rolled up."""
    with sqlite3.connect(path) as c:
        size = dict(c.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
        index_of = dict(c.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'").fetchall())
        rows = c.execute("SELECT count(*) FROM steps").fetchone()[0]
        rolled = c.execute("SELECT sum(n_steps) FROM step_rollups WHERE level = 20").fetchone()[0]
    owner = {name: index_of.get(name, name) for name in size}
    return {
        "steps": sum(v for k, v in size.items() if owner[k] == "steps"),
        "step_rollups": sum(v for k, v in size.items() if owner[k] == "step_rollups"),
        "step_rows": rows,
        "rolled_rows": rolled,
    }


def main() -> None:
    """Build the runs, time cold and warm requests, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="1000000,10000000", help="run sizes, comma-separated")
    ap.add_argument("--cold", type=int, default=7, help="fresh server processes per run (default 7)")
    ap.add_argument("--warm", type=int, default=30, help="repeated requests per run (default 30)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.steps.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="ckptlab-bench-series-"))
    db = tmp / "ckptlab.db"
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    try:
        runs: dict[str, tuple[int, int]] = {}
        insert_s = {}
        for i, n in enumerate(sizes):
            t = time.perf_counter()
            runs[f"{n:,} steps"] = (insert_run(Session, n, rollup=True, seed=i), n)
            insert_s[n] = time.perf_counter() - t
        runs["1,000,000 steps, no rollup (every step read)"] = (
            insert_run(Session, 1_000_000, rollup=False, seed=99),
            1_000_000,
        )
        engine.dispose()
        sizes_bytes = table_bytes(db)
        cold = bench_cold(url, runs, args.cold)
        warm = bench_warm(url, runs, args.warm)
        bare_id = runs["1,000,000 steps, no rollup (every step read)"][0]
        with Session() as s:
            t = time.perf_counter()
            rollups.rebuild_attempt(s, experiment_id=bare_id, attempt=1)
            rebuild_s = time.perf_counter() - t
    finally:
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)

    result = {"insert_s": insert_s, "bytes": sizes_bytes, "cold": cold, "warm": warm, "rebuild_1m_s": rebuild_s}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"machine: {os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}"
    )
    per_row = sizes_bytes["steps"] / sizes_bytes["step_rows"]
    per_rolled = sizes_bytes["step_rollups"] / sizes_bytes["rolled_rows"]
    print(
        f"stored: {', '.join(f'{n:,} steps in {s:.0f} s' for n, s in insert_s.items())}; steps table "
        f"{per_row:.0f} B per step, rollup {per_rolled:.1f} B per step rolled up ({100 * per_rolled / per_row:.1f}%)"
    )
    print(f"rebuild of the 1,000,000-step run without a rollup (rebuild_attempt): {rebuild_s:.1f} s")
    print(
        f"| run | read from | cold, first request: median (min ... max) of {args.cold} | cold, second metric | "
        f"warm: median (min ... max), p95 of {args.warm} |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name in runs:
        c, w = cold[name], warm[name]
        res = c["resolution"]
        print(
            f"| {name} | {'every step' if res == 1 else f'rollup, buckets of {res:,} steps'} | "
            f"{c['first']['median']:.0f} ms ({c['first']['min']:.0f} ... {c['first']['max']:.0f}) | "
            f"{c['second_metric']['median']:.0f} ms ({c['second_metric']['min']:.0f} ... "
            f"{c['second_metric']['max']:.0f}) | "
            f"{w['median']:.1f} ms ({w['min']:.1f} ... {w['max']:.1f}), p95 {w['p95']:.1f} |"
        )


if __name__ == "__main__":
    main()
