"""The ``hf`` model kind: every listed Hugging Face architecture, built from a tiny config with
random weights and no network, runs under every strategy with gradients that match; its
activation bytes equal an independent count of what autograd saves for backward."""

from __future__ import annotations

import pytest
import torch

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.training import build_checkpointed
from tests.factories import hf_model, spec_dict

pytestmark = pytest.mark.usefixtures("no_network")

STRATEGIES = [
    {"strategy": "none"},
    {"strategy": "sequential", "segments": 2},
    {"strategy": "per_block"},
    {"strategy": "selective", "policy": "save_matmuls"},
    {"strategy": "offload"},
]


def hf_spec(architecture: str, checkpoint: dict, **overrides) -> ExperimentSpec:
    body = spec_dict(steps=2, batch_size=2, **overrides)
    body["model"] = hf_model(architecture)
    body["checkpoint"] = {**body["checkpoint"], **checkpoint}
    return ExperimentSpec.model_validate(body)


@pytest.mark.parametrize("checkpoint", STRATEGIES, ids=[s["strategy"] for s in STRATEGIES])
@pytest.mark.parametrize("architecture", sorted(HF_ARCHITECTURES))
def test_every_architecture_runs_every_strategy_with_matching_gradients(architecture, checkpoint):
    summary = run_experiment(hf_spec(architecture, checkpoint)).dump()
    assert summary["activation_bytes"] > 0
    assert summary["params_without_grad"] == 0
    if checkpoint["strategy"] != "none":
        assert summary["gradients_match"] is True, (summary["grad_worst_param"], summary["grad_max_abs_diff"])


@pytest.mark.parametrize("architecture", ["gpt2", "llama", "vit", "swin", "resnet", "convnext"])
def test_checkpointing_every_block_keeps_less_than_none(architecture):
    none = run_experiment(hf_spec(architecture, {"strategy": "none"}, verify_gradients=False)).dump()
    per_block = run_experiment(hf_spec(architecture, {"strategy": "per_block"}, verify_gradients=False)).dump()
    assert per_block["activation_bytes"] < none["activation_bytes"]


def saved_for_backward_bytes(spec: ExperimentSpec) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward (hooks of
    ``torch.autograd.graph.saved_tensors_hooks``), besides the parameters, buffers and the
    batch, plus the output's own storage when nothing saved it: what a forward leaves alive."""
    dev = torch.device("cpu")
    built = build_checkpointed(spec, dev)
    gen = torch.Generator().manual_seed(spec.seed)
    inputs, _targets = built.make_batch(spec.batch_size, gen)
    before = {t.untyped_storage().data_ptr() for t in [*built.module.parameters(), *built.module.buffers(), inputs]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in before and storage.nbytes() > 0:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = built.module(inputs)
    out_storage = out.untyped_storage()
    saved.setdefault(out_storage.data_ptr(), out_storage.nbytes())
    return sum(saved.values())


@pytest.mark.parametrize(
    "architecture",
    ["gpt2", "llama", "mistral", "qwen2", "resnet", "convnext", "vit", "swin"],
)
def test_activation_bytes_equal_what_autograd_saves(architecture):
    # Without dropout (RNG masks are saved as well, but an engine's second forward would
    # draw other masks than the reference's): the count must agree to 1%.
    no_dropout = {
        "gpt2": {"resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0},
        "swin": {"drop_path_rate": 0.0},
    }.get(architecture, {})
    body = spec_dict(steps=2, batch_size=2, verify_gradients=False)
    body["model"] = hf_model(architecture, **no_dropout)
    spec = ExperimentSpec.model_validate(body)
    measured = run_experiment(spec).dump()["activation_bytes"]
    reference = saved_for_backward_bytes(spec)
    assert measured == pytest.approx(reference, rel=0.01), (measured, reference)


def test_reentrant_checkpoint_of_layers_with_keyword_arguments_is_refused_with_why():
    with pytest.raises(ValueError, match="keyword tensor arguments"):
        hf_spec("llama", {"strategy": "per_block", "use_reentrant": True})
    # Vision layers that take one tensor run reentrant.
    summary = run_experiment(hf_spec("resnet", {"strategy": "per_block", "use_reentrant": True})).dump()
    assert summary["gradients_match"] is True


def test_eager_attention_keeps_more_than_sdpa():
    sdpa = run_experiment(hf_spec("llama", {"strategy": "none"}, verify_gradients=False)).dump()
    body = spec_dict(steps=2, batch_size=2, verify_gradients=False)
    body["model"] = hf_model("llama", attn_implementation="eager")
    eager = run_experiment(ExperimentSpec.model_validate(body)).dump()
    assert eager["activation_bytes"] > sdpa["activation_bytes"]


def forward_live_bytes(module: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Bytes a training forward of ``module`` leaves alive (the exact CPU tracker), besides
    the parameters, buffers and the batch."""
    from ckptlab.worker.measure.memory import LiveTensorTracker

    module.train()
    with LiveTensorTracker() as tracker:
        for t in [*module.parameters(), *module.buffers(), inputs]:
            tracker.track(t)
        before = tracker.live_bytes
        out = module(inputs)
        kept = tracker.live_bytes - before
    del out
    return kept


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_per_block_keeps_what_transformers_own_gradient_checkpointing_keeps(architecture):
    # The ecosystem's per-layer checkpointing (``activation_checkpointing_enable``, non-reentrant)
    # on the same weights and batch: ckptlab's per_block keeps the same bytes to 1%.
    no_dropout = {"resid_pdrop": 0.0, "attn_pdrop": 0.0, "embd_pdrop": 0.0} if architecture == "gpt2" else {}
    body = spec_dict(steps=2, batch_size=2, verify_gradients=False, checkpoint={"strategy": "per_block"})
    body["model"] = hf_model(architecture, **no_dropout)
    spec = ExperimentSpec.model_validate(body)
    from ckptlab.worker.engine.strategies import apply_strategy
    from ckptlab.worker.models.build import build_model

    theirs, ours = build_model(spec.model), build_model(spec.model)
    ours.module.load_state_dict(theirs.module.state_dict())
    apply_strategy(ours.blocks, spec.checkpoint, device=torch.device("cpu"))
    hf = theirs.module.model
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.24
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs, _ = ours.make_batch(spec.batch_size, torch.Generator().manual_seed(0))
    assert forward_live_bytes(ours.module, inputs) == pytest.approx(forward_live_bytes(theirs.module, inputs), rel=0.01)
