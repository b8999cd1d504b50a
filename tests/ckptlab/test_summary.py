"""``ckptlab.summary.RunSummary``: the engine writes every field through it (nothing it
does not declare), and a stored summary of any age or shape loads without raising."""

from __future__ import annotations

import pytest

from ckptlab.strategies import STRATEGIES
from ckptlab.summary import RunSummary
from tests.factories import spec_dict

BUILT_IN = {
    "mlp": {"kind": "mlp", "depth": 4, "width": 32, "dropout": 0.1},
    "resnet": {"kind": "resnet", "depth": 2, "channels": 4, "image_size": 16},
    "transformer": {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 50},
    "densenet": {"kind": "densenet", "depth": 2, "growth_rate": 4, "bn_size": 2, "image_size": 8},
}


def body_for(kind: str) -> dict:
    return spec_dict(steps=2, batch_size=2, model=BUILT_IN[kind], timed_steps=2)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", sorted(BUILT_IN))
def test_the_engines_summary_round_trips_with_every_key_declared(kind, strategy):
    from ckptlab.spec.experiment import ExperimentSpec
    from ckptlab.worker.engine.run import run_experiment

    checkpoint = {"strategy": strategy, "segments": 2 if strategy == "sequential" else 1}
    if STRATEGIES[strategy].planned:  # these tiny models peak in the optimizer step: plans are tested apart
        checkpoint["budget_bytes"] = 10**12
    body = body_for(kind)
    body["checkpoint"] = {**body["checkpoint"], **checkpoint}
    summary = run_experiment(ExperimentSpec.model_validate(body)).dump()
    loaded = RunSummary.model_validate(summary)
    assert loaded.model_extra == {}, f"keys RunSummary does not declare: {sorted(loaded.model_extra)}"
    assert loaded.dump() == summary
    assert loaded.activation_bytes > 0 and loaded.timing["step_ms"].n == 2


def test_an_older_or_damaged_summary_loads_with_defaults_and_keeps_unknown_keys():
    assert RunSummary.load(None) == RunSummary() and RunSummary.load("text").activation_bytes is None
    old = RunSummary.load({"activation_bytes": 1024, "step_times_ms": [1.0, 2.0]})  # before most fields
    assert old.activation_bytes == 1024 and old.findings == [] and old.gradients_match is None
    damaged = RunSummary.load(
        {
            "activation_bytes": "lots",  # a hand-edited row
            "peak_allocated_bytes": 4096,
            "step_times_ms": [1.0, "x"],
            "final_loss": float("nan"),
            "gradients_match": "yes",
            "findings": [{"code": "offload_on_cpu", "message": "m"}],
            "from_a_newer_version": {"a": 1},
        }
    )
    assert damaged.activation_bytes is None and damaged.step_times_ms == [] and damaged.final_loss is None
    assert damaged.gradients_match is None and damaged.peak_allocated_bytes == 4096
    assert damaged.findings[0].code == "offload_on_cpu"
    assert damaged.model_extra == {"from_a_newer_version": {"a": 1}}


def test_dump_writes_only_what_was_set():
    assert RunSummary(oom={"phase": "forward", "step": 2}).dump() == {"oom": {"phase": "forward", "step": 2}}
