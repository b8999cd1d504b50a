"""Benchmark: a sweep of the form's Tiny MLP preset under load tells one story (issue 32).

``--sweeps`` times (default 3), with ``--load`` busy loops beside it (default 2, one per core
of this 2-core VM): the preset's sweep (``ckptlab.spec.presets.PRESETS["tiny"]``: segments
1, 2, 4, 8 of an 8 x 128 MLP, batch 2048, CPU, its ``none`` baseline first and again last)
is submitted through the API and run by one ``ckptlab worker --once``; then the
recommendation for a budget between the lowest and the highest measured peak, with "within
20%", and the results JSON are read and checked:

- **pick**: no fitting candidate is measurably faster than the recommended one (its paired
  overhead's 95% CI lies wholly below the pick's);
- **within**: the "within 20%" answer's overhead estimate is at most 20%, and no candidate
  whose estimate is at most 20% has a lower peak;
- **one order**: the results' ``rank`` column orders the runs as the recommendation's
  ``ranking`` does (the page's table, card and chart marks read these).

Usage: python bench/bench_sweep_story.py [--sweeps 3] [--load 2]. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fastapi.testclient import TestClient  # noqa: E402
from load import busy_loops  # noqa: E402

from ckptlab.backend.app import create_app  # noqa: E402
from ckptlab.db.database import make_engine, migrate  # noqa: E402
from ckptlab.settings import Settings  # noqa: E402
from ckptlab.spec.presets import PRESETS  # noqa: E402

WITHIN_PCT = 20.0


def _body() -> dict[str, Any]:
    preset = PRESETS["tiny"]
    axes = {path: [int(v) for v in text.split(",")] for path, text in preset["axes"].items()}
    return {"name": "tiny preset", "base": preset["spec"], "axes": axes}


def _one_sweep(tmp: Path) -> dict[str, Any]:
    """Run one sweep in a fresh database; return its checks and figures."""
    url = f"sqlite:///{tmp / 'ckptlab.db'}"
    os.environ.setdefault("CKPTLAB_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
    migrate(make_engine(url))
    with TestClient(create_app(Settings(database_url=url, data_dir=tmp))) as client:  # runs the lifespan
        created = client.post("/api/sweeps", json=_body())
        created.raise_for_status()
        sweep_id = created.json()["id"]
        env = {
            **os.environ,
            "CKPTLAB_DATABASE_URL": url,
            "CKPTLAB_DATA_DIR": str(tmp),
            "CKPTLAB_POLL_INTERVAL_S": "0.1",
        }
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "ckptlab.cli", "worker", "--once", "--devices", "cpu"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=1200,
        )
        seconds = time.perf_counter() - t0
        rows = [{**r, **r["metrics"]} for r in client.get(f"/api/sweeps/{sweep_id}/results?format=json").json()["data"]]
        peaks = [r["peak_allocated_bytes"] for r in rows if r.get("peak_allocated_bytes")]
        budget = int(min(peaks) + max(peaks)) // 2
        rec = client.get(f"/api/sweeps/{sweep_id}/recommendation?budget_bytes={budget}&within_pct={WITHIN_PCT}").json()
    return {"rows": rows, "rec": rec, "budget": budget, "seconds": seconds}


def _checks(result: dict[str, Any]) -> dict[str, Any]:
    rows = {r["experiment_id"]: r for r in result["rows"]}
    rec = result["rec"]
    fitting = [rows[i] for i in rec.get("fitting") or [] if i in rows]
    pick = rows.get(rec["experiment_id"]) if rec["experiment_id"] is not None else None

    def low(r: dict) -> float:
        return 0.0 if r["role"] == "baseline" else r["overhead_low_pct"]

    def high(r: dict) -> float:
        return 0.0 if r["role"] == "baseline" else r["overhead_high_pct"]

    faster = [r["label"] for r in fitting if pick is not None and r is not pick and high(r) < low(pick)]
    within = rec.get("smallest_within")
    within_ok = within is None or (within["overhead_pct"] or 0.0) <= WITHIN_PCT
    if within is not None:
        chosen = rows[within["experiment_id"]]
        lower = [
            r["label"]
            for r in rows.values()
            if r["rank"] is not None
            and (0.0 if r["role"] == "baseline" else (r["overhead_pct"] or 0.0)) <= WITHIN_PCT
            and r["peak_allocated_bytes"] < chosen["peak_allocated_bytes"]
            and (not fitting or r in fitting)
        ]
        within_ok = within_ok and not lower
    ranked = sorted((r for r in rows.values() if r["rank"] is not None), key=lambda r: r["rank"])
    one_order = [r["experiment_id"] for r in ranked] == rec["ranking"]
    return {
        "pick": pick["label"] if pick else "-",
        "pick_overhead": (pick["overhead_text"] or "baseline") if pick else "-",
        "faster_fitting": faster,
        "within": within["label"] if within else "-",
        "within_overhead": within.get("overhead_text") if within else "-",
        "within_ok": within_ok,
        "one_order": one_order,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=3)
    ap.add_argument("--load", type=int, default=2, help="busy loops beside the sweeps")
    args = ap.parse_args()
    out = []
    with busy_loops(args.load):
        for i in range(args.sweeps):
            with tempfile.TemporaryDirectory() as tmp:
                result = _one_sweep(Path(tmp))
            out.append((result, _checks(result)))
            print(f"  sweep {i + 1}: {result['seconds']:.0f} s", file=sys.stderr, flush=True)
    print(f"{platform.machine()}, {os.cpu_count()} cores, {args.load} busy loops, load {os.getloadavg()[0]:.1f}")
    print()
    print(
        "| sweep | budget | pick | its overhead | fitting runs measurably faster | within 20% | its overhead | "
        "within holds | one order | s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, (result, c) in enumerate(out, 1):
        faster = ", ".join(c["faster_fitting"]) or "none"
        print(
            f"| {i} | {result['budget']:,} B | {c['pick']} | {c['pick_overhead']} | {faster} "
            f"| {c['within']} | {c['within_overhead']} | {'yes' if c['within_ok'] else 'NO'} "
            f"| {'yes' if c['one_order'] else 'NO'} | {result['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
