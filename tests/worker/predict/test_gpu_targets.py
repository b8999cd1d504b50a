"""GPU targets: the fake CPU count adjusted for the device. Allocations are rounded (so the
figures are at least the CPU's), reserved bytes are at least the allocated ones, the device's
used memory is reserved + context, the verdict follows the capacity, and attention saves what
the backend the target picks saves."""

from __future__ import annotations

import pytest

from ckptlab.domain import MemoryCategory
from ckptlab.prediction.targets import CPU_TARGET, UNVERIFIED, Target, get_target, registered
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.errors import RunError
from ckptlab.worker.predict import predict_run
from tests.factories import hf_model, make_spec, spec_dict

pytestmark = pytest.mark.usefixtures("no_network")

MiB = 1024**2
H100 = get_target("h100-80gb")
#: head_dim 64 (d_model 128, 2 heads), 64 tokens.
GPT = {"kind": "transformer", "depth": 2, "d_model": 128, "heads": 2, "seq_len": 64, "vocab_size": 100}
MLP = {"kind": "mlp", "depth": 4, "width": 64}


def spec(model: dict, **overrides) -> ExperimentSpec:
    return make_spec(model=model, batch_size=4, steps=3, **overrides)


@pytest.mark.parametrize(("model", "amp"), [(MLP, "off"), (GPT, "bf16"), (GPT, "off")])
def test_rounded_figures_are_at_least_the_cpu_count_and_reserved_at_least_allocated(model, amp):
    s = spec(model, amp=amp)
    cpu, gpu = predict_run(s, CPU_TARGET), predict_run(s, H100)
    assert gpu.peak_allocated_bytes >= cpu.peak_allocated_bytes
    assert gpu.activation_bytes >= cpu.activation_bytes
    p = gpu.prediction
    assert p.target == H100.name and p.error_bound == UNVERIFIED and p.capacity_bytes == H100.capacity_bytes
    assert p.peak_reserved_bytes >= gpu.peak_allocated_bytes and p.peak_reserved_bytes % (2 * MiB) == 0
    assert gpu.reserved_bytes == p.peak_reserved_bytes
    assert p.device_used_bytes == p.peak_reserved_bytes + H100.context_bytes
    assert p.fits is True and p.margin_bytes == H100.capacity_bytes - p.device_used_bytes
    assert gpu.device == "cuda" and gpu.step_time_ms is None and gpu.final_loss is None
    assert any("no timing pass and no gradient check" in n for n in p.notes)


def test_every_allocation_is_rounded_to_the_block_and_a_workspace_added_per_thread():
    bare = Target("bare-gpu", "no workspace, no context", "cuda", 2**34, (9, 0))  # 512 B blocks
    with registered(bare):
        gpu = predict_run(spec(MLP), bare)
        with_workspace = predict_run(spec(MLP), H100)
    for figures in (gpu.memory_at_forward_end, gpu.memory_at_peak):
        assert all(v % 512 == 0 for v in figures.values()), figures
    assert gpu.prediction.device_used_bytes == gpu.prediction.peak_reserved_bytes
    other = MemoryCategory.OTHER.value
    extra = H100.cublas_workspaces_bytes  # forward's and backward's thread each ran a matmul
    assert with_workspace.peak_allocated_bytes == gpu.peak_allocated_bytes + extra
    assert with_workspace.memory_at_forward_end[other] == gpu.memory_at_forward_end[other] + extra


def test_fits_flips_with_the_capacity():
    s = spec(GPT, amp="bf16")
    used = predict_run(s, H100).prediction.device_used_bytes
    exactly = predict_run(s, H100, capacity_bytes=used).prediction
    short = predict_run(s, H100, capacity_bytes=used - 1).prediction
    assert (exactly.fits, exactly.margin_bytes, exactly.capacity_bytes) == (True, 0, used)
    assert (short.fits, short.margin_bytes) == (False, -1)
    assert any(n.startswith("does not fit: 1 B short") for n in short.notes)


def test_a_cuda_run_keeps_no_cpu_rng_states_and_offload_keeps_its_saved_tensors_on_the_host():
    cpu = predict_run(spec(GPT, **{"checkpoint.strategy": "per_block"}), CPU_TARGET)
    gpu = predict_run(spec(GPT, **{"checkpoint.strategy": "per_block"}), H100)
    assert cpu.rng_state_bytes == 2 * 5056 and gpu.rng_state_bytes == 0
    kept = predict_run(spec(GPT, **{"checkpoint.strategy": "offload"}), CPU_TARGET)
    offloaded = predict_run(spec(GPT, **{"checkpoint.strategy": "offload"}), H100)
    assert offloaded.activation_bytes < 0.5 * kept.activation_bytes
    assert any("save_on_cpu" in n for n in offloaded.prediction.notes)


@pytest.mark.parametrize(
    ("amp", "backend"),
    [("bf16", "flash"), ("fp16", "flash"), ("off", "efficient")],
)
def test_attention_runs_the_backend_the_target_picks(amp, backend):
    assert predict_run(spec(GPT, amp=amp), H100).prediction.sdpa_backend == backend


def test_math_attention_keeps_the_probabilities():
    """fp32 on a card before sm50: math, which keeps (B, H, L, L) probabilities per layer."""
    old = Target("old-gpu", "compute capability 3.7", "cuda", 2**34, (3, 7))
    with registered(old):
        math = predict_run(spec(GPT), old)
    efficient = predict_run(spec(GPT), H100)
    assert math.prediction.sdpa_backend == "math" and efficient.prediction.sdpa_backend == "efficient"
    probabilities = GPT["depth"] * 4 * GPT["heads"] * GPT["seq_len"] ** 2 * 4  # fp32
    # less efficient's logsumexp, which math does not keep
    assert math.activation_bytes - efficient.activation_bytes == pytest.approx(probabilities, rel=0.05)


def test_eager_attention_is_reported_as_math_and_an_attention_free_model_has_none():
    body = spec_dict(model=hf_model("gpt2", attn_implementation="eager"), batch_size=2, steps=2)
    eager = predict_run(ExperimentSpec.model_validate(body), H100)
    assert eager.prediction.sdpa_backend == "math"
    assert any("eagerly" in n for n in eager.prediction.notes)
    assert predict_run(spec(MLP), H100).prediction.sdpa_backend is None


def test_an_hf_llama_runs_flash_as_on_cuda():
    """Hugging Face makes an explicit mask on fake tensors unless told they are not traced
    (ckptlab.worker.predict.fake.FakeSession.after_building): flash needs no mask."""
    model = hf_model("llama", hidden_size=64, num_attention_heads=1, intermediate_size=64)  # head_dim 64
    body = spec_dict(model=model, batch_size=2, steps=2, amp="bf16")
    assert predict_run(ExperimentSpec.model_validate(body), H100).prediction.sdpa_backend == "flash"


def test_bf16_is_refused_on_a_card_without_it():
    old = Target("old-gpu", "compute capability 7.5", "cuda", 2**34, (7, 5))
    with registered(old), pytest.raises(RunError, match="amp 'bf16' is not supported"):
        predict_run(spec(MLP, amp="bf16"), old)
