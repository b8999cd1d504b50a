"""Benchmark: a burst of live streams over the server's cap, and how fast the refusals answer.

Starts ``ckptlab serve`` in its own process on a fresh SQLite database with
``CKPTLAB_MAX_STREAMS=--cap`` and submits one experiment (no worker claims it: its streams
never end). Then ``--streams`` clients open ``GET /api/experiments/{id}/events`` at once (one
asyncio loop, httpx), while ``/api/health`` is asked every ``--health-every`` s until the
burst has settled. Each stream is timed from its request to its response's status line: the
accepted ones (200) are held open, the refused ones (503 with ``Retry-After``) are done.
Reported: accepted / refused / other, refusal latency p50 / p90 / max, acceptance latency
p50 / p90 / max and health p50 / p90 / max (ms).

Usage::

    .venv/bin/python bench/bench_stream_burst.py [--streams 400] [--cap 200] [--token T] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import _free_port, start_server, stop_server  # noqa: E402


async def _get(host: str, port: int, path: str) -> tuple[int, float, asyncio.StreamWriter]:
    """``GET path`` on a new connection, written and read by hand (a client as light as
    curl: httpx's own cost per request would be most of what is measured): its status,
    the ms from connecting to the status line, and the open connection."""
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.perf_counter()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: */*\r\n\r\n".encode())
    line = await reader.readline()
    ms = 1000 * (time.perf_counter() - t0)
    return int(line.split()[1]), ms, writer


async def _open(host: str, port: int, path: str, answered: list, hold: asyncio.Event) -> None:
    """Open one stream and append (its status, or the error's name; ms to the status line)
    to ``answered``. An accepted stream stays open until ``hold`` is set."""
    t0 = time.perf_counter()
    try:
        status, ms, writer = await _get(host, port, path)
    except OSError as exc:
        answered.append((type(exc).__name__, 1000 * (time.perf_counter() - t0)))
        return
    answered.append((status, ms))
    if status == 200:
        await hold.wait()
    writer.close()


async def _health(host: str, port: int, every_s: float, stop: asyncio.Event) -> list[float]:
    """``GET /api/health`` every ``every_s`` s until ``stop``; each one's latency (ms)."""
    times = []
    while not stop.is_set():
        status, ms, writer = await _get(host, port, "/api/health")
        writer.close()
        if status != 200:
            raise RuntimeError(f"/api/health answered {status}")
        times.append(ms)
        await asyncio.sleep(every_s)
    return times


def _stats(name: str, values: list[float]) -> dict:
    """``<name>_p50_ms``, ``_p90_ms``, ``_max_ms`` of ``values`` (None when empty)."""
    if not values:
        return {f"{name}_{k}_ms": None for k in ("p50", "p90", "max")}
    p50, p90 = np.percentile(values, [50, 90])
    return {
        f"{name}_p50_ms": round(float(p50), 1),
        f"{name}_p90_ms": round(float(p90), 1),
        f"{name}_max_ms": round(max(values), 1),
    }


async def _burst(port: int, streams: int, health_every_s: float, token: str | None) -> dict:
    """Fire the burst at the server on 127.0.0.1:``port``; its figures."""
    host = "127.0.0.1"
    experiment = {"model": {"kind": "mlp", "depth": 4, "width": 32}, "device": "cpu", "steps": 3}
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"http://{host}:{port}/api/experiments", json=experiment, headers=auth, timeout=30)
    path = f"/api/experiments/{r.json()['id']}/events"
    hold, stop = asyncio.Event(), asyncio.Event()
    health = asyncio.create_task(_health(host, port, health_every_s, stop))
    answered: list[tuple[int | str, float]] = []
    tasks = [asyncio.create_task(_open(host, port, path, answered, hold)) for _ in range(streams)]
    while len(answered) < streams:  # every stream refused or open
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # health a second past the burst
    stop.set()
    hold.set()
    await asyncio.gather(*tasks)
    health_ms = await health
    codes = [code for code, _ms in answered]
    return {
        "streams": streams,
        "accepted": codes.count(200),
        "refused_503": codes.count(503),
        "other": len(codes) - codes.count(200) - codes.count(503),
        **_stats("refusal", [ms for code, ms in answered if code == 503]),
        **_stats("accept", [ms for code, ms in answered if code == 200]),
        **_stats("health", health_ms),
        "health_requests": len(health_ms),
    }


def run(*, streams: int, cap: int, health_every_s: float = 0.05, token: str | None = None) -> dict:
    """Start the server with ``cap`` streams (and ``token``, the API token, if given), fire
    ``streams`` at it; the figures."""
    tmp = Path(tempfile.mkdtemp(prefix="ckptlab-burst-"))
    os.environ["CKPTLAB_MAX_STREAMS"] = str(cap)
    if token:
        os.environ["CKPTLAB_API_TOKEN"] = token
    port = _free_port()
    proc = start_server(f"sqlite:///{tmp / 'ckptlab.db'}", port)
    try:
        result = asyncio.run(_burst(port, streams, health_every_s, token))
        return {
            **result,
            "cap": cap,
            "token": bool(token),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 1),
        }
    finally:
        stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=400)
    ap.add_argument("--cap", type=int, default=200, help="the server's max_streams")
    ap.add_argument("--health-every", type=float, default=0.05, help="seconds between health requests")
    ap.add_argument("--token", help="serve with this API token (writes need it; reads stay open)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(streams=args.streams, cap=args.cap, health_every_s=args.health_every, token=args.token)
    print(json.dumps(result) if args.json else "\n".join(f"{k:20s} {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
