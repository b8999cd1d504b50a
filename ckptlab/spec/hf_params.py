"""Arithmetic of the ``hf`` architectures from their config values alone (no torch, no
transformers): parameter counts and activation floors for admission control
(:mod:`ckptlab.spec.limits`), and the vision models' feature maps (with which
:mod:`ckptlab.spec.hf_model` checks that a config's shapes fit together).

The formulas follow the modules of transformers 5.23 (``modeling_gpt2``, ``modeling_llama``,
``modeling_mistral``, ``modeling_qwen2``, ``modeling_resnet``, ``modeling_convnext``,
``modeling_vit``, ``modeling_swin``) as :mod:`ckptlab.worker.models.hf_models` builds them.
``tests/ckptlab/spec/test_hf_params.py`` checks the counts against ``sum(p.numel() for p in
model.parameters())`` of built models (tied weights counted once, as ``parameters()``
does; BatchNorm running statistics and rotary frequencies are buffers, not parameters);
``tests/ckptlab/spec/test_activation_floor.py`` checks the floors against measured peaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ckptlab.spec.kinds import ActivationFloor

__all__ = ["hf_param_count", "hf_activation_floor", "logits_bytes", "swin_grids", "convnext_maps", "resnet_layers"]


def _linear(cin: int, cout: int, bias: bool = True) -> int:
    return cin * cout + (cout if bias else 0)


def _gpt2(c: Mapping[str, Any], seq_len: int) -> int:
    d, v = c["hidden_size"], c["vocab_size"]
    inner = c["n_inner"] or 4 * d
    positions = max(1024, seq_len)  # ckptlab.worker.models.hf_models gives room for seq_len tokens
    block = 2 * 2 * d + _linear(d, 3 * d) + _linear(d, d) + _linear(d, inner) + _linear(inner, d)
    return v * d + positions * d + c["num_hidden_layers"] * block + 2 * d  # lm_head tied to wte


def _llama_like(c: Mapping[str, Any], qkv_bias: bool) -> int:
    d, v, heads = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    kv = c["num_key_value_heads"] or heads
    head_dim = d // heads
    attention = (
        _linear(d, heads * head_dim, qkv_bias)
        + 2 * _linear(d, kv * head_dim, qkv_bias)
        + _linear(heads * head_dim, d, bias=False)
    )
    mlp = 3 * d * c["intermediate_size"]  # gate, up, down without bias
    layer = attention + mlp + 2 * d  # two RMSNorms
    head = 0 if c["tie_word_embeddings"] else v * d
    return v * d + c["num_hidden_layers"] * layer + d + head


def _resnet(c: Mapping[str, Any], _size: int) -> int:
    def conv_bn(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + 2 * cout  # bias-free convolution, BatchNorm weight and bias

    def layer(cin: int, cout: int, stride: int) -> int:
        shortcut = conv_bn(cin, cout, 1) if cin != cout or stride != 1 else 0
        if c["layer_type"] == "basic":
            return shortcut + conv_bn(cin, cout, 3) + conv_bn(cout, cout, 3)
        mid = cout // 4
        return shortcut + conv_bn(cin, mid, 1) + conv_bn(mid, mid, 3) + conv_bn(mid, cout, 1)

    emb, sizes = c["embedding_size"], c["hidden_sizes"]
    total = conv_bn(c.get("num_channels", 3), emb, 7)
    stride = 2 if c.get("downsample_in_first_stage", False) else 1
    for i, depth in enumerate(c["depths"]):
        cin, cout = (emb if i == 0 else sizes[i - 1]), sizes[i]
        total += layer(cin, cout, stride if i == 0 else 2) + (depth - 1) * layer(cout, cout, 1)
    return total + _linear(sizes[len(c["depths"]) - 1], c["num_labels"])


def _convnext(c: Mapping[str, Any], _size: int) -> int:
    sizes, p = c["hidden_sizes"], c["patch_size"]
    total = _linear(3 * p * p, sizes[0]) + 2 * sizes[0]  # patch convolution, LayerNorm
    for i, depth in enumerate(c["depths"]):
        d = sizes[i]
        if i > 0:
            total += 2 * sizes[i - 1] + _linear(sizes[i - 1] * 4, d)  # LayerNorm, 2x2 convolution
        # depthwise 7x7, LayerNorm, 4x MLP, layer scale
        total += depth * (_linear(49, d) + 2 * d + _linear(d, 4 * d) + _linear(4 * d, d) + d)
    last = sizes[len(c["depths"]) - 1]
    return total + 2 * last + _linear(last, c["num_labels"])


def _vit(c: Mapping[str, Any], image_size: int) -> int:
    d, p = c["hidden_size"], c["patch_size"]
    patches = (image_size // p) ** 2
    embeddings = d + (patches + 1) * d + _linear(3 * p * p, d)  # CLS, positions, patch conv
    layer = 2 * 2 * d + 4 * _linear(d, d) + _linear(d, c["intermediate_size"]) + _linear(c["intermediate_size"], d)
    return embeddings + c["num_hidden_layers"] * layer + 2 * d + _linear(d, c["num_labels"])


def _swin(c: Mapping[str, Any], _size: int) -> int:
    dim, p, w = c["embed_dim"], c["patch_size"], c["window_size"]
    total = _linear(3 * p * p, dim) + 2 * dim  # patch convolution, LayerNorm
    stages = len(c["depths"])
    for i, (depth, heads) in enumerate(zip(c["depths"], c["num_heads"], strict=True)):
        bias_table = (2 * w - 1) ** 2 * heads
        block = 2 * 2 * dim + bias_table + 4 * _linear(dim, dim) + _linear(dim, 4 * dim) + _linear(4 * dim, dim)
        total += depth * block
        if i < stages - 1:  # patch merging: LayerNorm(4C), Linear(4C, 2C) without bias
            total += 2 * 4 * dim + 4 * dim * 2 * dim
            dim *= 2
    return total + 2 * dim + _linear(dim, c["num_labels"])


_COUNTERS: dict[str, Callable[[Mapping[str, Any], int], int]] = {
    "gpt2": _gpt2,
    "llama": lambda c, _n: _llama_like(c, qkv_bias=False),
    "mistral": lambda c, _n: _llama_like(c, qkv_bias=False),
    "qwen2": lambda c, _n: _llama_like(c, qkv_bias=True),
    "resnet": _resnet,
    "convnext": _convnext,
    "vit": _vit,
    "swin": _swin,
}


def hf_param_count(architecture: str, config: Mapping[str, Any], input_size: int) -> int:
    """Trainable parameters of an ``hf`` model, from its config values.

    Args:
        architecture: a key of :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES`.
        config: every config field of the architecture (the spec's values over the
            defaults: ``HFModelSpec.config_values``).
        input_size: ``seq_len`` (tokens) or ``image_size`` (pixels): GPT-2's position table
            and ViT's position embeddings depend on it.

    Returns:
        The number of parameters ``model.parameters()`` yields (tied weights once).

    Raises:
        KeyError: an unknown architecture.
    """
    return _COUNTERS[architecture](config, input_size)


# ----------------------------------------------------------------- feature maps

#: Bytes of a float32 element (the batch's images, the loss's log-probabilities) and of an
#: int64 one (token ids, labels, max-pool indices).
_F32, _I64 = 4, 8


def _halve_up(n: int) -> int:
    """A side after a stride-2 step that pads odd sides (3x3 convolution with padding 1,
    3x3 max-pool with padding 1, Swin's patch merging): ``ceil(n / 2)``."""
    return -(-n // 2)


def swin_grids(c: Mapping[str, Any], image_size: int) -> list[int]:
    """Side of each Swin stage's patch grid: ``ceil(image_size / patch_size)`` (the patch
    embedding pads the image), then halved rounding up by each patch merging."""
    grids = [-(-image_size // c["patch_size"])]
    for _ in c["depths"][1:]:
        grids.append(_halve_up(grids[-1]))
    return grids


def convnext_maps(c: Mapping[str, Any], image_size: int) -> list[int]:
    """Side of each ConvNeXt stage's map: ``image_size // patch_size`` (a stride-``patch``
    convolution, no padding), then halved rounding down by each later stage's 2x2 stride-2
    convolution."""
    maps = [image_size // c["patch_size"]]
    for _ in c["depths"][1:]:
        maps.append(maps[-1] // 2)
    return maps


def resnet_layers(c: Mapping[str, Any], image_size: int) -> tuple[int, list[tuple[int, int]]]:
    """A ResNet's side after its stem's 7x7 stride-2 convolution, and ``(channels, side)``
    of each layer's input in order (the blocks) followed by the last layer's output. The
    stem's 3x3 stride-2 max-pool halves the side again; each stage's first layer from the
    second (the first too with ``downsample_in_first_stage``) halves it with a stride-2
    convolution (all pad odd sides: :func:`_halve_up`)."""
    conv = _halve_up(image_size)
    channels, side = c["embedding_size"], _halve_up(conv)
    layers: list[tuple[int, int]] = []
    for i, depth in enumerate(c["depths"]):
        for j in range(depth):
            layers.append((channels, side))
            if j == 0 and (i > 0 or c.get("downsample_in_first_stage", False)):
                side = _halve_up(side)
            channels = c["hidden_sizes"][i]
    return conv, [*layers, (channels, side)]


# ----------------------------------------------------------------- activation floors


def logits_bytes(labels: int, e: int) -> int:
    """A classifier's logits the step holds (``e`` bytes each) and the cross-entropy's
    float32 log-probabilities with their incoming gradient, bytes per sample."""
    return labels * (e + 2 * _F32)


def _decoder_floor(c: Mapping[str, Any], seq_len: int, e: int) -> ActivationFloor:
    """A causal LM: the batch is ``seq_len`` int64 token ids (the labels are the same
    tensor); each decoder layer's input is ``seq_len × hidden_size``; the final norm keeps
    its input and the LM head its input (``2 × seq_len × hidden_size``); the loss
    (transformers' ``ForCausalLMLoss``: ``logits.float()``, cross-entropy over every
    position) keeps the float32 log-probabilities and meets their gradient
    (``2 × seq_len × vocab_size × 4 B``)."""
    hidden = seq_len * c["hidden_size"] * e
    return ActivationFloor(
        batch=seq_len * _I64,
        blocks=(hidden,) * c["num_hidden_layers"],
        kept=2 * hidden + 2 * seq_len * c["vocab_size"] * _F32,
        fields=("seq_len", "vocab_size", "hidden_size", "num_hidden_layers"),
    )


def _images(image_size: int) -> int:
    """An image classifier's batch per sample: a float32 RGB image and an int64 label."""
    return 3 * image_size * image_size * _F32 + _I64


def _vit_floor(c: Mapping[str, Any], image_size: int, e: int) -> ActivationFloor:
    """ViT: ``(image_size // patch_size)² + 1`` tokens (the patches and CLS) of
    ``hidden_size`` enter each encoder layer; the final LayerNorm keeps the last layer's
    output; the patch convolution keeps the image (the batch)."""
    tokens = (image_size // c["patch_size"]) ** 2 + 1
    hidden = tokens * c["hidden_size"] * e
    return ActivationFloor(
        batch=_images(image_size),
        blocks=(hidden,) * c["num_hidden_layers"],
        kept=hidden + logits_bytes(c["num_labels"], e),
        fields=("image_size", "hidden_size", "num_hidden_layers"),
    )


def _swin_floor(c: Mapping[str, Any], image_size: int, e: int) -> ActivationFloor:
    """Swin: stage ``i`` takes a ``grid_i² × embed_dim·2^i`` sequence (:func:`swin_grids`);
    the patch embedding's LayerNorm keeps the first one, the final LayerNorm the last
    stage's output."""
    maps = [g * g * c["embed_dim"] * 2**i * e for i, g in enumerate(swin_grids(c, image_size))]
    return ActivationFloor(
        batch=_images(image_size),
        blocks=tuple(maps),
        kept=maps[0] + maps[-1] + logits_bytes(c["num_labels"], e),
        fields=("image_size", "embed_dim", "depths"),
    )


def _convnext_floor(c: Mapping[str, Any], image_size: int, e: int) -> ActivationFloor:
    """ConvNeXt: the blocks are every stage's downsampling layer (from the second stage,
    taking the previous stage's map) and its layers (taking ``side² × hidden_sizes[i]``,
    :func:`convnext_maps`); the stem's LayerNorm keeps the first map."""
    maps = [s * s * width * e for s, width in zip(convnext_maps(c, image_size), c["hidden_sizes"], strict=False)]
    blocks: list[int] = []
    for i, depth in enumerate(c["depths"]):
        blocks += ([maps[i - 1]] if i else []) + [maps[i]] * depth
    return ActivationFloor(
        batch=_images(image_size),
        blocks=tuple(blocks),
        kept=maps[0] + logits_bytes(c["num_labels"], e),
        fields=("image_size", "hidden_sizes", "depths"),
    )


def _resnet_floor(c: Mapping[str, Any], image_size: int, e: int) -> ActivationFloor:
    """ResNet: the stem's BatchNorm keeps its input and its ReLU its output
    (``2 × embedding_size × conv_side²``), the max-pool its int64 indices; each layer takes
    the previous one's output (:func:`resnet_layers`); the pooler keeps the last layer's
    output."""
    conv, layers = resnet_layers(c, image_size)
    sizes = [channels * side * side * e for channels, side in layers]
    emb, pooled = layers[0]
    stem = 2 * emb * conv * conv * e + emb * pooled * pooled * _I64
    return ActivationFloor(
        batch=_images(image_size),
        blocks=tuple(sizes[:-1]),
        kept=stem + sizes[-1] + logits_bytes(c["num_labels"], e),
        fields=("image_size", "embedding_size", "hidden_sizes", "depths"),
    )


_FLOORS: dict[str, Callable[[Mapping[str, Any], int, int], ActivationFloor]] = {
    "gpt2": _decoder_floor,
    "llama": _decoder_floor,
    "mistral": _decoder_floor,
    "qwen2": _decoder_floor,
    "resnet": _resnet_floor,
    "convnext": _convnext_floor,
    "vit": _vit_floor,
    "swin": _swin_floor,
}


def hf_activation_floor(
    architecture: str, config: Mapping[str, Any], input_size: int, element_bytes: int
) -> ActivationFloor:
    """What one training step of an ``hf`` model holds per sample whatever is
    checkpointed (see :class:`ckptlab.spec.kinds.ActivationFloor`), from its config values.

    Args:
        architecture: a key of :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES`.
        config: every config field of the architecture (``HFModelSpec.config_values``).
        input_size: ``seq_len`` (tokens) or ``image_size`` (pixels).
        element_bytes: bytes of an activation element (4; 2 under autocast).

    Returns:
        Bytes per sample; each architecture's docstring here says what it counts (shapes
        after the transformers modules named in this module's docstring).

    Raises:
        KeyError: an unknown architecture.
    """
    return _FLOORS[architecture](config, input_size, element_bytes)
