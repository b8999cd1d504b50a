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
