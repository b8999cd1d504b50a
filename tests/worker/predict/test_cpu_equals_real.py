"""On target ``cpu`` a prediction (fake tensors: nothing allocated) equals what the real CPU
run measures with the same live-tensor tracker: the peak, where it is, the activations and
every memory category, within 1% (they agree to the byte on torch 2.13), for every model
kind x strategy x AMP (off, bf16, fp16) of the engine's test matrix (reentrant checkpointing
for the strategies that recompute), every hf architecture (gpt2 and llama under every
strategy), a ``python`` target with gradient accumulation and SGD, a ``custom`` entry point
with AdamW, and torchvision where it imports.

The real runs are memory passes only (no timing pass, no gradient check), with the steps
and warm-up the prediction reproduces: about 80 s on a busy 2-core machine."""

from __future__ import annotations

import sys

import pytest

from ckptlab.prediction.targets import CPU_TARGET
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import STRATEGIES
from ckptlab.summary import RunSummary
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.predict import predict_run
from tests.factories import hf_model, spec_dict
from tests.support import install_model_plugin
from tests.worker.engine.test_engine import MATRIX, SMALL_MODELS

pytestmark = pytest.mark.usefixtures("no_network")

#: What the real run measures and the prediction must give (bytes; the phase exactly).
FIELDS = ("peak_allocated_bytes", "activation_bytes", "activation_bytes_at_peak", "recompute_peak_bytes")
REAL_ONLY = {"timed_steps": 0, "paired_timing": False, "verify_gradients": False}
PLANNED_BUDGET = 10**12  # auto: a budget every plan fits (the plan is then the profile's)


def checkpoint(strategy: str, **fields) -> dict:
    out = {"strategy": strategy, "segments": 2, **fields}
    if STRATEGIES[strategy].planned:
        out["budget_bytes"] = PLANNED_BUDGET
    return out


def assert_same(pred: RunSummary, real: RunSummary) -> None:
    assert pred.peak_phase == real.peak_phase
    for name in FIELDS:
        assert getattr(pred, name) == pytest.approx(getattr(real, name), rel=0.01, abs=0), name
    for name in ("memory_at_peak", "memory_at_forward_end"):
        got, want = getattr(pred, name), getattr(real, name)
        assert got.keys() == want.keys()
        for category, value in want.items():
            assert got[category] == pytest.approx(value, rel=0.01, abs=0), (name, category)
    assert pred.param_count == real.param_count
    assert pred.prediction is not None and pred.prediction.target == "cpu"
    assert pred.prediction.fits is None and pred.prediction.device_used_bytes is None


def compare(body: dict) -> RunSummary:
    spec = ExperimentSpec.model_validate({**body, **REAL_ONLY})
    real = run_experiment(spec)
    pred = predict_run(spec, CPU_TARGET)
    assert_same(pred, real)
    return pred


#: The engine's matrix (tests/worker/engine/test_engine.py): every kind x strategy x AMP, fp16
#: (GradScaler) added; reentrant checkpointing (the matrix's fourth axis) for the strategies
#: that recompute with it, AMP off (it changes what PyTorch saves, not how the tracker counts).
AMPS = ("off", "bf16", "fp16")
CASES = [
    (kind, strategy, reentrant, amp)
    for kind, strategy, reentrant, amp in [
        *((k, s, False, a) for k in sorted(SMALL_MODELS) for s in STRATEGIES for a in AMPS),
        *((k, s, True, "off") for k, s, r, _a in MATRIX if r and STRATEGIES[s].recomputes),
    ]
    if not STRATEGIES[strategy].compiles
]
CASES = list(dict.fromkeys(CASES))
assert {(k, s, a) for k, s, _r, a in MATRIX} <= {(k, s, a) for k, s, _r, a in CASES}


@pytest.mark.parametrize(("kind", "strategy", "reentrant", "amp"), CASES)
def test_built_in_kinds(kind, strategy, reentrant, amp):
    body = spec_dict(model=SMALL_MODELS[kind], batch_size=2, steps=3, amp=amp)
    body["checkpoint"] = checkpoint(strategy, use_reentrant=reentrant)
    compare(body)


#: Two attention families under every strategy, the AMP setting alternating; every other
#: architecture without checkpointing (bf16) and checkpointing each block (off).
HF_STRATEGIES = ("none", "sequential", "per_block", "selective", "offload", "auto")
HF_CASES = [
    *((arch, s, amp) for arch in ("gpt2", "llama") for s, amp in zip(HF_STRATEGIES, ("off", "bf16") * 3, strict=True)),
    *(
        (arch, s, amp)
        for arch in ("convnext", "mistral", "qwen2", "resnet", "swin", "vit")
        for s, amp in (("none", "bf16"), ("per_block", "off"))
    ),
]


@pytest.mark.parametrize(("architecture", "strategy", "amp"), HF_CASES)
def test_hf_architectures(architecture, strategy, amp):
    body = spec_dict(model=hf_model(architecture), batch_size=2, steps=2, amp=amp)
    body["checkpoint"] = checkpoint(strategy)
    pred = compare(body)
    # The CPU kernels run (a real run's attention): SDPA where the architecture has it.
    assert pred.prediction.sdpa_backend == (None if architecture in ("convnext", "resnet") else "cpu")


@pytest.mark.parametrize("strategy", ["none", "per_block", "auto"])
def test_a_python_target_and_accumulation_and_sgd(strategy):
    model = {"kind": "python", "target": "tests.worker.predict.models:factory", "depth": 3, "kwargs": {"hidden": 16}}
    body = spec_dict(model=model, batch_size=4, steps=3, grad_accum_steps=2, optimizer="sgd")
    body["checkpoint"] = checkpoint(strategy)
    compare(body)


def test_a_custom_entry_point_and_adamw(tmp_path, monkeypatch):
    source = (
        "from tests.worker.predict.models import factory as _factory\n"
        "def factory(depth=3, hidden=16):\n    return _factory(depth, hidden)\n"
    )
    name = install_model_plugin(tmp_path, monkeypatch, name="fake_ok", module="ckptlab_fake_ok", source=source)
    try:
        for strategy in ("none", "per_block"):
            body = spec_dict(model={"kind": "custom", "name": name, "depth": 3}, optimizer="adamw")
            body["checkpoint"] = checkpoint(strategy)
            compare(body)
    finally:
        sys.modules.pop("ckptlab_fake_ok", None)


def test_torchvision_where_it_imports():
    pytest.importorskip("torchvision", exc_type=ImportError)  # the registry's CUDA wheel does not import here
    body = spec_dict(model={"kind": "torchvision", "architecture": "resnet18", "num_classes": 4, "image_size": 32})
    body["checkpoint"] = checkpoint("per_block")
    compare(body)
