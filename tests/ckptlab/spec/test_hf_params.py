"""``ckptlab.spec.hf_params``: the parameter count admission control computes for an ``hf`` spec
equals what the worker builds, for tiny configs, variants of each field that changes the
count, and the full-size defaults (built on the ``meta`` device: no memory)."""

from __future__ import annotations

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
from ckptlab.spec.limits import estimate_param_count
from tests.factories import hf_model

VARIANTS = [
    ("gpt2", {"n_inner": 40, "seq_len": 2000}),  # an MLP width of its own, positions past 1024
    ("llama", {"tie_word_embeddings": True}),
    ("qwen2", {"num_key_value_heads": 2}),  # biased q/k/v projections, grouped-query heads
    ("resnet", {"layer_type": "basic", "embedding_size": 16}),  # a shortcut in stage 1
    ("convnext", {"depths": [1, 1, 1], "hidden_sizes": [8, 16, 24]}),
    ("vit", {"image_size": 48}),  # more patches, more position embeddings
    ("swin", {"window_size": 4, "image_size": 64}),  # a larger relative-position bias table (runs at 64 px)
]
FULL_SIZE = [(a, {"image_size": 224} if a in ("vit", "swin") else {}) for a in sorted(HF_ARCHITECTURES)]


def built_count(model: dict, device: str = "cpu") -> tuple[int, int | None]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ckptlab.worker.models.hf_models import build_hf

    spec = ExperimentSpec.model_validate({"model": model})
    with torch.device(device):
        built = build_hf(spec.model)
    return sum(p.numel() for p in built.module.parameters()), estimate_param_count(spec)


@pytest.mark.parametrize(("architecture", "overrides"), [(a, {}) for a in sorted(HF_ARCHITECTURES)] + VARIANTS, ids=str)
def test_tiny_configs_count_exactly(architecture, overrides):
    real, estimate = built_count(hf_model(architecture, **overrides))
    assert estimate == real


@pytest.mark.parametrize(("architecture", "overrides"), FULL_SIZE, ids=str)
def test_full_size_defaults_count_exactly(architecture, overrides):
    real, estimate = built_count({"kind": "hf", "architecture": architecture, **overrides}, device="meta")
    assert estimate == real
    assert real > 10_000_000  # the defaults are the published sizes (GPT-2 124 M, Llama 6.7 B, ...)
