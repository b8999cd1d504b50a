"""Benchmark of the API's live stream and series endpoints.

Starts ``ckptlab serve`` in its own process on a fresh SQLite database, then measures:

1. Stream latency: this process plays a worker, committing one step at a time to a running
   experiment (a random pause of ``--interval`` s on average between steps), while a client
   thread reads ``GET /api/experiments/{id}/events``. Latency = time the client parsed the
   step event - time the step's commit returned (both ``time.monotonic``, one process).
2. Series latency: ``GET /api/experiments/{id}/series?metric=...&max_points=2000`` timed
   end to end over HTTP for runs of ``--series-steps`` steps (default 1,000,000): the first
   request of each metric for a run the server never saw running (read from its rollup),
   repeated requests, the first requests for a run the server saw running (its series
   warmer kept it in memory), and a request after 1,000 more steps were stored.

Usage::

    .venv/bin/python bench/bench_api.py [--stream-steps 300] [--interval 0.1]
        [--series-steps 1000000] [--json]

Prints a Markdown table (or JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from ckptlab.db import queue, rollups, store
from ckptlab.db.buckets import summarize
from ckptlab.db.database import make_engine, make_sessionmaker, migrate
from ckptlab.db.models import Step
from ckptlab.domain import SERIES_METRICS, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary  # noqa: E402

METRICS = ("step_ms", "peak_allocated_bytes", "loss")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _record(step: int, rng: random.Random) -> dict:
    t = 10 + rng.random()
    return {
        "step": step,
        "forward_ms": t / 3,
        "backward_ms": t / 2,
        "optimizer_ms": t / 6,
        "step_ms": t + (40 if step % 99_991 == 0 else 0),
        "allocated_bytes": 10**6 + step,
        "peak_allocated_bytes": 2 * 10**6 + (step % 1000),
        "reserved_bytes": None,
        "loss": 1.0 / step,
    }


def start_server(database_url: str, port: int) -> subprocess.Popen:
    """``ckptlab serve`` on 127.0.0.1:port; returns once /api/health answers."""
    env = {**os.environ, "CKPTLAB_DATABASE_URL": database_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptlab.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server from :func:`start_server` (SIGTERM; SIGKILL after 10 s)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def bench_stream(base: str, Session, *, n_steps: int, interval: float) -> dict:
    """Commit ``n_steps`` steps one by one; return latency stats (ms) from commit to client."""
    with Session() as s:
        exp = store.create_experiment(s, spec=ExperimentSpec(device="cpu"), status=Status.RUNNING, worker_id="bench:0")
    received: dict[int, float] = {}
    ended = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=60) as http, http.stream("GET", f"{base}/api/experiments/{exp.id}/events") as r:
            buf = ""
            for chunk in r.iter_text():
                buf = (buf + chunk).replace("\r\n", "\n")
                while "\n\n" in buf:
                    block, buf = buf.split("\n\n", 1)
                    lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
                    if lines.get("event") == "step":
                        received[json.loads(lines["data"])["step"]] = time.monotonic()
                    elif lines.get("event") == "end":
                        ended.set()
                        return

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    time.sleep(1.0)  # connected and past its first poll
    committed: dict[int, float] = {}
    rng = random.Random(0)
    with Session() as s:
        for step in range(1, n_steps + 1):
            store.add_steps(s, experiment_id=exp.id, attempt=1, records=[_record(step, rng)])
            committed[step] = time.monotonic()
            time.sleep(rng.uniform(0, 2 * interval))
        queue.finish_experiment(s, experiment_id=exp.id, status=Status.SUCCEEDED, summary=RunSummary())
    if not ended.wait(30):
        raise RuntimeError("the stream did not end")
    lat = [1000 * (received[s] - committed[s]) for s in committed if s in received]
    return {
        "steps": n_steps,
        "received": len(lat),
        "p50_ms": statistics.median(lat),
        "p95_ms": _percentile(lat, 95),
        "max_ms": max(lat),
    }


def _insert_run(Session, n_steps: int, rng: random.Random, *, finished: bool) -> int:
    """Store a run of ``n_steps`` steps (50,000 per commit, each with its rollup as
    :func:`ckptlab.db.store.add_steps` writes it); finished first when asked, so that the
    server never sees it running."""
    with Session() as s:
        exp = store.create_experiment(s, spec=ExperimentSpec(device="cpu"), status=Status.RUNNING, worker_id="bench:1")
        if finished:
            queue.finish_experiment(s, experiment_id=exp.id, status=Status.SUCCEEDED, summary=RunSummary())
        chunk = []
        for step in range(1, n_steps + 1):
            row = _record(step, rng)
            row.update(experiment_id=exp.id, attempt=1, loss_nonfinite=None, extra=None)
            chunk.append(row)
            if len(chunk) == 50_000 or step == n_steps:
                s.execute(Step.__table__.insert(), chunk)
                steps = np.array([r["step"] for r in chunk])
                values = np.array([[r[m] for m in SERIES_METRICS] for r in chunk], dtype=np.float64)
                rollups.merge_buckets(s, experiment_id=exp.id, attempt=1, buckets=summarize(steps, values))
                s.commit()
                chunk = []
        return exp.id


def bench_series(base: str, Session, *, n_steps: int, repeats: int = 20, live: bool = True) -> dict:
    """Time series requests (ms) over runs of ``n_steps`` steps: one the server never saw
    running (cold: read from its rollup), repeats, and with ``live`` (default True) one
    it saw running (kept warm) and a request after 1,000 more steps."""
    rng = random.Random(1)
    out: dict = {"steps": n_steps}
    with httpx.Client(timeout=120) as http:

        def timed(exp_id: int, metric: str, total: int) -> float:
            t = time.perf_counter()
            r = http.get(f"{base}/api/experiments/{exp_id}/series", params={"metric": metric, "max_points": 2000})
            r.raise_for_status()
            body = r.json()
            assert body["total"] == total and len(body["x"]) <= 2000, body["total"]
            return 1000 * (time.perf_counter() - t)

        cold_id = _insert_run(Session, n_steps, rng, finished=True)
        out["cold_ms"] = {m: timed(cold_id, m, n_steps) for m in METRICS}
        warm = [timed(cold_id, "step_ms", n_steps) for _ in range(repeats)]
        out["warm_p50_ms"] = statistics.median(warm)
        out["warm_p95_ms"] = _percentile(warm, 95)
        if not live:
            return out
        live_id = _insert_run(Session, n_steps, rng, finished=False)
        time.sleep(5)  # a pass of the server's series warmer (every 2 s) after the last insert
        out["live_first_ms"] = {m: timed(live_id, m, n_steps) for m in METRICS}
        with Session() as s:
            records = [_record(step, rng) for step in range(n_steps + 1, n_steps + 1001)]
            store.add_steps(s, experiment_id=live_id, attempt=1, records=records)
        out["after_1000_new_steps_ms"] = timed(live_id, "step_ms", n_steps + 1000)
    return out


def run(
    *, stream_steps: int, interval: float, series_steps: int, series_repeats: int = 20, live: bool = True
) -> tuple[dict, dict]:
    """Start a server on a fresh SQLite database, run both benchmarks, clean up.

    Returns ``(stream, series)`` as :func:`bench_stream` and :func:`bench_series` give them.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="ckptlab-bench-"))
    url = f"sqlite:///{data_dir / 'ckptlab.db'}"
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    port = _free_port()
    server = start_server(url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        stream = bench_stream(base, Session, n_steps=stream_steps, interval=interval)
        series = bench_series(base, Session, n_steps=series_steps, repeats=series_repeats, live=live)
    finally:
        server.terminate()
        server.wait(30)
        engine.dispose()
        shutil.rmtree(data_dir, ignore_errors=True)
    return stream, series


def main() -> None:
    """Run both benchmarks against a fresh server and print the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream-steps", type=int, default=300)
    ap.add_argument("--interval", type=float, default=0.1, help="mean pause between committed steps, s")
    ap.add_argument("--series-steps", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = ap.parse_args()

    stream, series = run(stream_steps=args.stream_steps, interval=args.interval, series_steps=args.series_steps)
    result = {"stream": stream, "series": series}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("| measurement | value |")
    print("| --- | --- |")
    print(f"| stream: steps committed / received | {stream['steps']} / {stream['received']} |")
    print(f"| stream latency commit -> client p50 | {stream['p50_ms']:.0f} ms |")
    print(f"| stream latency commit -> client p95 | {stream['p95_ms']:.0f} ms |")
    print(f"| stream latency max | {stream['max_ms']:.0f} ms |")
    print(f"| series: steps in the run | {series['steps']:,} |")
    for m, v in series["cold_ms"].items():
        print(f"| series, finished run never seen running, first request ({m}) | {v:.0f} ms |")
    print(f"| series, same run, repeated requests p50 | {series['warm_p50_ms']:.0f} ms |")
    print(f"| series, same run, repeated requests p95 | {series['warm_p95_ms']:.0f} ms |")
    for m, v in series["live_first_ms"].items():
        print(f"| series, run the server saw running, first request ({m}) | {v:.0f} ms |")
    print(f"| series after 1,000 new steps | {series['after_1000_new_steps_ms']:.0f} ms |")


if __name__ == "__main__":
    main()
