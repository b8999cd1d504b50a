"""``ckptlab.worker.models.user_model``: a model in hand made ready for the engine: blocks found by the
model's own layout (transformers) or the longest same-type container, mapping samples, the
loss a model output carries, and a ValueError that says what to pass when the blocks or the
output cannot be checkpointed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.models.user_model import find_blocks, prepare_model
from tests.factories import hf_model

transformers = pytest.importorskip("transformers")


def tiny_hf(architecture: str) -> nn.Module:
    from ckptlab.worker.models.hf_models import _config

    spec = ExperimentSpec.model_validate({"model": hf_model(architecture)}).model
    config = _config(spec)
    config.use_cache = True  # as a model built by a user would have it
    auto = (
        transformers.AutoModelForCausalLM
        if spec.arch.family == "causal_lm"
        else transformers.AutoModelForImageClassification
    )
    return auto.from_config(config)


def test_a_llama_with_a_dict_sample_uses_its_decoder_layers_and_its_own_loss():
    torch.manual_seed(0)
    model = tiny_hf("llama")
    tokens = torch.randint(0, 100, (2, 16))
    ready = prepare_model(model, {"input_ids": tokens, "labels": tokens})
    assert ready.depth == model.config.num_hidden_layers == 3
    assert ready.blocks == "3 × LlamaDecoderLayer: transformers layout"
    assert ready.model == f"LlamaForCausalLM ({sum(p.numel() for p in model.parameters()):,} parameters)"
    built = ready.build()
    x, y = built.make_batch(2, torch.Generator())
    loss = built.loss_fn(built.module(x), y)
    assert torch.allclose(loss, model(input_ids=tokens, labels=tokens).loss)  # the model's own causal-LM loss
    assert model.config.use_cache is True  # the user's model is untouched; the copy has no KV cache


def test_a_hf_resnet_gets_every_stage_not_only_the_first():
    model = tiny_hf("resnet")
    ready = prepare_model(model, (torch.randn(2, 3, 32, 32), torch.randint(0, 4, (2,))))
    assert ready.depth == sum(model.config.depths) == 3
    assert ready.blocks.endswith("transformers layout")
    assert len(model.resnet.encoder.stages) == 2  # the user's model is not regrouped, its copies are
    # The generic rule alone would take one stage's layers only.
    assert len(model.get_submodule(find_blocks(model))) < ready.depth


class _Shuffled(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        return self.layers[2](self.layers[0](x)).sum()  # skips block 1


class _DictBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return {"hidden": self.lin(x)}


class _DictNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_DictBlock() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)["hidden"]
        return x


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_Shuffled(), r"calls its blocks as \[0, 2\], not once each in order \[0, 1, 2\]: pass blocks="),
        (_DictNet(), r"block 0 \(_DictBlock\) returns dict: pass blocks="),
    ],
)
def test_blocks_that_cannot_be_checkpointed_raise_what_to_pass(model, message):
    with pytest.raises(ValueError, match=message):
        prepare_model(model, torch.randn(2, 4))


def test_a_sample_of_another_shape_and_a_model_that_raises_say_so():
    with pytest.raises(ValueError, match="sample must be a tensor"):
        prepare_model(_DictNet(), [torch.randn(2, 4)])
    with pytest.raises(ValueError, match=r"model\(sample\) failed before any checkpointing: RuntimeError"):
        prepare_model(_DictNet(), torch.randn(2, 5))
    with pytest.raises(ValueError, match="blocks='nope'"):
        prepare_model(_DictNet(), torch.randn(2, 4), blocks="nope")
