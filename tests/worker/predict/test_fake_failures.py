"""What cannot be predicted fails with a reason: an op that needs a value or a shape fake
tensors do not have names that op; a compiling strategy is refused, saying why."""

from __future__ import annotations

import pytest

from ckptlab.prediction.targets import CPU_TARGET, get_target
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.errors import RunError
from ckptlab.worker.predict import predict_run
from tests.factories import make_spec


def python_model(factory: str) -> dict:
    return {"kind": "python", "target": f"tests.worker.predict.models:{factory}", "depth": 2}


@pytest.mark.parametrize(
    ("factory", "op"),
    [
        ("with_item", "aten._local_scalar_dense"),
        ("with_tolist", "aten._local_scalar_dense"),
        ("with_nonzero", "aten.nonzero"),
    ],
)
@pytest.mark.parametrize("target", ["cpu", "h100-80gb"])
def test_an_op_without_a_value_fails_naming_it(factory, op, target):
    spec = make_spec(model=python_model(factory), steps=2)
    run_experiment(spec.model_copy(update={"verify_gradients": False}))  # a real run has the values
    with pytest.raises(RunError, match=rf"the model cannot be predicted: .*{op}") as caught:
        predict_run(spec, get_target(target))
    assert "fake tensors do not have" in str(caught.value)


@pytest.mark.parametrize("target", ["cpu", "h100-80gb"])
def test_an_op_without_a_fake_kernel_fails_naming_it(target):
    spec = make_spec(model=python_model("with_custom_op"), steps=2)
    run_experiment(spec.model_copy(update={"verify_gradients": False}))  # its CPU kernel runs
    with pytest.raises(
        RunError, match=r"cannot be predicted: ckptlab_predict_test(::|\.)twice.* has no fake \(meta\) kernel"
    ):
        predict_run(spec, get_target(target))


def test_a_compiling_strategy_is_refused_saying_why():
    spec = make_spec(**{"checkpoint.strategy": "compile_budget"})
    with pytest.raises(RunError, match="cannot be predicted: torch.compile"):
        predict_run(spec, CPU_TARGET)


def test_the_engine_runs_a_sharded_spec_only_through_its_ranks():
    with pytest.raises(RunError, match="one process per rank"):
        run_experiment(make_spec(distributed={"kind": "fsdp2", "world_size": 8}))


def test_what_a_fake_tensor_failure_means_is_read_from_the_cause():
    import torch
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    from ckptlab.worker.predict.fake import fake_failure

    try:
        try:
            raise UnsupportedOperatorException(torch.ops.aten.cholesky.default)
        except UnsupportedOperatorException as inner:
            raise RuntimeError("while running the model") from inner
    except RuntimeError as exc:
        assert fake_failure(exc) == (
            "the model cannot be predicted: aten.cholesky.default has no fake (meta) kernel, "
            "so it cannot run on fake tensors"
        )
    assert fake_failure(ValueError("an unrelated failure")) is None
