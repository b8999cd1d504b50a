"""Parameter counts of the ``hf`` architectures from their config values alone (no torch,
no transformers), for admission control (:mod:`ckptlab.spec.limits`).

The formulas follow the modules of transformers 5.23 (``modeling_gpt2``, ``modeling_llama``,
``modeling_mistral``, ``modeling_qwen2``, ``modeling_resnet``, ``modeling_convnext``,
``modeling_vit``, ``modeling_swin``) as :mod:`ckptlab.worker.models.hf_models` builds them;
``tests/ckptlab/spec/test_hf_params.py`` checks them against ``sum(p.numel() for p in
model.parameters())`` of built models (tied weights counted once, as ``parameters()``
does). BatchNorm running statistics and rotary frequencies are buffers, not parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["hf_param_count"]


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
