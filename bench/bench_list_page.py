"""Benchmark: the experiments list with 100 runs renders in under 1 s (issue 6's "a page with
100 experiments loads in under 1 s").

``ckptlab serve`` on a fresh SQLite database holding ``--runs`` (default 100, at most a
page) finished experiments: one real run (``ckptlab run``: a 2-layer transformer,
``per_block``, ``--timed-steps`` timed steps, default 20 as in the spec; the summary's
per-step lists grow with them) and copies of it (the browser tests' factory,
:func:`tests.frontend.support._insert_finished_experiments`, given its summary), and
Debian's headless chromium (the browser tests' flags). Each round loads the list ``#/``
four ways, interleaved (the two variants' order alternating by round): **cold**, in a new
browser context (empty HTTP cache: every module, the stylesheet and the API answers
fetched), and **warm**, a reload of that
page (modules from the cache, the API asked again); each with the page's own request
(``per_step=false``: summaries without their per-step lists) and with the whole summaries
(``per_step=true``, what the page asked for before; the page's ``fetch`` wrapped to rewrite
the request, and the other variant's wrapped the same way so both pay it). Measured in the page,
from navigation start (``performance.now()``):

- ``rows``: when ``#experiments tbody`` first holds ``--runs`` rows (a MutationObserver);
- ``api``: when the answer of ``GET /api/experiments`` had arrived (its resource timing's
  ``responseEnd``), so ``rows - api`` is the page's own work after the data came;
- ``dcl``: DOMContentLoaded (the page's HTML parsed and its module graph run).

Reported: median, min and max per variant over ``--rounds`` (default 15), the share of
rounds under the 1,000 ms target, the list answer's size, and each round's ratio of the
whole summaries' time to the page's (median and quartiles). ``--busy N`` runs N busy loops
(``while True: pass``) in other processes throughout, to see the target on a loaded host
(the CI machine runs the browser tests beside the rest of the suite, two workers on two
cores).

``--answers`` measures, in this process and without a browser, the ``per_step=false``
answer's serialisation and a sweep's answer size (see :func:`_answers`).

Usage::

    .venv/bin/python bench/bench_list_page.py [--runs 100] [--timed-steps 20] [--rounds 15] [--busy 0]
    .venv/bin/python bench/bench_list_page.py --answers [--timed-steps 1000]

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api import _free_port, start_server, stop_server  # noqa: E402

from ckptlab.settings import Settings  # noqa: E402
from tests.frontend.support import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    VIEWPORT,
    _insert_finished_experiments,
)

TARGET_MS = 1000.0
#: Runs a page of the list shows (``PAGE`` in frontend/list.js).
LIST_PAGE = 100
#: The run whose summary every listed experiment gets (its timed steps from the command line).
REAL_RUN = {
    "model": {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 100},
    "batch_size": 4,
    "device": "cpu",
    "checkpoint": {"strategy": "per_block"},
}
VARIANTS = ("per_step=false", "per_step=true")

#: Set in every page before its own scripts run: the time the table first holds N rows.
OBSERVER_JS = """
window.__rows = null;
new MutationObserver(() => {
  const body = document.querySelector('#experiments tbody');
  if (window.__rows === null && body && body.rows.length >= %d) window.__rows = performance.now();
}).observe(document, {childList: true, subtree: true});
"""

#: Read once the rows are there: rows, the list answer's arrival and DOMContentLoaded (ms),
#: and the list answer's body size (bytes, as sent).
READ_JS = """() => {
  const list = performance.getEntriesByType('resource').filter((e) => e.name.includes('/api/experiments?'));
  const nav = performance.getEntriesByType('navigation')[0];
  // The first list request is the one that filled the table (a later one is the page's poll).
  return {rows: window.__rows, api: list.length ? list[0].responseEnd : null,
          dcl: nav ? nav.domContentLoadedEventEnd : null, bytes: list.length ? list[0].encodedBodySize : null};
}"""


def _real_summary(data_dir: Path, timed_steps: int) -> str:
    """Run :data:`REAL_RUN` with ``timed_steps`` through ``ckptlab run`` into ``data_dir``'s
    database; its stored summary (JSON text)."""
    spec = data_dir / "spec.json"
    spec.write_text(json.dumps({**REAL_RUN, "timed_steps": timed_steps}))
    env = {**os.environ, "CKPTLAB_DATA_DIR": str(data_dir)}
    env.pop("CKPTLAB_DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "-m", "ckptlab.cli", "run", str(spec)], env=env, check=True, stdout=subprocess.DEVNULL
    )
    with sqlite3.connect(data_dir / "ckptlab.db") as db:
        (summary,) = db.execute("SELECT summary FROM experiments ORDER BY id DESC LIMIT 1").fetchone()
    return summary


def _fill(data_dir: Path, runs: int, summary: str) -> None:
    """``runs`` finished experiments (the browser tests' factory), each with ``summary``."""
    ids = _insert_finished_experiments(data_dir, runs)
    with sqlite3.connect(data_dir / "ckptlab.db") as db:
        db.executemany("UPDATE experiments SET summary = ? WHERE id = ?", [(summary, i) for i in ids])


#: Set before the page's scripts: its fetches with ``per_step=false`` ask for ``%s`` instead
#: (a fetch wrapper rather than Playwright's request routing, which turns the HTTP cache off).
REWRITE_JS = """
const pageFetch = window.fetch;
window.fetch = (url, opts) => pageFetch(typeof url === 'string' ? url.replace('per_step=false', '%s') : url, opts);
"""


def _load(page, url: str, runs: int, *, reload: bool) -> dict[str, float]:
    """One navigation to the list; the times in ms and the answer's bytes (see the module docstring)."""
    if reload:
        page.reload()
    else:
        page.goto(url)
    page.wait_for_function("window.__rows !== null && window.__rows !== undefined", timeout=60_000)
    got = page.evaluate(READ_JS)
    assert page.locator("#experiments tbody tr").count() >= runs
    return got


def _row(name: str, values: list[float], unit: str = "ms") -> str:
    if unit == "B":
        return f"| {name} | {statistics.median(values):,.0f} B | | | |"
    under = sum(v < TARGET_MS for v in values)
    return (
        f"| {name} | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} | {under}/{len(values)} |"
    )


def _answers(data_dir: Path, summary: str, rounds: int) -> None:
    """``--answers``: in this process, no browser. (1) The ``per_step=false`` list answer of
    the database's 100 runs written as :func:`ckptlab.backend.encoding.json_without_per_step`
    writes it against a dict then ``json.dumps`` (the default response class), process CPU
    time, interleaved over ``rounds`` rounds: medians and the per-round ratio's quartiles.
    (2) A 2 x 2 x 2 sweep (with its baselines) whose runs all carry ``summary``:
    ``GET /api/sweeps/{id}`` bytes whole and with ``per_step=false``."""
    import time

    from fastapi.testclient import TestClient

    from ckptlab.backend.app import create_app
    from ckptlab.backend.encoding import SafeJSONResponse, json_without_per_step
    from ckptlab.backend.schemas import ExperimentPublic, ExperimentsPublic
    from ckptlab.backend.services import queries
    from ckptlab.db import queue
    from ckptlab.db.database import make_engine, make_sessionmaker
    from ckptlab.domain import Status
    from ckptlab.summary import PER_STEP_FIELDS, RunSummary

    settings = Settings(data_dir=data_dir)
    engine = make_engine(settings.resolved_database_url)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        rows, count = queries.query_experiments(session, offset=0, limit=LIST_PAGE)
        page = ExperimentsPublic(data=[ExperimentPublic.model_validate(r) for r in rows], count=count)
    exclude = {"data": {"__all__": {"summary": set(PER_STEP_FIELDS)}}}
    dumps, ours = [], []
    for _ in range(rounds):
        t0 = time.process_time()
        SafeJSONResponse(page.model_dump(mode="json", exclude=exclude))
        t1 = time.process_time()
        json_without_per_step(page, "data")
        t2 = time.process_time()
        dumps.append((t1 - t0) * 1000)
        ours.append((t2 - t1) * 1000)
    q1, q2, q3 = statistics.quantiles([a / b for a, b in zip(dumps, ours, strict=True)], n=4)
    print(
        f"{len(rows)} rows, per_step=false, process CPU over {rounds} interleaved rounds: dict + json.dumps "
        f"{statistics.median(dumps):.1f} ms, json_without_per_step {statistics.median(ours):.1f} ms, "
        f"ratio {q2:.2f} [{q1:.2f}, {q3:.2f}]"
    )

    base = {"model": {"kind": "mlp", "depth": 4, "width": 32}, "batch_size": 4, "device": "cpu"}
    axes = {"checkpoint.segments": [2, 4], "amp": ["off", "bf16"], "checkpoint.preserve_rng_state": [True, False]}
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        made = client.post(
            "/api/sweeps",
            json={"name": "bench", "base": {**base, "checkpoint": {"strategy": "sequential"}}, "axes": axes},
        )
        made.raise_for_status()
        sweep = made.json()
        with sessions() as session:
            while (exp := queue.claim_next(session, worker_id="bench:1")) is not None:
                queue.finish_experiment(
                    session, experiment_id=exp.id, status=Status.SUCCEEDED, summary=RunSummary.load(json.loads(summary))
                )
        whole = len(client.get(f"/api/sweeps/{sweep['id']}").content)
        brief = len(client.get(f"/api/sweeps/{sweep['id']}", params={"per_step": "false"}).content)
    engine.dispose()
    print(
        f"a sweep of {len(sweep['experiments'])} runs: GET /api/sweeps/{{id}} {whole:,} B whole, "
        f"{brief:,} B per_step=false"
    )


def main() -> None:
    """Run the benchmark; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="finished experiments in the list")
    ap.add_argument("--timed-steps", type=int, default=20, help="timed steps of the run whose summary they carry")
    ap.add_argument("--rounds", type=int, default=15, help="cold + warm loads of each variant")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes beside the page")
    ap.add_argument("--answers", action="store_true", help="the answers' serialisation and a sweep's size, no browser")
    args = ap.parse_args()
    if not 1 <= args.runs <= LIST_PAGE:
        ap.error(f"--runs must be 1 to {LIST_PAGE}: the list shows {LIST_PAGE} runs a page")
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (quartiles of the per-round ratios)")
    if args.answers:
        with tempfile.TemporaryDirectory() as tmp:
            summary = _real_summary(Path(tmp), args.timed_steps)
            _fill(Path(tmp), args.runs - 1, summary)
            _answers(Path(tmp), summary, rounds=max(args.rounds, 41))
        return
    if not CHROMIUM.exists():
        sys.exit(f"bench_list_page: {CHROMIUM} not found (make system-deps installs Debian's chromium)")

    from playwright.sync_api import sync_playwright

    keys = ("rows", "api", "dcl", "bytes")
    times = {(v, w): {k: [] for k in keys} for v in VARIANTS for w in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        summary = _real_summary(data_dir, args.timed_steps)
        busy: list[subprocess.Popen] = []
        server = None
        try:
            busy += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            port = _free_port()
            server = start_server(Settings(data_dir=data_dir).resolved_database_url, port)
            _fill(data_dir, args.runs - 1, summary)  # with the real run: --runs in all
            url = f"http://127.0.0.1:{port}/#/"
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
                try:
                    for round_ in range(args.rounds + 1):  # the first round warms the server and the browser
                        for variant in VARIANTS[:: 1 if round_ % 2 else -1]:  # each first in half the rounds
                            context = browser.new_context(viewport=VIEWPORT)
                            context.add_init_script(OBSERVER_JS % args.runs)
                            context.add_init_script(REWRITE_JS % variant)
                            page = context.new_page()
                            cold = _load(page, url, args.runs, reload=False)
                            warm = _load(page, url, args.runs, reload=True)
                            context.close()
                            for which, got in (("cold", cold), ("warm", warm)):
                                for key in keys:
                                    times[variant, which][key].append(got[key])
                finally:
                    browser.close()
        finally:
            if server is not None:
                stop_server(server)
            for proc in busy:
                proc.kill()
                proc.wait()
    for keyed in times.values():  # drop the warm-up round
        for key in keys:
            del keyed[key][0]

    print(
        f"{args.runs} finished experiments, each with the summary of a run of {args.timed_steps} timed steps "
        f"({len(summary):,} B stored); {args.rounds} rounds, {args.busy} busy loops; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| load, from navigation start | median ms | min ms | max ms | under 1,000 ms |")
    print("|---|---:|---:|---:|---:|")
    for (variant, which), keyed in times.items():
        name = f"{which}, {variant}"
        print(_row(f"{name}: {args.runs} rows in the table", keyed["rows"]))
        print(_row(f"{name}: list answer arrived", keyed["api"]))
        print(_row(f"{name}: DOMContentLoaded", keyed["dcl"]))
        print(_row(f"{name}: rows after the answer", [r - a for r, a in zip(keyed["rows"], keyed["api"], strict=True)]))
        print(_row(f"{name}: list answer's size", keyed["bytes"], unit="B"))
    print()
    for which in ("cold", "warm"):
        ratios = [
            full / brief
            for full, brief in zip(times[VARIANTS[1], which]["rows"], times[VARIANTS[0], which]["rows"], strict=True)
        ]
        q1, q2, q3 = statistics.quantiles(ratios, n=4)
        print(f"{which}: rows time, whole summaries / no per-step lists, per round: {q2:.2f} [{q1:.2f}, {q3:.2f}]")


if __name__ == "__main__":
    main()
