"""Strategy ``compile_budget``: torch.compile with an activation memory budget, on CPU
(issue 21): its gradients are checked like any strategy's, its memory comes from the
allocator (the tracker cannot watch compiled code), compile time is apart from step time."""

from __future__ import annotations

import pydantic
import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import get_strategy
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.training import CompiledStep
from tests.factories import spec_dict


def _spec(budget: float) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        spec_dict(
            **{
                "model.depth": 4,
                "model.width": 256,
                "batch_size": 64,
                "timed_steps": 3,
                "checkpoint": {"strategy": "compile_budget", "activation_memory_budget": budget},
            }
        )
    )


@pytest.fixture(scope="module")
def runs() -> dict[float, dict]:
    """Budgets 1.0 (the default partition) and 0.0 (recompute what it can), 0.0 once more
    after them in the same process (``"again"``), and ``none``."""
    out = {b: run_experiment(_spec(b)).dump() for b in (1.0, 0.0)}
    out["again"] = run_experiment(_spec(0.0)).dump()
    out["none"] = run_experiment(
        ExperimentSpec.model_validate(spec_dict(**{"model.depth": 4, "model.width": 256, "batch_size": 64}))
    ).dump()
    return out


def test_gradients_are_checked_and_match(runs):
    for budget in (1.0, 0.0):
        assert runs[budget]["gradient_verdict"] == "match"
        assert runs[budget]["gradients_match"] is True


def test_a_smaller_budget_keeps_fewer_activation_bytes(runs):
    assert 0 < runs[0.0]["activation_bytes"] < runs[1.0]["activation_bytes"]
    # ... and the memory says where it was read: the allocator, not the tensor tracker
    assert runs[0.0]["memory_source"].startswith("cpu allocator")
    assert runs["none"]["memory_source"] == "live tensors"


def test_compile_time_is_reported_apart_from_step_time(runs):
    for budget in (1.0, 0.0):
        s = runs[budget]
        assert s["compile_ms"] > 0
        assert len(s["step_times_ms"]) == 3  # the timed steps only: the compile step is none of them
    assert runs["none"].get("compile_ms") is None


def test_the_same_peak_as_eager_where_the_optimizer_sets_it(runs):
    """Adam's step sets this tiny MLP's peak (parameters, gradients, two state tensors):
    the allocator probe reads it within 1% of the tracker's exact count of the eager run."""
    assert runs["none"]["peak_phase"] == runs[1.0]["peak_phase"] == "optimizer"
    assert runs[1.0]["peak_allocated_bytes"] == pytest.approx(runs["none"]["peak_allocated_bytes"], rel=0.01)


def test_a_compiled_run_reads_the_same_bytes_after_another_in_the_same_process(runs):
    """What the earlier compiled runs left is freed before the allocator is read: freed
    inside the readings it counted as negative bytes (bench_compile's loop read peaks of
    0 B, and below the run's own activations, in some rounds)."""
    for key in ("peak_allocated_bytes", "activation_bytes"):
        assert runs["again"][key] == runs[0.0][key]
    for budget in (1.0, 0.0):
        assert runs[budget]["peak_allocated_bytes"] > runs[budget]["activation_bytes"] > 0


@pytest.mark.parametrize("value", [-0.1, 1.5, "half"])
def test_a_budget_outside_0_1_is_refused_at_the_field(value):
    with pytest.raises(pydantic.ValidationError) as err:
        ExperimentSpec.model_validate(
            spec_dict(checkpoint={"strategy": "compile_budget", "activation_memory_budget": value})
        )
    assert err.value.errors()[0]["loc"][-1] == "activation_memory_budget"


def test_a_compiled_run_is_paired_with_the_eager_un_checkpointed_step(runs):
    """Issue 31: compiled runs stand on the eager plans' footing, each timed step beside a
    step of the eager un-checkpointed copy, so a plan's front can draw them with the rest."""
    for budget in (1.0, 0.0):
        s = runs[budget]
        assert s["paired_with"] == "none" and len(s["paired_baseline_cpu_ms"]) == len(s["step_times_ms"]) == 3
        assert s["paired_overhead"] is not None and s["paired_overhead"]["rounds"] == 3


#: A transformer whose eager cross-entropy keeps logits-sized tensors (batch 4 x seq 128 x
#: vocab 256, fp32: 512 KiB each) beside small blocks.
LM = {"kind": "transformer", "depth": 2, "d_model": 64, "heads": 2, "seq_len": 128, "vocab_size": 256}


@pytest.fixture(scope="module")
def scoped() -> dict[str, dict]:
    """compile_budget 1.0 with the blocks compiled and with the whole step compiled; under
    ``"calls"``, how many times each ran the compiled step (:class:`CompiledStep`)."""
    out: dict[str, dict] = {"calls": {}}
    real = CompiledStep.__call__
    for scope in ("blocks", "step"):
        calls = []

        def counted(self, x, y, calls=calls):
            calls.append(1)
            return real(self, x, y)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(CompiledStep, "__call__", counted)
            spec = ExperimentSpec.model_validate(
                spec_dict(
                    model=LM,
                    batch_size=4,
                    timed_steps=2,
                    checkpoint={"strategy": "compile_budget", "activation_memory_budget": 1.0, "compile_scope": scope},
                )
            )
            out[scope] = run_experiment(spec).dump()
        out["calls"][scope] = (len(calls), spec.steps + spec.timed_steps)
    return out


def test_the_whole_step_compiled_keeps_less_than_the_blocks_compiled(scoped):
    """With the loss in the graph the partitioner need not keep what eager autograd keeps for
    the cross-entropy (its log-probabilities): a lower peak than the blocks alone compiled,
    the gradients still matching the eager reference's, and the run says what it compiled."""
    blocks, step = scoped["blocks"], scoped["step"]
    assert step["peak_allocated_bytes"] < blocks["peak_allocated_bytes"]
    assert step["gradient_verdict"] == blocks["gradient_verdict"] == "match"
    assert step["compile_ms"] > 0 and step["memory_source"].startswith("cpu allocator")
    # every step of the run went through the compiled step (the compile warm-up and the
    # gradient check's copy too), and none of the blocks-scope run's did
    calls, steps = scoped["calls"]["step"]
    assert calls >= steps + 2
    assert scoped["calls"]["blocks"][0] == 0


def test_the_label_names_the_scope():
    ck = ExperimentSpec.model_validate(
        spec_dict(checkpoint={"strategy": "compile_budget", "activation_memory_budget": 0.8, "compile_scope": "step"})
    ).checkpoint
    assert get_strategy(ck.strategy).label_for(ck.model_dump()) == "compile_budget (0.8, step)"
    assert get_strategy(ck.strategy).label_for(ck.model_dump(mode="json")) == "compile_budget (0.8, step)"


def test_a_compile_scope_outside_blocks_and_step_is_refused_at_the_field():
    with pytest.raises(pydantic.ValidationError) as err:
        ExperimentSpec.model_validate(spec_dict(checkpoint={"strategy": "compile_budget", "compile_scope": "head"}))
    assert err.value.errors()[0]["loc"][-1] == "compile_scope"
