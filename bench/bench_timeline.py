"""Benchmark of the memory timeline (issue 34): storing and reading a 1,000,000-event step,
and what recording costs the memory pass.

Run from the repository root::

    .venv/bin/python bench/bench_timeline.py [--events 1000000] [--cold 7] [--rounds 10] [--json]

1. **Store.** A synthetic step of ``--events`` allocations and frees (:func:`synthetic`:
   blocks of log-normal sizes around 64 kB, most freed after a random lifetime, 2.5% kept
   to the end, 400 modules, 60 ops, forward / backward / optimizer phases, recomputation
   spans) encoded as the worker stores it (:func:`ckptlab.worker.service.outcome.timeline_row`)
   and written with a run's outcome (:func:`ckptlab.db.queue.finish_experiment`) into a fresh
   SQLite database (WAL), each timed.
2. **Cold read.** A fresh Python process per sample (new database connection, nothing
   cached; imports done before the clock starts): the time of
   ``GET /api/experiments/{id}/timeline?max_points=2000`` through the app
   (``fastapi.testclient``: the row read, the blob decompressed and decoded, the live
   bytes, MinMaxLTTB with the exact peak kept, the per-category levels, the response's
   JSON), and of ``GET /api/experiments/{id}/peak-holders``.
3. **Recording cost.** The memory pass of each configuration of :data:`CONFIGS` as a run
   makes it (at most ``--steps`` steps, one warm-up, ending once two steps read the same
   bytes: the spec's ``memory_early_stop``; recording the steps
   :meth:`ckptlab.worker.engine.timeline.TimelineKeeper.wants`), with recording on and off,
   paired and interleaved: each round builds
   the model twice and times one memory pass with recording and one without, in
   alternating order (on first in even rounds); the cost is the median over rounds of
   ``on / off - 1`` with its bootstrap 95% CI (:func:`ckptlab.analysis.stats.paired_ratio_ci`)
   and the rounds' min and max; the process's CPU time, on one torch thread (as the timing
   pass: steadier on a busy host than wall time). The timing pass is not measured: recording never runs in
   it (``tests/worker/engine/test_timeline.py`` checks that no hook is left for it).

Prints a Markdown table (or JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptlab.analysis.stats import paired_ratio_ci  # noqa: E402
from ckptlab.analysis.timeline import RECOMPUTED, RESIDENT, SAVED, StepTimeline  # noqa: E402
from ckptlab.domain import MemoryCategory  # noqa: E402

#: Configurations of the recording-cost measurement (a spec's fields): a small transformer
#: per block (from bench_overhead), a small Hugging Face llama without checkpointing, and the
#: tests' tiny transformer (tests/factories.py: its steps take milliseconds, so the recorder's
#: fixed cost per step shows most there).
CONFIGS = {
    "transformer-4x256-seq128-per_block": {
        "model": {"kind": "transformer", "depth": 4, "d_model": 256, "heads": 4, "seq_len": 128, "vocab_size": 2000},
        "batch_size": 8,
        "checkpoint": {"strategy": "per_block"},
    },
    "hf-llama-4x256-seq128-none": {
        "model": {
            "kind": "hf",
            "architecture": "llama",
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 688,
            "vocab_size": 2000,
            "seq_len": 128,
        },
        "batch_size": 8,
        "checkpoint": {"strategy": "none"},
    },
    "tiny-transformer-2x32-seq16-per_block (tests)": {
        "model": {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 100},
        "batch_size": 16,
        "checkpoint": {"strategy": "per_block"},
    },
}


def synthetic(n_events: int, seed: int = 0) -> StepTimeline:
    """A step of exactly ``n_events`` events (see the module docstring), deterministic."""
    rng = np.random.default_rng(seed)
    kept = n_events // 40
    made = (n_events + kept) // 2
    kept = 2 * made - n_events  # made + (made - kept) == n_events
    n_resident = 300
    born = np.sort(rng.random(made))
    dies = born + rng.exponential(0.002, made)
    survivors = rng.choice(made, kept, replace=False)
    dies[survivors] = np.inf
    dies[dies >= 1.0] = np.inf
    too_many = int(np.isinf(dies).sum()) - kept  # lifetimes past the end: freed at the end instead
    late = np.flatnonzero(np.isinf(dies))
    dies[rng.choice(np.setdiff1d(late, survivors), too_many, replace=False)] = 1.0
    ids = np.arange(n_resident, n_resident + made, dtype=np.int64)
    freed = np.isfinite(dies)
    keys = np.concatenate([born, dies[freed]])
    codes = np.concatenate([ids, ~ids[freed]])
    events = codes[np.argsort(keys, kind="stable")].astype(np.int32)
    n_blocks = n_resident + made
    cats = [c.value for c in MemoryCategory]
    category = rng.choice(len(cats), n_blocks, p=_category_shares(cats)).astype(np.uint8)
    flags = np.where(rng.random(n_blocks) < 0.4, SAVED, 0) | np.where(rng.random(n_blocks) < 0.1, RECOMPUTED, 0)
    flags[:n_resident] |= RESIDENT
    third = n_events // 3
    return StepTimeline(
        step=2,
        events=events,
        nbytes=np.maximum(rng.lognormal(np.log(65536), 1.0, n_blocks).astype(np.int64) // 64 * 64, 64),
        category=category,
        module=rng.integers(0, 400, n_blocks, dtype=np.int32),
        op=rng.integers(0, 60, n_blocks, dtype=np.int32),
        region=np.where(rng.random(n_blocks) < 0.5, rng.integers(0, 24, n_blocks), -1).astype(np.int32),
        flags=flags.astype(np.uint8),
        categories=cats,
        modules=[f"model.layers.{i // 16}.mlp.{i % 16}" for i in range(400)],
        ops=[f"aten.op_{i}.default" for i in range(60)],
        regions=[f"model.layers.{i}" for i in range(24)],
        phases=[(0, "forward"), (third, "backward"), (3 * third - 1000, "optimizer")],
        recompute_spans=[(third + k * 10_000, third + k * 10_000 + 4_000) for k in range(20)],
        n_resident=n_resident,
    )


def _category_shares(cats: list[str]) -> list[float]:
    shares = {MemoryCategory.ACTIVATIONS.value: 0.7, MemoryCategory.OTHER.value: 0.2}
    rest = (1 - sum(shares.values())) / (len(cats) - len(shares))
    return [shares.get(c, rest) for c in cats]


def bench_store(n_events: int, db: Path) -> dict:
    """Encode a synthetic step and store it with a run's outcome; returns ms and sizes."""
    from ckptlab.db import queue, store
    from ckptlab.db.database import make_engine, make_sessionmaker, migrate
    from ckptlab.domain import Status
    from ckptlab.spec.experiment import ExperimentSpec
    from ckptlab.worker.service.outcome import timeline_row

    tl = synthetic(n_events)
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    with Session() as s:
        spec = ExperimentSpec.model_validate({"model": {"kind": "mlp"}, "device": "cpu"})
        exp_id = store.create_experiment(s, spec=spec).id
        claimed = queue.claim_next(s, worker_id="bench")
        t0 = time.perf_counter()
        row = timeline_row(tl, True)
        t1 = time.perf_counter()
        queue.finish_experiment(
            s, experiment_id=exp_id, attempt=claimed.attempt, status=Status.SUCCEEDED, timelines=[row]
        )
        t2 = time.perf_counter()
    engine.dispose()
    return {
        "url": url,
        "experiment_id": exp_id,
        "events": tl.n_events,
        "blocks": len(tl.nbytes),
        "peak_bytes": row["peak_bytes"],
        "blob_bytes": len(row["data"]),
        "encode_ms": (t1 - t0) * 1e3,
        "insert_ms": (t2 - t1) * 1e3,
    }


_COLD = """
import json, sys, time
from fastapi.testclient import TestClient
from ckptlab.backend.app import create_app
from ckptlab.settings import Settings
url, exp_id, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "warm"
with TestClient(create_app(Settings(database_url=url, allowed_hosts=["testserver"]))) as c:
    if warm:  # the app's own first-request work (its OpenAPI document, the ORM's mappers)
        assert c.get(f"/api/experiments/{exp_id}").status_code == 200
    t0 = time.perf_counter()
    r = c.get(f"/api/experiments/{exp_id}/timeline", params={"max_points": 2000})
    t1 = time.perf_counter()
    h = c.get(f"/api/experiments/{exp_id}/peak-holders")
    t2 = time.perf_counter()
    body = r.json()
    assert r.status_code == 200 and h.status_code == 200, (r.text[:300], h.text[:300])
    print(json.dumps({"timeline_ms": (t1 - t0) * 1e3, "holders_ms": (t2 - t1) * 1e3,
                      "points": len(body["t_index"]), "peak": body["peak_bytes"], "max": max(body["live_bytes"]),
                      "holders_sum": sum(x["bytes"] for x in h.json()["holders"]) + h.json()["others_bytes"]}))
"""


def bench_cold(url: str, exp_id: int, samples: int, warm: bool) -> dict:
    """Cold reads, one fresh process per sample; medians and spreads in ms. ``warm``: the app
    has served one other request of the run first (``GET /api/experiments/{id}``: the app's
    first-request work, its OpenAPI document and the ORM's mappers, is done); else the
    timeline is the process's first request."""
    out = []
    for _ in range(samples):
        res = subprocess.run(
            [sys.executable, "-c", _COLD, url, str(exp_id), "warm" if warm else "first"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert all(o["peak"] == o["max"] == o["holders_sum"] for o in out), out[0]
    return {
        key: {
            "median": statistics.median(o[key] for o in out),
            "min": min(o[key] for o in out),
            "max": max(o[key] for o in out),
        }
        for key in ("timeline_ms", "holders_ms")
    } | {"points": out[0]["points"]}


def _memory_pass_ms(spec, record: bool, around=None) -> tuple[float, int, int]:
    """One memory pass of ``spec`` with recording on or off: its ms, the peak step's events
    and the steps it ran. ``around``: called with the pass (a function of no arguments) to
    run it (:func:`_in_ffi_call`), instead of calling it."""
    import torch

    from ckptlab.settings import get_settings
    from ckptlab.strategies import get_strategy
    from ckptlab.worker.engine.context import RunContext
    from ckptlab.worker.measure.meter import Meter

    os.environ["CKPTLAB_RECORD_TIMELINE"] = "1" if record else "0"
    get_settings.cache_clear()
    get_settings()  # made here, not inside the timed pass: a run reads the process's cached settings
    dev = torch.device("cpu")
    meter = Meter(dev, None)
    run = RunContext(spec, get_strategy(spec.checkpoint.strategy), dev, meter, {"phase": "setup", "step": 0}, None)
    with meter.mode():
        run.build(None)
        t0 = time.process_time()  # CPU time: steadier than wall time on a busy host
        run.memory_pass() if around is None else around(run.memory_pass)
        elapsed = (time.process_time() - t0) * 1e3
    events = max((tl.n_events for tl, _ in run.timelines), default=0)
    return elapsed, events, len(run.records)


def bench_recording(name: str, cfg: dict, rounds: int, steps: int, threads: int = 1) -> dict:
    """The memory pass's extra time with recording on, paired and interleaved (see above), on
    ``threads`` torch threads (default 1, as the timing pass: steadier on a busy host)."""
    from ckptlab.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({**cfg, "steps": steps, "warmup_steps": 1, "device": "cpu", "seed": 0})
    import torch

    on, off, events, steps_run = [], [], 0, 0
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _memory_pass_ms(spec, True)  # warm-up: first calls, imports
        for i in range(rounds):
            for record in (True, False) if i % 2 == 0 else (False, True):
                ms, n, steps_run = _memory_pass_ms(spec, record)
                (on if record else off).append(ms)
                events = max(events, n)
    finally:
        torch.set_num_threads(before)
    ci = paired_ratio_ci(off, on)
    ratios = [100 * (a / b - 1) for a, b in zip(on, off, strict=True)]
    return {
        "config": name,
        "steps": steps_run,
        "events_per_step": events,
        "off_ms": statistics.median(off),
        "on_ms": statistics.median(on),
        "extra_pct": ci.estimate_pct,
        "ci_low_pct": ci.low_pct,
        "ci_high_pct": ci.high_pct,
        "rounds_min_pct": min(ratios),
        "rounds_max_pct": max(ratios),
        "rounds": rounds,
        "threads": threads,
    }


def _passes_only(cfg: dict, passes: int, record: bool, steps: int, callgrind: bool = False) -> None:
    """Two warm-up memory passes of ``cfg`` (recording on, then off), then ``passes`` with
    ``record``, on one torch thread: what an instruction counter compares. ``callgrind``:
    after the warm-up, turn callgrind's instrumentation on (``callgrind_control -i on``: run
    valgrind with ``--instr-atstart=no``, the imports then run uninstrumented, about five
    times faster) and run each pass inside a C call (:func:`_in_ffi_call`: with
    ``--toggle-collect=ffi_call`` only the passes are counted, not the models' builds)."""
    import torch

    from ckptlab.spec.experiment import ExperimentSpec

    spec = ExperimentSpec.model_validate({**cfg, "steps": steps, "warmup_steps": 1, "device": "cpu", "seed": 0})
    torch.set_num_threads(1)
    _memory_pass_ms(spec, True)
    _memory_pass_ms(spec, False)
    if callgrind:
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True)  # (prints "OK.")
    for _ in range(passes):
        _memory_pass_ms(spec, record, around=_in_ffi_call if callgrind else None)


def _in_ffi_call(fn) -> None:
    """Run ``fn()`` as the comparison callback of one libc ``lfind`` over one element, called
    through ``ctypes``: inside ``ffi_call``, which valgrind's ``--toggle-collect`` can name
    (a Python function has no C symbol of its own)."""
    import ctypes

    libc = ctypes.CDLL(None)
    compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    libc.lfind.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        compare_type,
    ]
    libc.lfind.restype = ctypes.c_void_p
    raised: list[BaseException] = []

    def compare(_a, _b) -> int:
        try:
            fn()
        except BaseException as e:  # (a callback's exception would be printed and lost)
            raised.append(e)
        return 0

    callback = compare_type(compare)
    key, items, count = ctypes.c_int(0), (ctypes.c_int * 1)(0), ctypes.c_size_t(1)
    libc.lfind(ctypes.byref(key), items, ctypes.byref(count), ctypes.sizeof(ctypes.c_int), callback)
    if raised:
        raise raised[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--cold", type=int, default=7, help="cold-read samples (fresh processes)")
    ap.add_argument("--rounds", type=int, default=10, help="paired rounds of the recording cost (0: not measured)")
    ap.add_argument(
        "--steps",
        type=int,
        default=5,
        help="memory-pass steps per round, at most (the spec's default: flat memory stops early)",
    )
    ap.add_argument("--configs", help="comma-separated names of CONFIGS (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--passes",
        type=int,
        help="only run memory passes of the first config, for an instruction counter: two "
        "warm-up passes (recording on, then off), then this many with --record; run it under "
        "`valgrind --tool=callgrind` once per --record and divide the totals' difference by it",
    )
    ap.add_argument("--record", choices=("on", "off"), default="on")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="with --passes: count only the passes after the warm-up (run valgrind with "
        "--instr-atstart=no --toggle-collect=ffi_call; see _passes_only)",
    )
    args = ap.parse_args()
    from ckptlab.worker.measure.heap import keep_freed_heap

    keep_freed_heap()  # as run_experiment does before its passes
    names = args.configs.split(",") if args.configs else list(CONFIGS)
    if args.callgrind and args.passes is None:
        ap.error("--callgrind counts the passes of --passes: give --passes too")
    if args.passes is not None:
        _passes_only(CONFIGS[names[0]], args.passes, args.record == "on", args.steps, args.callgrind)
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ckptlab-bench-timeline-") as tmp:
        stored = bench_store(args.events, Path(tmp) / "ckptlab.db")
        cold = bench_cold(stored["url"], stored["experiment_id"], args.cold, warm=True)
        first = bench_cold(stored["url"], stored["experiment_id"], args.cold, warm=False)
    recording = [bench_recording(n, CONFIGS[n], args.rounds, args.steps) for n in names] if args.rounds else []
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}",
        "store": {k: v for k, v in stored.items() if k != "url"},
        "cold": cold,
        "first_request": first,
        "recording": recording,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}")
    s = stored
    print("| what | result |\n| --- | --- |")
    print(
        f"| store a {s['events']:,}-event step ({s['blocks']:,} blocks) | encode {s['encode_ms']:.0f} ms + "
        f"insert {s['insert_ms']:.0f} ms; blob {s['blob_bytes'] / 2**20:.1f} MiB |"
    )
    rows = (
        (cold, "timeline_ms", f"timeline, max_points 2000 ({cold['points']} points)"),
        (cold, "holders_ms", "peak holders"),
        (first, "timeline_ms", "timeline as the process's first request (with the app's first-request work)"),
    )
    for result_of, key, what in rows:
        c = result_of[key]
        print(
            f"| cold read: {what} | {c['median']:.0f} ms (min {c['min']:.0f}, max {c['max']:.0f}; "
            f"{args.cold} processes) |"
        )
    for r in recording:
        print(
            f"| memory pass, recording on vs off: {r['config']} ({r['events_per_step']:,} events/step, "
            f"{r['steps']} steps run) | {r['extra_pct']:+.1f}% "
            f"(95% CI {r['ci_low_pct']:+.1f}..{r['ci_high_pct']:+.1f}; "
            f"rounds {r['rounds_min_pct']:+.1f}..{r['rounds_max_pct']:+.1f}; {r['off_ms']:.0f} -> {r['on_ms']:.0f} ms, "
            f"{r['rounds']} rounds) |"
        )


if __name__ == "__main__":
    main()
