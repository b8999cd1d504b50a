"""``ckptlab.spec.hf_model``'s shape rules are exact: a config at each rule's boundary passes
validation and trains one step on the real transformers model; the config just past it is
refused naming the field, and the real model fails on it (issue 33: configs that can never
run were accepted, then failed on the worker)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_model import HFModelSpec

DECODER = {"num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 50, "seq_len": 8}
SWIN = {"embed_dim": 8, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1], "num_labels": 2}
CONVNEXT = {"hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1], "num_labels": 2}
VIT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "num_labels": 2}
RESNET = {"embedding_size": 8, "depths": [1, 1], "num_labels": 2}


def _heads(n: int) -> dict:
    return {"hidden_size": 24, "num_attention_heads": n, "num_key_value_heads": n}


#: (architecture, config at the boundary, config just past it, the field the refusal names)
CASES = [
    # The ConvNeXt: 16 px leaves 4x4 after the stem, halved three times; 32 px is the least.
    ("convnext", {**CONVNEXT, "image_size": 32}, {**CONVNEXT, "image_size": 31}, "image_size"),
    ("convnext", {**CONVNEXT, "image_size": 32}, {**CONVNEXT, "image_size": 16}, "image_size"),
    (
        "convnext",
        {**CONVNEXT, "image_size": 64, "patch_size": 8},
        {**CONVNEXT, "image_size": 64, "patch_size": 9},
        "image_size",
    ),
    # The Swin: window 7 needs a 7x7 grid at the last of 4 stages: 193 px at patch 4.
    (
        "swin",
        {**SWIN, "window_size": 7, "image_size": 193},
        {**SWIN, "window_size": 7, "image_size": 192},
        "window_size",
    ),
    ("swin", {**SWIN, "window_size": 1, "image_size": 16}, {**SWIN, "window_size": 7, "image_size": 16}, "window_size"),
    ("swin", {**SWIN, "window_size": 2, "image_size": 33}, {**SWIN, "window_size": 2, "image_size": 32}, "window_size"),
    (
        "swin",
        {**SWIN, "embed_dim": 32, "depths": [1, 1], "num_heads": [2, 4], "window_size": 2, "image_size": 32},
        {**SWIN, "embed_dim": 32, "depths": [1, 1], "num_heads": [3, 3], "window_size": 2, "image_size": 32},
        "num_heads",
    ),
    ("vit", {**VIT, "patch_size": 16, "image_size": 16}, {**VIT, "patch_size": 17, "image_size": 16}, "patch_size"),
    *[
        (a, {**DECODER, **_heads(6)}, {**DECODER, **_heads(8)}, "num_attention_heads")  # 4 or 3 features per head
        for a in ("llama", "mistral", "qwen2")
    ],
    (
        "resnet",
        {**RESNET, "hidden_sizes": [4, 8], "layer_type": "bottleneck", "image_size": 64},
        {**RESNET, "hidden_sizes": [3, 8], "layer_type": "bottleneck", "image_size": 64},
        "hidden_sizes",
    ),
]


def _train_one_step(model: HFModelSpec, batch_size: int = 2) -> None:
    """Build ``model`` with transformers and run one forward and backward."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ckptlab.worker.models.hf_models import build_hf

    torch.manual_seed(0)
    built = build_hf(model)
    x, y = built.make_batch(batch_size, torch.Generator().manual_seed(0))
    built.loss_fn(built.module(x), y).backward()


def _unchecked(architecture: str, config: dict) -> HFModelSpec:
    """The model of ``config`` without validation (the rules would refuse it)."""
    return HFModelSpec.model_construct(architecture=architecture, **config)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")  # a bottleneck of 0 channels
@pytest.mark.parametrize(("architecture", "ok", "past", "field"), CASES, ids=lambda v: str(v)[:40])
def test_a_rule_passes_its_boundary_and_refuses_what_cannot_run(architecture, ok, past, field):
    spec = ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": architecture, **ok}})
    _train_one_step(spec.model)
    with pytest.raises(ValidationError) as refused:
        ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": architecture, **past}})
    (error,) = refused.value.errors()
    assert error["loc"] == ("model", field), error
    with pytest.raises((RuntimeError, ValueError)):
        _train_one_step(_unchecked(architecture, past))


def test_a_resnet_batch_norm_needs_more_than_one_value_per_channel():
    # 32 px: the last of 4 stages is 1x1, so batch_size 1 gives one value per channel.
    model = {"kind": "hf", "architecture": "resnet", **RESNET, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1]}
    small = {**model, "layer_type": "basic", "image_size": 32}
    ExperimentSpec.model_validate({"model": small, "batch_size": 2})
    _train_one_step(_unchecked("resnet", {k: v for k, v in small.items() if k not in ("kind", "architecture")}), 2)
    with pytest.raises(ValidationError) as refused:
        ExperimentSpec.model_validate({"model": small, "batch_size": 1})
    (error,) = refused.value.errors()
    assert error["loc"] == ("batch_size",) and "1×1" in error["msg"], error
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        _train_one_step(_unchecked("resnet", {k: v for k, v in small.items() if k not in ("kind", "architecture")}), 1)
    # 64 px keeps a 2x2 map: one sample is enough.
    ExperimentSpec.model_validate({"model": {**small, "image_size": 64}, "batch_size": 1})


def test_the_catalog_examples_and_defaults_at_their_published_sizes_pass():
    from ckptlab.spec.hf_catalog import HF_ARCHITECTURES

    for name, arch in HF_ARCHITECTURES.items():
        ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": name, **arch.public()["example"]}})
        size = {"image_size": 224} if arch.family == "image_classification" else {}
        ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": name, **size}})
