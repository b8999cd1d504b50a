"""The frontend's sweep arithmetic (frontend/plan.js, run under node) against the server's.

The form shows how many experiments a sweep will queue before it is submitted; this checks
that number, the baselines, the combinations dropped as invalid and the runs merged as
duplicates against :func:`ckptlab.db.sweeps.plan_sweep` for hand-picked and random sweeps.
Also the byte sizes a user may type as a memory budget.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from ckptlab.db.sweeps import SweepError, plan_sweep

NODE = shutil.which("node") or shutil.which("nodejs")
if NODE is None:
    pytest.skip("node not found: cannot run frontend/plan.js", allow_module_level=True)

PLAN_JS = Path(__file__).resolve().parents[2] / "frontend" / "plan.js"

RUNNER = """
import { planSweep, parseBytes, parseList, validateSpec } from './plan.mjs';
let input = '';
process.stdin.on('data', (d) => { input += d; });
process.stdin.on('end', () => {
  const { sweeps, sizes, lists, specs } = JSON.parse(input);
  const out = {
    sweeps: sweeps.map(([base, axes]) => {
      const p = planSweep(base, axes, { maxSize: 1e9 });
      return {
        axisErrors: p.axisErrors.length, noValid: p.noValid, combinations: p.combinations, baselines: p.baselines,
        runs: p.runs.map((r) => ({ values: r.values, baseline: r.baseline })),
        invalid: p.invalid.map((i) => ({ values: i.values, baseline: i.baseline })),
      };
    }),
    sizes: sizes.map((s) => parseBytes(s)),
    lists: lists.map(([t, type]) => parseList(t, type)),
    specs: specs.map((s) => validateSpec(s).map((e) => e.loc)),
  };
  process.stdout.write(JSON.stringify(out));
});
"""

MLP = {"model": {"kind": "mlp", "depth": 8, "width": 64}, "batch_size": 16, "steps": 3, "device": "cpu"}

CASES: list[tuple[dict, dict]] = [
    # the browser test's sweep: 2 x 2 runs + 1 baseline
    (
        {**MLP, "checkpoint": {"strategy": "sequential"}},
        {"checkpoint.segments": [2, 4], "checkpoint.preserve_rng_state": [True, False]},
    ),
    # a non-checkpoint axis: one baseline per AMP mode
    ({**MLP, "checkpoint": {"strategy": "sequential"}}, {"checkpoint.segments": [1, 2, 4, 8], "amp": ["off", "bf16"]}),
    # segments over the depth: invalid combinations reported, the rest queued
    ({**MLP, "checkpoint": {"strategy": "sequential"}}, {"checkpoint.segments": [2, 16]}),
    # nothing valid
    ({**MLP, "checkpoint": {"strategy": "sequential"}}, {"checkpoint.segments": [16, 32]}),
    # strategy none in the axis: the same spec as its baseline, queued once
    (
        {**MLP, "checkpoint": {"strategy": "sequential", "segments": 1}},
        {"checkpoint.strategy": ["none", "sequential"], "batch_size": [16, 32]},
    ),
    # selective cannot be reentrant
    (
        {**MLP, "checkpoint": {"strategy": "selective"}},
        {"checkpoint.use_reentrant": [True, False], "checkpoint.every": [1, 2, 9]},
    ),
    # a repeated value
    (MLP, {"checkpoint.segments": [2, 2]}),
    # a base that never validates (warm-up not below steps)
    ({**MLP, "warmup_steps": 3}, {"checkpoint.segments": [1, 2]}),
    # model fields checked by the model: heads must divide d_model, image size a multiple of 4
    (
        {"model": {"kind": "transformer", "depth": 4, "d_model": 96}, "device": "cpu"},
        {"model.heads": [2, 5, 6], "checkpoint.strategy": ["per_block", "offload"]},
    ),
    (
        {"model": {"kind": "resnet", "depth": 3, "image_size": 30}},
        {"model.image_size": [30, 32], "amp": ["off", "fp16"]},
    ),
    # defaults only
    ({}, {"checkpoint.strategy": ["none", "sequential", "per_block", "selective", "offload"]}),
    # a batch size out of range
    (MLP, {"batch_size": [0, 16, 70000], "checkpoint.preserve_rng_state": [True, False]}),
]


def _random_cases(n: int, seed: int = 7) -> list[tuple[dict, dict]]:
    rng = random.Random(seed)
    pools = {
        "checkpoint.strategy": ["none", "sequential", "per_block", "selective", "offload"],
        "checkpoint.segments": [1, 2, 3, 4, 8, 12],
        "checkpoint.every": [1, 2, 4, 10],
        "checkpoint.preserve_rng_state": [True, False],
        "checkpoint.use_reentrant": [True, False],
        "amp": ["off", "fp16", "bf16"],
        "batch_size": [8, 16, 32],
        "model.depth": [4, 8],
    }
    cases = []
    for _ in range(n):
        base = {
            "model": {"kind": "mlp", "depth": rng.choice([4, 8]), "width": 32, "dropout": rng.choice([0.0, 0.1])},
            "steps": 3,
            "device": "cpu",
            "checkpoint": {
                "strategy": rng.choice(pools["checkpoint.strategy"]),
                "segments": rng.choice([1, 2, 6]),
                "use_reentrant": rng.choice([True, False]),
            },
        }
        axes = {
            p: rng.sample(pools[p], rng.randint(1, min(3, len(pools[p]))))
            for p in rng.sample(list(pools), rng.randint(1, 4))
        }
        cases.append((base, axes))
    return cases


def _run_node(tmp_path: Path, payload: dict) -> dict:
    shutil.copy(PLAN_JS, tmp_path / "plan.mjs")
    (tmp_path / "runner.mjs").write_text(RUNNER)
    proc = subprocess.run(
        [NODE, str(tmp_path / "runner.mjs")], input=json.dumps(payload), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_run_count_matches_the_server(tmp_path: Path) -> None:
    cases = CASES + _random_cases(150)
    out = _run_node(tmp_path, {"sweeps": cases, "sizes": [], "lists": [], "specs": []})["sweeps"]
    for (base, axes), js in zip(cases, out, strict=True):
        where = f"base={base} axes={axes}"
        try:
            plan = plan_sweep(base, axes, max_size=10**9)
        except SweepError as exc:
            kinds = {e["type"] for e in exc.errors}
            if "duplicate_value" in kinds:
                assert js["axisErrors"], where
            else:
                assert kinds == {"no_valid_combination"}, (where, exc.errors)
                assert js["noValid"] and not js["axisErrors"], where
            continue
        assert not js["axisErrors"] and not js["noValid"], where
        assert js["combinations"] == plan.combinations, where
        assert [(r["values"], r["baseline"]) for r in js["runs"]] == [(r.values, r.baseline) for r in plan.runs], where
        assert [(i["values"], i["baseline"]) for i in js["invalid"]] == [
            (i["values"], i["baseline"]) for i in plan.invalid
        ], where


def test_budget_sizes_and_lists(tmp_path: Path) -> None:
    sizes = [
        "800000",
        "2 GiB",
        "2GiB",
        "512 MiB",
        "1.5G",
        "24g",
        "100 KB",
        "3 MB",
        "1 kib",
        " 7 ",
        "",
        "abc",
        "2 GiBs",
        "-1",
    ]
    lists = [["1,2,4,8", "int"], ["1 2  4", "int"], ["2,x", "int"], ["2,2", "int"], ["1.5", "int"], ["", "int"]]
    out = _run_node(tmp_path, {"sweeps": [], "sizes": sizes, "lists": lists, "specs": []})
    gib, mib = 1024**3, 1024**2
    assert out["sizes"] == [
        800000,
        2 * gib,
        2 * gib,
        512 * mib,
        round(1.5 * gib),
        24 * gib,
        100_000,
        3_000_000,
        1024,
        7,
        None,
        None,
        None,
        None,
    ]
    values = [(r["values"], r["error"] is None) for r in out["lists"]]
    assert values[0] == ([1, 2, 4, 8], True)
    assert values[1] == ([1, 2, 4], True)
    assert [ok for _, ok in values[2:]] == [False, False, False, False]
    assert "repeats" in out["lists"][3]["error"]


def test_field_errors_name_the_field_as_the_server_does(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from ckptlab.spec import ExperimentSpec

    specs = [
        {**MLP, "checkpoint": {"strategy": "sequential", "segments": 9}},
        {**MLP, "model": {"kind": "mlp", "depth": 8, "width": 0}},
        {**MLP, "warmup_steps": 5},
        {"model": {"kind": "transformer", "d_model": 100, "heads": 3}},
        {"model": {"kind": "resnet", "image_size": 30}},
        {**MLP, "checkpoint": {"strategy": "selective", "use_reentrant": True}},
        {**MLP, "amp": "fp8"},
        {**MLP, "timeout_s": 0},
        MLP,
    ]
    out = _run_node(tmp_path, {"sweeps": [], "sizes": [], "lists": [], "specs": specs})["specs"]
    for spec, locs in zip(specs, out, strict=True):
        try:
            ExperimentSpec.model_validate(spec)
            expected = []
        except ValidationError as exc:
            # pydantic puts the union tag in model locations: ["model", "mlp", "width"]
            expected = [
                [p for i, p in enumerate(e["loc"]) if not (i == 1 and e["loc"][0] == "model" and len(e["loc"]) > 2)]
                for e in exc.errors()
            ]
        assert locs == expected, spec
