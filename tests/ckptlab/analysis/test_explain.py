"""Findings: a planned strategy (``auto``) is judged on its plan, not on the table's groups."""

from __future__ import annotations

from ckptlab.analysis.explain import findings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import get_strategy
from ckptlab.summary import RunSummary
from tests.factories import spec_dict


def _codes(summary: RunSummary, **overrides) -> list[str]:
    spec = ExperimentSpec.model_validate(spec_dict(**overrides))
    return [f.code for f in findings(spec, summary, get_strategy(spec.checkpoint.strategy))]


def test_an_auto_plan_that_checkpoints_blocks_is_not_said_to_wrap_none() -> None:
    auto = {"checkpoint.strategy": "auto", "checkpoint.budget_bytes": 10**9}
    plan = {"segments": [[0, 2, True], [2, 4, False]], "checkpointed_blocks": [0, 1]}
    assert "sequential_equals_none" not in _codes(RunSummary(plan=plan), **auto)
    kept = {"segments": [[0, 4, False]], "checkpointed_blocks": []}
    assert "sequential_equals_none" in _codes(RunSummary(plan=kept), **auto)


def test_a_sequential_setting_of_one_segment_still_wraps_none() -> None:
    one = {"checkpoint.strategy": "sequential", "checkpoint.segments": 1}
    assert "sequential_equals_none" in _codes(RunSummary(), **one)
    assert "sequential_equals_none" not in _codes(RunSummary(), **{**one, "checkpoint.segments": 2})


def _sharded_codes(spec: dict, summary: RunSummary | None = None) -> list[str]:
    parsed = ExperimentSpec.model_validate(spec)
    strategy = get_strategy(parsed.checkpoint.strategy)
    return [f.code for f in findings(parsed, summary or RunSummary(), strategy)]


def _sharded(strategy: str, distributed: dict, **checkpoint) -> dict:
    spec = spec_dict(**{"checkpoint.strategy": strategy, **{f"checkpoint.{k}": v for k, v in checkpoint.items()}})
    return {**spec, "distributed": distributed}


def test_the_unit_audit_is_silent_on_torchtitans_order() -> None:
    assert _sharded_codes(_sharded("per_block", {"kind": "fsdp2", "world_size": 2})) == []
    assert _sharded_codes(_sharded("per_block", {"kind": "ddp", "world_size": 2})) == []


def test_the_unit_audit_names_a_root_only_unit_with_its_all_gathered_bytes() -> None:
    summary = RunSummary(memory_at_peak={"unsharded_parameters": 3 * 2**20})
    spec = _sharded("per_block", {"kind": "fsdp2", "world_size": 2, "shard_unit": "model"})
    parsed = ExperimentSpec.model_validate(spec)
    (finding,) = findings(parsed, summary, get_strategy("per_block"))
    assert finding.code == "root_only_fsdp_unit" and "3.0 MiB of all-gathered parameters" in finding.message


def test_the_unit_audit_flags_a_group_spanning_several_units_and_reentrant_checkpointing() -> None:
    spans = _sharded("sequential", {"kind": "fsdp2", "world_size": 2}, segments=2)
    assert _sharded_codes(spans) == ["segment_spans_fsdp_units"]
    reentrant = _sharded("per_block", {"kind": "ddp", "world_size": 2}, use_reentrant=True)
    assert _sharded_codes(reentrant) == ["reentrant_under_sharding"]
    assert _sharded_codes({**reentrant, "distributed": {"kind": "none"}}) == []


def test_the_unit_audit_fires_on_units_inside_the_checkpointed_blocks() -> None:
    per_child = _sharded("per_block", {"kind": "fsdp2", "world_size": 2, "shard_unit": "block_children"})
    assert _sharded_codes(per_child) == ["fsdp_inside_block"]
    kept = _sharded("none", {"kind": "fsdp2", "world_size": 2, "shard_unit": "block_children"})
    assert _sharded_codes(kept) == []  # nothing recomputed: no recomputation all-gathers them
