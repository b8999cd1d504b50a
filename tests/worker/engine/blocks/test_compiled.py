"""``auto``'s compiled candidates (``checkpoint.search_compile``, issue 31 Done-when #2): the
bisection over torch.compile's own budget, the choice against the eager plan, and a run that
compiles the chosen fraction at exactly the peak its search measured."""

from __future__ import annotations

import pydantic
import pytest
import torch

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.sweeps import canonical, plan_sweep
from ckptlab.worker.engine.blocks import compiled
from ckptlab.worker.engine.blocks.compiled import cheaper, largest_fitting
from ckptlab.worker.engine.run import run_experiment
from tests.factories import spec_dict

#: A small transformer whose compiled peaks differ by fraction (CPU allocator, bytes):
#: 1.0 about 8.28 MB, 0.75 6.71 MB, 0.5 6.16 MB; none 8.28 MB, per_block 5.33 MB.
MODEL = {"kind": "transformer", "depth": 2, "d_model": 64, "heads": 2, "seq_len": 128, "vocab_size": 256}
BUDGET = 6_500_000


@pytest.mark.parametrize("n", [1, 2, 5, 20])
def test_the_bisection_finds_the_largest_fitting_fraction_whatever_the_threshold(n):
    for threshold in range(-1, n):  # -1: none fits
        calls: list[int] = []

        def fits(k: int, t: int = threshold, seen: list[int] = calls) -> bool:
            seen.append(k)
            return k <= t

        assert largest_fitting(fits, n) == (threshold if threshold >= 0 else None)
        assert calls[0] == n - 1  # the top (the default partition) first
        assert len(calls) <= 1 + max(n - 1, 1).bit_length()


def test_the_bisection_stops_at_its_probe_limit_with_what_it_found():
    calls: list[int] = []
    # 19 does not fit, 9 does, 14 does not: out of probes, 9 is the best found (11 was)
    assert largest_fitting(lambda k: calls.append(k) or k <= 11, 20, max_probes=3) == 9
    assert calls == [19, 9, 14]
    calls.clear()
    assert largest_fitting(lambda k: calls.append(k) or k <= 3, 20, max_probes=3) is None  # none found yet
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("overhead", "eager", "chosen"),
    [
        ({"estimate": 0.02, "low": 0.0, "high": 0.04}, 0.10, True),
        ({"estimate": 0.08, "low": 0.05, "high": 0.12}, 0.10, False),  # inside the noise: keep eager
        ({"estimate": 0.20, "low": 0.18, "high": 0.22}, 0.10, False),
        (None, 0.10, False),  # not timed: no claim it is cheaper
        ({"estimate": 0.02, "low": 0.0, "high": 0.04}, None, False),  # eager not timed: the exact plan stays
    ],
)
def test_the_compiled_candidate_is_chosen_only_when_measurably_cheaper(overhead, eager, chosen):
    assert cheaper(overhead, eager) is chosen


def _spec(**checkpoint) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        spec_dict(model=MODEL, batch_size=4, timed_steps=6, checkpoint={"strategy": "auto", **checkpoint})
    )


@pytest.fixture(scope="module")
def forced_run() -> dict:
    """auto with search_compile on a grid of quarters, the compiled candidate taken whatever
    its time (the choice is :func:`cheaper`'s, tested above)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiled, "GRID", (0.25, 0.5, 0.75, 1.0))
        mp.setattr(compiled, "cheaper", lambda overhead, eager: True)
        return run_experiment(_spec(budget_bytes=BUDGET, search_compile=True)).dump()


def test_a_chosen_fraction_runs_compiled_at_exactly_the_peak_its_search_measured(forced_run):
    s = forced_run
    found = s["plan"]["compiled"]
    assert s["plan"]["chosen"] == "compile_budget" and found["chosen"]
    assert s["memory_source"].startswith("cpu allocator") and s["compile_ms"] > 0  # it compiled
    assert s["peak_allocated_bytes"] == found["peak_bytes"] == s["predicted_peak_bytes"] <= BUDGET
    # per scope (the whole step, then the blocks), the largest fraction tried that fits:
    # every larger one tried did not; the one run is the scope whose timed overhead is lower
    scopes = {p["compile_scope"] for p in found["probes"]}
    assert scopes == {"step", "blocks"} and found["compile_scope"] in scopes
    for scope in scopes:
        tried = {p["activation_memory_budget"]: p["peak_bytes"] for p in found["probes"] if p["compile_scope"] == scope}
        assert 1.0 in tried and len(tried) <= 3
        best = max(f for f, peak in tried.items() if peak is not None and peak <= BUDGET)
        assert (scope, best) in {(c["compile_scope"], c["activation_memory_budget"]) for c in found["candidates"]}
    chosen = [c for c in found["candidates"] if c["compile_scope"] == found["compile_scope"]][0]
    assert chosen["activation_memory_budget"] == found["activation_memory_budget"]
    assert all(
        chosen["predicted_overhead"]["estimate"] <= c["predicted_overhead"]["estimate"] for c in found["candidates"]
    )
    # timed against the eager un-checkpointed step, as the eager plan was predicted
    assert s["paired_overhead"] is not None and found["predicted_overhead"]["rounds"] >= 6
    assert s["plan"]["eager_prediction"]["predicted_peak_bytes"] <= BUDGET
    assert s["gradient_verdict"] == "match"


@pytest.mark.parametrize(
    "error",
    [torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("DefaultCPUAllocator: can't allocate memory")],
)
def test_a_candidate_out_of_memory_does_not_fit_and_the_eager_plan_keeps_its_peak(monkeypatch, error):
    """The run's memory limit is the budget: the default partition (8.28 MB) would not fit
    beside it, and a candidate that runs out of memory is one that does not fit, not the
    run's failure. The eager plan, not beaten, runs at its own prediction."""
    real = compiled.measured_compiled

    def measured(spec, dev, build, fraction, *args, **kw):
        if fraction == 1.0:
            raise error
        return real(spec, dev, build, fraction, *args, **kw)

    monkeypatch.setattr(compiled, "GRID", (0.5, 1.0))
    monkeypatch.setattr(compiled, "measured_compiled", measured)
    monkeypatch.setattr(compiled, "cheaper", lambda overhead, eager: False)
    s = run_experiment(
        _spec(budget_bytes=BUDGET, search_compile=True).model_copy(update={"memory_limit_bytes": BUDGET})
    )
    s = s.dump()
    found = s["plan"]["compiled"]
    tried = [(p["compile_scope"], p["activation_memory_budget"]) for p in found["probes"]]
    assert tried == [("step", 1.0), ("step", 0.5), ("blocks", 1.0), ("blocks", 0.5)]
    for oom in (found["probes"][0], found["probes"][2]):
        assert oom["peak_bytes"] is None and oom["compile_ms"] == 0.0 and oom["out_of_memory"] is True
    for fitting in (found["probes"][1], found["probes"][3]):
        assert fitting["peak_bytes"] <= BUDGET and not fitting["out_of_memory"]
    assert found["activation_memory_budget"] == 0.5
    assert not found["chosen"] and s["plan"]["chosen"] == "checkpoints" and "eager_prediction" not in s["plan"]
    assert s["memory_source"] == "live tensors" and s.get("compile_ms") is None  # the eager plan ran
    assert s["peak_allocated_bytes"] == s["predicted_peak_bytes"] == s["plan"]["predicted_peak_bytes"] <= BUDGET


class _Measured:
    """What :func:`compiled.measured_compiled` returns, as the search reads it: the memory
    pass's peak and, when timed, paired step CPU times (``ratio`` x the eager step's)."""

    def __init__(self, peak: int, ratio: float | None):
        self.records, self.compile_ms, self.pairing_skipped = [{"peak_allocated_bytes": peak}], 1.0, None
        self.spec = type("Spec", (), {"warmup_steps": 0})()
        base = [100.0 + i % 3 for i in range(12)] if ratio is not None else []
        self.paired = [{"step_ms": b, "extra": {"cpu_ms": b}} for b in base]
        self.timed = [{"step_ms": b * ratio, "extra": {"cpu_ms": b * ratio}} for b in base]


def _fake_search(monkeypatch, peaks, ratios, broken=()):
    """``search_compiled`` over fake candidates: ``peaks[scope](fraction)`` is a probe's
    peak, ``ratios[scope]`` its timed step over the eager one's (the timed build peaks as its
    probe did, unless ``peaks[scope, "timed"]`` says otherwise); scopes in ``broken`` raise."""

    def measured(spec, dev, build, fraction, scope, *, timed, **kw):
        if scope in broken:
            raise RuntimeError("BackendCompilerFailed: dynamo could not trace the loss")
        if not timed:
            return _Measured(peaks[scope](fraction), None)
        return _Measured(peaks.get((scope, "timed"), peaks[scope](fraction)), ratios[scope])

    monkeypatch.setattr(compiled, "measured_compiled", measured)
    monkeypatch.setattr(compiled, "GRID", (0.25, 0.5, 0.75, 1.0))
    return compiled.search_compiled(
        _spec(budget_bytes=BUDGET), torch.device("cpu"), None, eager_overhead=0.5, budget_bytes=BUDGET
    )


#: A probe's peak by scope and fraction: step's largest fitting fraction is 0.75, blocks' 0.5.
PEAKS = {"step": lambda f: int(BUDGET * (0.5 + f * 0.6)), "blocks": lambda f: int(BUDGET * (0.4 + f * 0.9))}


def test_each_scope_is_bisected_and_the_cheaper_fitting_candidate_is_taken(monkeypatch):
    choice = _fake_search(monkeypatch, PEAKS, {"step": 1.10, "blocks": 1.02})
    assert {(c.scope, c.fraction) for c in choice.timed} == {("step", 0.75), ("blocks", 0.5)}
    assert (choice.scope, choice.fraction) == ("blocks", 0.5)  # the lower overhead
    assert choice.overhead["estimate"] == pytest.approx(0.02) and choice.chosen
    choice = _fake_search(monkeypatch, PEAKS, {"step": 1.01, "blocks": 1.02})
    assert (choice.scope, choice.fraction) == ("step", 0.75)


def test_a_candidate_whose_timed_build_peaked_over_the_budget_is_taken_last(monkeypatch):
    peaks = {**PEAKS, ("step", "timed"): BUDGET + 1}  # the faster one's second build went over
    choice = _fake_search(monkeypatch, peaks, {"step": 1.01, "blocks": 1.05})
    assert (choice.scope, choice.fraction) == ("blocks", 0.5) and choice.peak_bytes <= BUDGET and choice.chosen


def test_a_scope_torch_compile_cannot_run_leaves_the_other_scopes_candidate(monkeypatch):
    choice = _fake_search(monkeypatch, PEAKS, {"step": 1.0, "blocks": 1.02}, broken=("step",))
    assert (choice.scope, choice.fraction) == ("blocks", 0.5) and choice.chosen and choice.why_not is None
    assert choice.public()["errors"] == {
        "step": "torch.compile could not run it: RuntimeError: BackendCompilerFailed: dynamo could not trace the loss"
    }
    assert [c["compile_scope"] for c in choice.public()["candidates"]] == ["blocks"]


def test_without_an_eager_prediction_a_fitting_candidate_is_not_run_and_says_why(monkeypatch):
    monkeypatch.setattr(compiled, "GRID", (0.5, 1.0))
    choice = compiled.search_compiled(
        _spec(budget_bytes=BUDGET), torch.device("cpu"), None, eager_overhead=None, budget_bytes=BUDGET
    )
    assert choice.fraction == 0.5 and choice.peak_bytes <= BUDGET
    assert choice.overhead is not None and not choice.chosen
    assert choice.why_not == "the eager plan's overhead was not predicted: nothing to beat"


def test_a_model_torch_compile_cannot_run_keeps_the_eager_plan_and_says_why(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("BackendCompilerFailed: inductor raised\nwith a traceback")

    monkeypatch.setattr(compiled, "measured_compiled", broken)
    s = run_experiment(_spec(budget_bytes=BUDGET, search_compile=True)).dump()
    found = s["plan"]["compiled"]
    assert not found["chosen"] and found["activation_memory_budget"] is None
    assert found["why_not"] == "torch.compile could not run it: RuntimeError: BackendCompilerFailed: inductor raised"
    assert s["memory_source"] == "live tensors" and s["peak_allocated_bytes"] <= BUDGET  # the eager plan ran


def test_compiled_dropout_falls_back_to_the_eager_plan_whose_gradients_match(monkeypatch):
    """torch.compile draws other dropout masks: its gradient check differs, so the run keeps
    the eager plan and says why (an MLP with dropout 0.1, whose compiled default partition
    fits the budget)."""
    monkeypatch.setattr(compiled, "GRID", (0.5, 1.0))
    monkeypatch.setattr(compiled, "cheaper", lambda overhead, eager: True)
    mlp = {"model.depth": 4, "model.width": 256, "model.dropout": 0.1, "batch_size": 256, "optimizer": "sgd"}
    body = spec_dict(
        **mlp, timed_steps=4, checkpoint={"strategy": "auto", "budget_bytes": 4_000_000, "search_compile": True}
    )
    s = run_experiment(ExperimentSpec.model_validate(body)).dump()
    found = s["plan"]["compiled"]
    assert found["activation_memory_budget"] is not None and not found["chosen"]
    assert "dropout" in found["why_not"] and s["plan"]["chosen"] == "checkpoints"
    assert s["gradient_verdict"] == "match" and s["memory_source"] == "live tensors"
    assert s["peak_allocated_bytes"] <= s["predicted_peak_bytes"] <= 4_000_000


def test_without_search_compile_auto_never_compiles():
    s = run_experiment(_spec(budget_bytes=BUDGET)).dump()
    assert "compiled" not in s["plan"] and s.get("compile_ms") is None
    assert s["memory_source"] == "live tensors" and s["peak_allocated_bytes"] <= BUDGET


def test_search_compile_is_refused_in_a_sharded_run_naming_the_field():
    body = spec_dict(checkpoint={"strategy": "auto", "budget_bytes": 10**9, "search_compile": True})
    body["distributed"] = {"kind": "ddp", "world_size": 2}
    with pytest.raises(pydantic.ValidationError) as info:
        ExperimentSpec.model_validate(body)
    assert info.value.errors()[0]["loc"] == ("checkpoint", "search_compile")


def test_other_strategies_ignore_search_compile_and_a_sweep_queues_them_once():
    per_block = ExperimentSpec.model_validate(spec_dict(checkpoint={"strategy": "per_block", "search_compile": True}))
    assert canonical(per_block).checkpoint.search_compile is False
    base = spec_dict(checkpoint={"strategy": "auto", "budget_bytes": 10**9, "search_compile": True})
    plan = plan_sweep(base, {"checkpoint.strategy": ["auto", "per_block"]})
    searched = {r.spec.checkpoint.strategy: r.spec.checkpoint.search_compile for r in plan.runs}
    assert searched == {"none": False, "auto": True, "per_block": False}  # the baseline too


@pytest.mark.gpu
def test_on_cuda_a_chosen_fraction_runs_at_the_peak_its_search_measured(monkeypatch):
    """On CUDA the allocator's readings are absolute: what the candidates and the paired
    eager copy cached must be gone before the run, which reads its search's peak again."""
    monkeypatch.setattr(compiled, "GRID", (0.25, 0.5, 0.75, 1.0))
    monkeypatch.setattr(compiled, "cheaper", lambda overhead, eager: True)
    body = spec_dict(model=MODEL, batch_size=4, timed_steps=6, device="cuda", verify_gradients=False)
    peaks = [
        run_experiment(ExperimentSpec.model_validate({**body, "checkpoint": {"strategy": s}})).peak_allocated_bytes
        for s in ("none", "per_block")
    ]
    budget = sum(peaks) // 2  # on CPU compile 0.5 fits under the midpoint (6.16 against 6.8 MB)
    body["checkpoint"] = {"strategy": "auto", "budget_bytes": budget, "search_compile": True}
    s = run_experiment(ExperimentSpec.model_validate(body)).dump()
    found = s["plan"]["compiled"]
    assert found["chosen"] and s["compile_ms"] > 0, found
    assert s["peak_allocated_bytes"] == found["peak_bytes"] <= budget
    assert s["paired_overhead"] is not None
