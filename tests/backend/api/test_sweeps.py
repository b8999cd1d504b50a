"""Sweeps: expansion over dotted spec paths with none baselines, invalid combinations
reported, 422 for unknown axes / oversize / nothing valid, progress, cancel, and a 2x2x2
sweep run to completion by a real worker with its charts, results and stream."""

from __future__ import annotations

import csv
import io
import itertools
import re
import statistics

import pytest

from ckptlab.db import queue
from ckptlab.spec.sweeps import SweepError, axis_label, plan_sweep, unknown_axis_error
from ckptlab.summary import PER_STEP_FIELDS, RunSummary
from tests.factories import hf_model, spec_dict
from tests.support import wait_for

SEQ = spec_dict(**{"checkpoint.strategy": "sequential"})


def test_plan_expands_the_product_and_adds_a_baseline_per_non_checkpoint_combination():
    axes = {
        "checkpoint.segments": [1, 2, 4, 8],
        "checkpoint.preserve_rng_state": [True, False],
        "amp": ["off", "bf16"],
    }
    plan = plan_sweep(SEQ, axes)
    assert plan.combinations == 16 and plan.invalid == []
    baselines = [r for r in plan.runs if r.baseline and not r.repeat]
    runs = [r for r in plan.runs if not r.baseline]
    assert plan.runs[:2] == baselines  # baselines are queued first
    assert [(b.spec.checkpoint.strategy, b.spec.amp) for b in baselines] == [("none", "off"), ("none", "bf16")]
    assert len(runs) == 16
    # ... and again last, so that a drift of the machine's speed during the sweep shows.
    repeats = plan.runs[-2:]
    assert all(r.repeat and r.baseline for r in repeats) and plan.repeats == 2
    assert [r.spec for r in repeats] == [b.spec for b in baselines]
    assert len(plan.runs) == 16 + 2 + 2
    got = {(r.spec.checkpoint.segments, r.spec.checkpoint.preserve_rng_state, r.spec.amp) for r in runs}
    assert got == set(itertools.product([1, 2, 4, 8], [True, False], ["off", "bf16"]))
    assert all(r.spec.checkpoint.strategy == "sequential" and r.spec.model.depth == 8 for r in runs)


def test_a_sweep_over_world_sizes_gives_each_size_its_baseline():
    base = {**SEQ, "distributed": {"kind": "fsdp2", "world_size": 2}}
    plan = plan_sweep(base, {"distributed.world_size": [2, 4], "checkpoint.segments": [2]})
    firsts = [r for r in plan.runs if not r.repeat]
    assert plan.invalid == [] and len(firsts) == 4  # a none baseline and a sequential run per world size
    assert sorted({r.spec.distributed.world_size for r in firsts if r.baseline}) == [2, 4]
    assert axis_label({"distributed.world_size": 4, "distributed.kind": "fsdp2"}) == "ranks=4 sharding=fsdp2"
    kinds = plan_sweep({**SEQ, "distributed": {"kind": "none"}}, {"distributed.kind": ["none", "ddp"]})
    assert kinds.invalid == [] and {r.spec.distributed.kind for r in kinds.runs} == {"none", "ddp"}


def test_plan_reports_invalid_combinations_instead_of_dropping_them():
    plan = plan_sweep(SEQ, {"checkpoint.segments": [4, 16], "model.depth": [8, 32]})
    assert len(plan.invalid) == 1
    bad = plan.invalid[0]
    assert bad["values"] == {"checkpoint.segments": 16, "model.depth": 8} and bad["baseline"] is False
    assert bad["errors"][0]["loc"] == ["checkpoint", "segments"]
    runs = [r for r in plan.runs if not r.baseline]
    assert len(runs) == 3 and sum(r.baseline and not r.repeat for r in plan.runs) == 2  # a baseline per depth


def test_plan_does_not_duplicate_a_run_that_is_its_own_baseline():
    plan = plan_sweep(SEQ, {"checkpoint.strategy": ["none", "sequential"], "batch_size": [4, 8]})
    firsts = [r for r in plan.runs if not r.repeat]
    assert len(firsts) == 4  # 2 baselines (= the 'none' runs) + 2 sequential
    assert sorted(r.spec.checkpoint.strategy for r in firsts) == ["none", "none", "sequential", "sequential"]
    assert plan.repeats == 2


def test_a_sweep_of_baselines_only_repeats_nothing():
    plan = plan_sweep(SEQ, {"checkpoint.strategy": ["none"], "batch_size": [4, 8]})
    assert len(plan.runs) == 2 and plan.repeats == 0


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("checkpoint.segments", True),
        ("model.width", True),
        ("model.options.alpha", False),  # options belongs to custom models only
        ("checkpoint.segmnts", False),
        ("amp.level", False),
        ("model.channels", False),  # a resnet field; the base is an mlp
    ],
)
def test_axis_paths_are_resolved_against_the_spec(path, ok):
    assert (unknown_axis_error(path, kinds={"mlp"}) is None) is ok


def test_a_sweep_over_an_hf_config_field_plans_one_run_per_value():
    base = spec_dict(model=hf_model("llama"), **{"checkpoint.strategy": "per_block"})
    plan = plan_sweep(base, {"model.num_hidden_layers": [2, 4], "model.attn_implementation": ["sdpa", "eager"]})
    runs = [r for r in plan.runs if not r.baseline]
    assert plan.invalid == [] and len(runs) == 4
    assert {(r.spec.model.depth, r.spec.model.attn_implementation) for r in runs} == set(
        itertools.product([2, 4], ["sdpa", "eager"])
    )
    # A field of another architecture is an invalid combination naming it, not a silent default.
    with pytest.raises(SweepError) as exc:
        plan_sweep(base, {"model.window_size": [4, 7]})
    assert "window_size" in exc.value.errors[0]["loc"][-1] and "unknown field for hf 'llama'" in str(exc.value)
    assert unknown_axis_error("model.hidden_sizee", kinds={"hf"}) is not None


def test_plan_errors():
    with pytest.raises(SweepError) as exc:
        plan_sweep(SEQ, {"checkpoint.segmnts": [1, 2]})
    assert exc.value.errors[0]["loc"] == ["axes", "checkpoint.segmnts"]
    with pytest.raises(SweepError) as exc:
        plan_sweep(SEQ, {"checkpoint.segments": [1, 2, 3], "batch_size": [1, 2, 3, 4]}, max_size=19)
    assert "limit of 19" in exc.value.errors[0]["msg"]  # 12 runs + 4 baselines, each twice
    assert len(plan_sweep(SEQ, {"checkpoint.segments": [1, 2, 3], "batch_size": [1, 2, 3, 4]}, max_size=20).runs) == 20
    with pytest.raises(SweepError) as exc:
        plan_sweep(SEQ, {"checkpoint.segments": [9, 10]})
    assert exc.value.errors[0]["loc"] == ["axes", "checkpoint.segments"]
    with pytest.raises(SweepError):
        plan_sweep(SEQ, {"checkpoint.segments": [2, 2]})


def sweep_body(**axes):
    return {"name": "test sweep", "base": SEQ, "axes": axes}


def test_create_and_read_a_sweep(client):
    r = client.post("/api/sweeps", json=sweep_body(**{"checkpoint.segments": [2, 4, 16], "amp": ["off", "bf16"]}))
    assert r.status_code == 201, r.text
    sweep = r.json()
    assert len(sweep["invalid"]) == 2 and {i["values"]["checkpoint.segments"] for i in sweep["invalid"]} == {16}
    assert sweep["progress"] == {
        "total": 8,
        "finished": 0,
        "counts": {
            "queued": 8,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "oom": 0,
            "timed_out": 0,
            "cancelled": 0,
        },
        "elapsed_s": None,  # no run started: no estimate yet
        "eta_s": None,
        "eta_text": "",
    }
    roles = [e["role"] for e in sweep["experiments"]]
    assert roles.count("baseline") == 4 and roles.count("run") == 4  # each baseline twice
    run = next(e for e in sweep["experiments"] if e["values"] == {"checkpoint.segments": 4, "amp": "bf16"})
    base = next(e for e in sweep["experiments"] if e["id"] == run["baseline_id"])
    assert base["role"] == "baseline" and base["values"] == {"checkpoint.segments": None, "amp": "bf16"}
    for e in sweep["experiments"]:
        assert client.get(f"/api/experiments/{e['id']}").json()["sweep_id"] == sweep["id"]
    assert client.get(f"/api/sweeps/{sweep['id']}").json() == sweep
    listing = client.get("/api/sweeps").json()
    assert listing["count"] == 1 and listing["data"][0]["progress"]["total"] == 8


def test_a_sweep_without_per_step_lists_is_the_whole_sweep_less_those_keys(client, db_session):
    sweep = client.post("/api/sweeps", json=sweep_body(**{"checkpoint.segments": [2, 4]})).json()
    timed = [2.0 + i / 100 for i in range(500)]
    for _ in sweep["experiments"][:2]:
        exp = queue.claim_next(db_session, worker_id="test:1")
        summary = {"activation_bytes": exp.id, "paired_with": "none", **{name: timed for name in PER_STEP_FIELDS}}
        queue.finish_experiment(
            db_session, experiment_id=exp.id, status="succeeded", summary=RunSummary.model_validate(summary)
        )
    whole = client.get(f"/api/sweeps/{sweep['id']}").json()
    brief = client.get(f"/api/sweeps/{sweep['id']}", params={"per_step": "false"})
    assert brief.status_code == 200 and brief.headers["content-type"] == "application/json"
    finished = [e for e in whole["experiments"] if e["summary"]]
    assert len(finished) == 2 and all(e["summary"]["step_cpu_ms"] == timed for e in finished)
    for e in finished:
        for name in PER_STEP_FIELDS:
            del e["summary"][name]
    brief = brief.json()
    assert brief.pop("progress")["counts"] == whole.pop("progress")["counts"]  # elapsed_s moves on
    assert brief == whole
    r = client.get(f"/api/sweeps/{sweep['id']}", params={"per_step": "some"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "per_step"]


@pytest.mark.parametrize(
    ("axes", "loc"),
    [
        ({"checkpoint.segmnts": [1, 2]}, ["body", "axes", "checkpoint.segmnts"]),
        ({"model.channels": [4, 8]}, ["body", "axes", "model.channels"]),
        ({"checkpoint.segments": [9, 16]}, ["body", "axes", "checkpoint.segments"]),
        ({"checkpoint.segments": []}, ["body", "axes", "checkpoint.segments"]),
        ({"bad path!": [1]}, ["body", "axes", "bad path!", "[key]"]),
        ({}, ["body", "axes"]),
    ],
)
def test_bad_sweeps_get_422_naming_the_axis_and_store_nothing(client, axes, loc):
    r = client.post("/api/sweeps", json=sweep_body(**axes))
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]]
    assert client.get("/api/sweeps").json()["count"] == 0
    assert client.get("/api/experiments").json()["count"] == 0


def test_a_dry_run_returns_the_plan_and_stores_nothing(client):
    body = sweep_body(**{"checkpoint.segments": [1, 2, 16], "amp": ["off", "bf16"]})
    r = client.post("/api/sweeps?dry_run=true", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert (plan["combinations"], plan["baselines"]) == (6, 2)
    # segments=16 is over depth 8: invalid, not queued; the dry run counts what creation queues
    assert {i["values"]["checkpoint.segments"] for i in plan["invalid"]} == {16}
    assert plan["total"] == len(plan["runs"]) == 8 and plan["repeats"] == 2
    assert [r["baseline"] for r in plan["runs"]].count(True) == 4
    assert [r["repeat"] for r in plan["runs"]] == [False] * 6 + [True] * 2
    assert all(r["spec"]["checkpoint"]["strategy"] in ("none", "sequential") for r in plan["runs"])
    assert client.get("/api/sweeps").json()["count"] == 0
    assert client.get("/api/experiments").json()["count"] == 0
    created = client.post("/api/sweeps", json=body).json()
    assert created["progress"]["total"] == plan["total"]


def test_a_dry_run_counts_a_run_equal_to_its_baseline_once(client):
    body = sweep_body(**{"checkpoint.strategy": ["none", "sequential"]})
    plan = client.post("/api/sweeps?dry_run=true", json=body).json()
    assert (plan["total"], plan["duplicates"], plan["repeats"]) == (3, 1, 1)


def test_a_dry_run_of_a_bad_sweep_is_the_same_422(client):
    r = client.post("/api/sweeps?dry_run=true", json=sweep_body(**{"checkpoint.segmnts": [1]}))
    assert r.status_code == 422 and ["body", "axes", "checkpoint.segmnts"] in [e["loc"] for e in r.json()["detail"]]


def test_sweep_size_limit_comes_from_settings(make_client):
    c = make_client(max_sweep_size=5)
    r = c.post("/api/sweeps", json=sweep_body(**{"checkpoint.segments": [1, 2, 4], "amp": ["off", "bf16"]}))
    assert r.status_code == 422 and "limit of 5" in r.json()["detail"][0]["msg"]
    assert c.post("/api/sweeps", json=sweep_body(**{"checkpoint.segments": [1, 2, 4]})).status_code == 201


def test_unknown_fields_in_a_sweep_are_rejected(client):
    r = client.post("/api/sweeps", json={**sweep_body(amp=["off"]), "extra": 1})
    assert r.status_code == 422 and ["body", "extra"] in [e["loc"] for e in r.json()["detail"]]
    bad_base = {"name": "x", "base": {**SEQ, "batchsize": 4}, "axes": {"amp": ["off"]}}
    r = client.post("/api/sweeps", json=bad_base)
    assert r.status_code == 422 and ["body", "base", "batchsize"] in [e["loc"] for e in r.json()["detail"]]


def test_cancel_a_sweep(client, db_session):
    sweep = client.post("/api/sweeps", json=sweep_body(**{"checkpoint.segments": [2, 4]})).json()
    queue.claim_next(db_session, worker_id="test:1")  # the baseline is running
    r = client.post(f"/api/sweeps/{sweep['id']}/cancel")
    assert r.status_code == 200
    body = r.json()
    assert body["cancelled"] is True
    # 2 runs and the baseline's second run cancelled
    assert body["progress"]["counts"]["cancelled"] == 3 and body["progress"]["counts"]["running"] == 1
    assert client.post("/api/sweeps/999/cancel").status_code == 404
    assert client.get("/api/sweeps/999").status_code == 404


@pytest.mark.slow
def test_worker_runs_a_2x2x2_sweep_and_its_charts_hold_the_expected_traces(client, worker_process):
    from tests.backend.conftest import parse_sse

    axes = {
        "checkpoint.segments": [2, 4],
        "checkpoint.preserve_rng_state": [True, False],
        "amp": ["off", "bf16"],
    }
    r = client.post("/api/sweeps", json=sweep_body(**axes))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]

    def finished():
        s = client.get(f"/api/sweeps/{sid}").json()
        return s if s["progress"]["finished"] == s["progress"]["total"] else None

    sweep = wait_for(finished, timeout=240, interval=0.5)
    # 8 runs and 2 baselines, each baseline twice (first and last)
    assert sweep["progress"]["counts"]["succeeded"] == 12, [(e["label"], e["error"]) for e in sweep["experiments"]]
    exps = sweep["experiments"]
    base = {e["values"]["amp"]: e for e in exps if e["role"] == "baseline" and e["repeat_of"] is None}
    again = {e["values"]["amp"]: e for e in exps if e["role"] == "baseline" and e["repeat_of"] is not None}
    assert {a: e["repeat_of"] for a, e in again.items()} == {a: e["id"] for a, e in base.items()}
    assert max(e["id"] for e in exps) in {e["id"] for e in again.values()}  # queued last
    runs = {
        (e["values"]["checkpoint.segments"], e["values"]["checkpoint.preserve_rng_state"], e["values"]["amp"]): e
        for e in exps
        if e["role"] == "run"
    }
    assert set(base) == {"off", "bf16"} and len(runs) == 8
    combos = [(rng, amp) for rng in (True, False) for amp in ("off", "bf16")]

    def label(rng, amp):
        return f"rng={'on' if rng else 'off'} amp={amp}"

    def chart(name):
        r = client.get(f"/api/sweeps/{sid}/charts/{name}")
        assert r.status_code == 200, r.text
        fig = r.json()
        assert "layout" in fig
        return {t["name"]: t for t in fig["data"]}

    memory = chart("memory_vs_segments")
    expected = {f"{kind} {label(rng, amp)}" for kind in ("activation", "peak") for rng, amp in combos}
    assert expected | {"expected amp=off", "expected amp=bf16"} == set(memory)
    for rng, amp in combos:
        trace = memory[f"activation {label(rng, amp)}"]
        assert trace["x"] == [2, 4]
        assert trace["y"] == [runs[(n, rng, amp)]["summary"]["activation_bytes"] for n in (2, 4)]
        peak = memory[f"peak {label(rng, amp)}"]
        assert peak["y"] == [runs[(n, rng, amp)]["summary"]["peak_allocated_bytes"] for n in (2, 4)]
    for amp in ("off", "bf16"):
        law = memory[f"expected amp={amp}"]
        # From the baseline's own blocks: no checkpointing keeps what the baseline kept, and
        # each split keeps about what it measured (RNG states, 5 KiB a checkpoint, aside).
        assert law["x"] == [1, 2, 3, 4]
        assert law["y"][0] == base[amp]["summary"]["activation_bytes"]
        for n in (2, 4):
            measured = runs[(n, False, amp)]["summary"]["activation_bytes"]
            assert law["y"][n - 1] == pytest.approx(measured, rel=0.15)
    # Checkpointing 8 blocks in 4 segments retains less than not checkpointing at all.
    four = runs[(4, True, "off")]["summary"]  # its tensors, its RNG states aside (issue 19)
    assert four["activation_bytes"] - four["rng_state_bytes"] < base["off"]["summary"]["activation_bytes"]

    time_chart = chart("time_vs_segments")
    assert set(time_chart) == {f"overhead {label(rng, amp)}" for rng, amp in combos}
    for rng, amp in combos:
        # Against the timed steps of both runs of the baseline.
        t_base = statistics.median(base[amp]["summary"]["step_times_ms"] + again[amp]["summary"]["step_times_ms"])
        want = [100 * (statistics.median(runs[(n, rng, amp)]["summary"]["step_times_ms"]) / t_base - 1) for n in (2, 4)]
        assert time_chart[f"overhead {label(rng, amp)}"]["y"] == pytest.approx(want)

    # Peak against overhead (a baseline at 0%; its second run, a drift, is not drawn). These
    # runs time no paired rounds (timed_steps 0): a run whose separate-run overhead the host's
    # load made not comparable is left out, and the title counts it (issue 32).
    title = client.get(f"/api/sweeps/{sid}/charts/pareto").json()["layout"]["title"]["text"]
    pareto = chart("pareto")
    assert pareto["baseline"]["x"] == [0.0, 0.0]
    left_out = re.search(r"\((\d+) left out", title)
    drawn = [t for name, t in pareto.items() if name in ("runs", "baseline")]
    assert sum(len(t["x"]) for t in drawn) + (int(left_out.group(1)) if left_out else 0) == 8 + 2
    # The frontier follows the recommendation's order (by the high end of the 95% CI): no
    # point whose CI ends lower has a lower peak than a frontier point (issue 32).
    high, peak = {}, {}
    for t in drawn:
        for i, x, up, y in zip(t["ids"], t["x"], t["error_x"]["array"], t["y"], strict=True):
            high[i], peak[i] = x + up, y
    front = pareto["pareto frontier"]["ids"]
    assert front and all(not (high[i] < high[f] and peak[i] < peak[f]) for f in front for i in high)

    correctness = chart("correctness")
    assert set(correctness) == {"grad_max_abs_diff"}
    bars = correctness["grad_max_abs_diff"]
    assert len(bars["x"]) == 8
    by_label = dict(zip(bars["x"], bars["y"], strict=True))
    for (n, rng, amp), e in runs.items():
        assert by_label[f"segments={n} {label(rng, amp)}"] == e["summary"].get("grad_max_abs_diff")

    results = client.get(f"/api/sweeps/{sid}/results").json()
    assert len(results["data"]) == 12 and results["axes"] == list(axes)
    drift = next(r for r in results["data"] if r["experiment_id"] == again["off"]["id"])
    assert drift["repeat_of"] == base["off"]["id"] and drift["overhead_text"].startswith("drift since")
    # RNG off: no 5 KiB state per checkpoint, which this tiny MLP's saving could not pay for.
    row = next(r for r in results["data"] if r["values"] == {"checkpoint.segments": 4, **_rng_amp(False, "off")})
    assert row["baseline_id"] == base["off"]["id"]
    assert row["metrics"]["activation_saving_pct"] > 0
    assert "95% CI" in row["overhead_text"] and row["overhead"]["low_pct"] <= row["overhead"]["high_pct"]
    rec = client.get(f"/api/sweeps/{sid}/recommendation").json()
    assert rec["reason"] and set(rec["considered"]) <= {e["id"] for e in exps}
    if rec["experiment_id"] is not None:
        chosen = next(r for r in results["data"] if r["experiment_id"] == rec["experiment_id"])
        assert chosen["status"] == "succeeded" and chosen["gradients_match"] is not False
    fits = client.get(f"/api/sweeps/{sid}/recommendation", params={"budget_bytes": 2**40}).json()
    assert fits["experiment_id"] in {base["off"]["id"], base["bf16"]["id"]}  # the baseline fits 1 TiB
    csv_rows = list(csv.DictReader(io.StringIO(client.get(f"/api/sweeps/{sid}/results?format=csv").text)))
    assert len(csv_rows) == 12 and {"checkpoint.segments", "amp", "overhead_pct"} <= set(csv_rows[0])

    events = parse_sse(client.get(f"/api/sweeps/{sid}/events").text)
    assert sum(e.event == "step" for e in events) == 12 * 3
    assert events[-1].event == "end"


def _rng_amp(rng, amp):
    return {"checkpoint.preserve_rng_state": rng, "amp": amp}
