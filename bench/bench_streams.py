"""Benchmark: many live streams on a running sweep while the API keeps answering.

Starts ``ckptlab serve`` in its own process on a fresh SQLite database and creates a sweep
through the API. This process then plays the worker: it claims the sweep's experiments and
commits one step to each every ``--interval`` s for ``--seconds`` s, then finishes them.
Meanwhile ``--streams`` clients hold ``GET /api/sweeps/{id}/events`` open (one asyncio
loop, httpx) and count the step events they receive, and a load generator sends
``--rate`` GETs per second (alternating ``/api/health`` and ``/api/experiments``) and times
each. Reported: failed GETs, GET latency p50 / p95 / max, health p95, streams refused
(503) or broken, and whether every stream received every committed step.

``--scope experiments --runs 20`` spreads the streams over 20 live experiments (one scope
each: polls are shared within an experiment only); ``--scope catchup --backlog 20000`` opens
every stream from cursor 0 on an experiment that already holds 20,000 steps. Each stream
also checks that its step events arrive in row-id order.

Usage::

    .venv/bin/python bench/bench_streams.py [--streams 200] [--rate 20] [--seconds 60]
        [--interval 0.5] [--scope sweep|experiments|catchup] [--runs 2] [--backlog 20000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import _free_port, _record, start_server, stop_server  # noqa: E402

from ckptlab.db import queue, store  # noqa: E402
from ckptlab.db.database import make_engine, make_sessionmaker, migrate  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.summary import RunSummary  # noqa: E402


async def _stream(client: httpx.AsyncClient, url: str, counts: dict, key: int, ready: asyncio.Event) -> None:
    """Read one SSE stream to its ``end`` event, counting step events."""
    counts[key] = {"steps": 0, "ended": False, "status": None, "error": None, "in_order": True, "last_id": 0}
    try:
        async with client.stream("GET", url) as r:
            counts[key]["status"] = r.status_code
            ready.set()
            if r.status_code != 200:
                return
            buf = ""
            async for chunk in r.aiter_text():
                buf = (buf + chunk).replace("\r\n", "\n")
                while "\n\n" in buf:
                    block, buf = buf.split("\n\n", 1)
                    if "event: step" in block:
                        counts[key]["steps"] += 1
                        row = int(block.split("id: ", 1)[1].split(":", 1)[0])
                        if row <= counts[key]["last_id"]:
                            counts[key]["in_order"] = False
                        counts[key]["last_id"] = row
                    elif "event: end" in block:
                        counts[key]["ended"] = True
                        return
    except Exception as exc:  # noqa: BLE001 - a broken stream is a result
        counts[key]["error"] = f"{type(exc).__name__}: {exc}"
        ready.set()


async def _load(client: httpx.AsyncClient, base: str, rate: float, stop: asyncio.Event, out: dict) -> None:
    """``rate`` GETs per second until ``stop``; records latency (ms) and failures."""
    paths = ["/api/health", "/api/experiments?limit=20"]
    n = 0

    async def one(path: str) -> None:
        t0 = time.perf_counter()
        try:
            r = await client.get(base + path, timeout=30)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        ms = 1000 * (time.perf_counter() - t0)
        out["all"].append(ms)
        if path == "/api/health":
            out["health"].append(ms)
        if not ok:
            out["errors"] += 1

    tasks = []
    start = time.perf_counter()
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(paths[n % 2])))
        n += 1
        await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
    await asyncio.gather(*tasks)


def _claim_all(Session, exp_ids: list[int], backlog: int) -> None:
    """Claim the experiments as a registered worker; give the first ``backlog`` steps."""
    import random

    rng = random.Random(1)
    with Session() as s:  # a registered worker that heartbeats, or the reaper requeues its runs
        queue.register_worker(s, worker_id="bench:streams", host="bench", pid=0, devices=["cpu"])
        for _ in exp_ids:
            queue.claim_next(s, worker_id="bench:streams")
        for start in range(1, backlog + 1, 5000):
            records = [_record(k, rng) for k in range(start, min(backlog, start + 4999) + 1)]
            store.add_steps(s, experiment_id=exp_ids[0], attempt=1, records=records)


def _play_worker(Session, exp_ids: list[int], *, seconds: float, interval: float, first_step: int = 0) -> int:
    """Commit a step to each experiment every ``interval`` s for ``seconds``; finish them.
    Returns the number of steps each got in this phase."""
    import random

    rng = random.Random(0)
    step = first_step
    deadline = time.monotonic() + seconds
    with Session() as s:
        while time.monotonic() < deadline:
            step += 1
            for i in exp_ids:
                store.add_steps(s, experiment_id=i, attempt=1, records=[_record(step, rng)])
            queue.heartbeat_worker(s, worker_id="bench:streams")
            time.sleep(interval)
        for i in exp_ids:
            queue.finish_experiment(s, experiment_id=i, status=Status.SUCCEEDED, summary=RunSummary())
    return step - first_step


async def run(
    *, streams: int, rate: float, seconds: float, interval: float, scope: str = "sweep", runs: int = 2, backlog: int = 0
) -> dict:
    """Run the benchmark; returns its figures.

    ``scope``: ``sweep`` (every stream on the sweep), ``experiments`` (stream ``k`` on
    experiment ``k mod runs``: many scopes, no poll shared between them) or ``catchup``
    (every stream on the first experiment, which already holds ``backlog`` steps: each starts
    from cursor 0 and catches up while new steps arrive)."""
    tmp = Path(tempfile.mkdtemp(prefix="ckptlab-streams-"))
    url = f"sqlite:///{tmp / 'ckptlab.db'}"
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    port = _free_port()
    proc = start_server(url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        body = {
            "name": "streams",
            "base": {"model": {"kind": "mlp", "depth": 8, "width": 64}, "device": "cpu", "steps": 3},
            "axes": {"checkpoint.segments": list(range(1, runs + 1)), "checkpoint.strategy": ["sequential"]},
        }
        body["base"]["model"]["depth"] = max(8, runs)
        sweep = httpx.post(f"{base}/api/sweeps", json=body, timeout=30).json()
        exp_ids = sorted(e["id"] for e in sweep["experiments"])
        await asyncio.to_thread(_claim_all, Session, exp_ids, backlog if scope == "catchup" else 0)
        urls = {
            "sweep": [f"{base}/api/sweeps/{sweep['id']}/events"] * streams,
            "experiments": [f"{base}/api/experiments/{exp_ids[k % len(exp_ids)]}/events" for k in range(streams)],
            "catchup": [f"{base}/api/experiments/{exp_ids[0]}/events"] * streams,
        }[scope]
        limits = httpx.Limits(max_connections=streams + 50, max_keepalive_connections=streams + 50)
        counts: dict[int, dict] = {}
        load = {"all": [], "health": [], "errors": 0}
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as client:
            readies = [asyncio.Event() for _ in range(streams)]
            stream_tasks = [
                asyncio.create_task(_stream(client, urls[k], counts, k, readies[k])) for k in range(streams)
            ]
            t_open = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=180)
            opened_s = time.perf_counter() - t_open
            stop = asyncio.Event()
            load_task = asyncio.create_task(_load(client, base, rate, stop, load))
            first = backlog if scope == "catchup" else 0
            steps = await asyncio.to_thread(
                _play_worker, Session, exp_ids, seconds=seconds, interval=interval, first_step=first
            )
            stop.set()
            await load_task
            t_end = time.perf_counter()
            _done, pending = await asyncio.wait(stream_tasks, timeout=120)
            for t in pending:  # counted as broken below (no end event)
                t.cancel()
            drained_s = time.perf_counter() - t_end
        per_stream = {"sweep": steps * len(exp_ids), "experiments": steps, "catchup": steps + backlog}[scope]
        expected = per_stream
        ok = [c for c in counts.values() if c["status"] == 200]
        return {
            "streams": streams,
            "streams_open": len(ok),
            "streams_refused_503": sum(c["status"] == 503 for c in counts.values()),
            "streams_broken": sum(c["error"] is not None or not c["ended"] for c in ok),
            "streams_with_every_step": sum(c["steps"] == expected for c in ok),
            "streams_in_order": sum(c["in_order"] for c in ok),
            "steps_received_min": min((c["steps"] for c in ok), default=0),
            "steps_per_stream": expected,
            "scope": scope,
            "load_avg_1m": round(os.getloadavg()[0], 1),
            "gets": len(load["all"]),
            "gets_failed": load["errors"],
            "get_p50_ms": round(float(np.percentile(load["all"], 50)), 1),
            "get_p95_ms": round(float(np.percentile(load["all"], 95)), 1),
            "get_max_ms": round(max(load["all"]), 1),
            "health_p50_ms": round(float(np.percentile(load["health"], 50)), 1),
            "health_p90_ms": round(float(np.percentile(load["health"], 90)), 1),
            "health_p95_ms": round(float(np.percentile(load["health"], 95)), 1),
            "health_max_ms": round(max(load["health"]), 1),
            "all_streams_open_s": round(opened_s, 1),
            "last_event_after_finish_s": round(drained_s, 1),
            "seconds": seconds,
            "rate_per_s": rate,
        }
    finally:
        stop_server(proc)
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--scope", choices=["sweep", "experiments", "catchup"], default="sweep")
    ap.add_argument("--runs", type=int, default=2, help="experiments in the sweep (all live)")
    ap.add_argument("--backlog", type=int, default=20_000, help="steps already stored (scope catchup)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = asyncio.run(
        run(
            streams=args.streams,
            rate=args.rate,
            seconds=args.seconds,
            interval=args.interval,
            scope=args.scope,
            runs=args.runs,
            backlog=args.backlog,
        )
    )
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28s} {v}")


if __name__ == "__main__":
    main()
