"""Hugging Face ``transformers`` models for the ``hf`` model kind, built from a config with
random weights (``from_config``: nothing is downloaded), and their blocks.

- Causal language models (``gpt2``, ``llama``, ``mistral``, ``qwen2``): inputs
  ``(B, seq_len)`` random token ids; the loss is the model's own causal-LM loss with the
  inputs as labels (``labels=input_ids``, shifted inside the model); the blocks are the
  decoder layers (``transformer.h`` / ``model.layers``), which take the hidden states plus
  keyword arguments (``attention_mask``, ``position_embeddings``, ...) and are regrouped as
  they are (:mod:`ckptlab.worker.engine.strategies`).
- Image classifiers (``resnet``, ``convnext``, ``vit``, ``swin``): inputs ``(B, 3,
  image_size, image_size)`` random images, targets ``(B,)`` random labels; cross-entropy
  on the logits (what the model computes with ``labels``). Blocks: ViT's encoder layers;
  Swin's stages (patch merging included); ResNet's and ConvNeXt's stages are flattened into
  one ``nn.Sequential`` of their layers (downsampling included) that replaces the encoder's
  stage list, so that a segment may span stages. The parameters are the same objects: the
  model computes exactly what it did.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ckptlab.spec.experiment import HFModelSpec
from ckptlab.worker.models.base import WrappedModel

__all__ = ["build_hf", "hf_blocks"]


class _CausalLM(WrappedModel):
    """``input_ids -> loss``: the wrapped model's causal-LM loss on its own inputs."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=input_ids, use_cache=False).loss


class _Classifier(WrappedModel):
    """``pixel_values -> logits`` of the wrapped image classifier."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def _flatten_stages(encoder: nn.Module) -> nn.Sequential:
    """Replace ``encoder.stages`` by one stage holding every stage's layers in order (a
    ConvNeXt stage's downsampling layers first, as a ``Sequential``); returns it."""
    flat: list[nn.Module] = []
    for stage in encoder.stages:
        downsampling = getattr(stage, "downsampling_layer", None)
        if downsampling is not None and len(downsampling) > 0:
            flat.append(nn.Sequential(*downsampling))
        flat.extend(stage.layers)
    merged = nn.Sequential(*flat)
    encoder.stages = nn.ModuleList([merged])
    return merged


def hf_blocks(model: nn.Module) -> nn.ModuleList | nn.Sequential | None:
    """The repeated blocks of a ``transformers`` model of a known family, in the order its
    forward applies them: decoder layers (``model.layers``, ``transformer.h``), encoder
    layers (``encoder.layer``), Swin stages (``encoder.layers``), or ResNet / ConvNeXt
    stages flattened into one ``nn.Sequential`` (this changes ``model``: see the module's
    docstring). None for a model of another family."""
    base = getattr(model, "base_model", model)
    for path in ("layers", "h", "encoder.layer", "encoder.layers"):
        try:
            found = base.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(found, (nn.ModuleList, nn.Sequential)):
            return found
    encoder = getattr(base, "encoder", None)
    if encoder is not None and isinstance(getattr(encoder, "stages", None), nn.ModuleList):
        return _flatten_stages(encoder)
    return None


def _config(spec: HFModelSpec) -> Any:
    """The ``transformers`` config of ``spec``: the spec's fields over the class defaults,
    with what the spec implies: positions for ``seq_len`` tokens, special token ids inside
    a small vocabulary, ``image_size``, ConvNeXt's ``num_stages`` from its ``depths``."""
    import transformers

    config_class = getattr(transformers, spec.arch.config_class)
    values: dict[str, Any] = dict(spec.config_overrides)
    if spec.arch.family == "causal_lm":
        defaults = config_class()
        vocab = values.get("vocab_size", defaults.vocab_size)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token = getattr(defaults, name, None)
            if isinstance(token, int) and token >= vocab:
                values[name] = vocab - 1
        for name in ("max_position_embeddings", "n_positions"):  # room for seq_len tokens
            if hasattr(defaults, name):
                values[name] = max(getattr(defaults, name), spec.input_size)
        values["use_cache"] = False
    else:
        if spec.architecture in ("vit", "swin"):
            values["image_size"] = spec.input_size
        if spec.architecture == "convnext" and "depths" in values:
            values["num_stages"] = len(values["depths"])
    return config_class(**values)


def build_hf(spec: HFModelSpec):
    """Build the ``hf`` model a spec describes, as a :class:`ckptlab.worker.models.build.Built`.

    Raises:
        ValueError: the config is refused by ``transformers`` (its message names why) or no
            blocks were found.
    """
    import transformers

    from ckptlab.worker.models.base import Built, default_loss

    config = _config(spec)
    causal = spec.arch.family == "causal_lm"
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForImageClassification
    kwargs = {"attn_implementation": spec.attn_implementation} if spec.arch.attention else {}
    try:
        model = auto.from_config(config, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"transformers refused the {spec.architecture} config: {exc}") from exc
    blocks = hf_blocks(model)
    if blocks is None or len(blocks) != spec.depth:
        raise ValueError(
            f"{type(model).__name__}: expected {spec.depth} blocks, found {None if blocks is None else len(blocks)}"
        )
    n = spec.input_size
    if causal:
        vocab = config.vocab_size

        def make_batch(batch_size: int, gen: torch.Generator):
            tokens = torch.randint(0, vocab, (batch_size, n), generator=gen)
            return tokens, torch.empty(0)

        return Built(_CausalLM(model), blocks, make_batch, lambda loss, _targets: loss)

    labels = config.num_labels
    channels = getattr(config, "num_channels", 3)

    def make_images(batch_size: int, gen: torch.Generator):
        images = torch.randn(batch_size, channels, n, n, generator=gen)
        return images, torch.randint(0, labels, (batch_size,), generator=gen)

    return Built(_Classifier(model), blocks, make_images, default_loss)
