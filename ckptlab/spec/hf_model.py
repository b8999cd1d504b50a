"""The ``hf`` model of the experiment spec: a Hugging Face ``transformers`` architecture and
the config fields it sets, checked against :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES` (no
transformers import), and the shape rules a config must meet to run at all
(:func:`hf_shape_problem`, :func:`hf_batch_problem`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ckptlab.spec.base import _field_error, _Strict, integral, spec_int
from ckptlab.spec.hf_catalog import ATTN_IMPLEMENTATIONS, HF_ARCHITECTURES, HFArchitecture, HFField
from ckptlab.spec.hf_params import convnext_maps, resnet_layers, swin_grids

__all__ = ["HFModelSpec", "DEFAULT_SEQ_LEN", "DEFAULT_IMAGE_SIZE", "hf_shape_problem", "hf_batch_problem"]

#: ``seq_len`` of a language model and ``image_size`` of a vision model that give none.
DEFAULT_SEQ_LEN, DEFAULT_IMAGE_SIZE = 128, 64
#: Spec fields of an ``hf`` model that are not config fields.
_HF_OWN_FIELDS = ("kind", "architecture", "attn_implementation", "seq_len", "image_size")


class HFModelSpec(_Strict):
    """A Hugging Face ``transformers`` model built from its config with random weights
    (nothing downloaded): a causal LM (``gpt2``, ``llama``, ``mistral``, ``qwen2``:
    ``AutoModelForCausalLM.from_config``, the model's own causal-LM loss on random tokens)
    or an image classifier (``resnet``, ``convnext``, ``vit``, ``swin``:
    ``AutoModelForImageClassification.from_config``, cross-entropy on random images).

    The config fields sit beside ``kind`` (``{"kind": "hf", "architecture": "llama",
    "hidden_size": 256, "num_hidden_layers": 4}``); those left out take the config class's
    defaults, listed with their bounds in :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES` (and ``GET
    /api/meta``). An unknown field is an error naming it.

    Args:
        architecture: one of :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES`.
        attn_implementation: ``sdpa`` (fused attention, default) or ``eager`` (the attention
            matrix is materialised and saved for backward: far more activation memory).
        seq_len: tokens per sample (language models only; default 128).
        image_size: height and width of the input images, pixels (vision models only;
            default 64).

    Shapes: language models take ``(batch_size, seq_len)`` token ids; vision models
    ``(batch_size, 3, image_size, image_size)`` images and ``(batch_size,)`` labels.
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)

    kind: Literal["hf"] = "hf"
    architecture: Literal[tuple(HF_ARCHITECTURES)] = Field(  # type: ignore[valid-type]
        description="a transformers architecture, built from its config with random weights"
    )
    attn_implementation: Literal[ATTN_IMPLEMENTATIONS] = Field(  # type: ignore[valid-type]
        "sdpa", title="Attention", description="sdpa: fused; eager: the attention matrix is kept for backward"
    )
    seq_len: spec_int(ge=2, le=32768) | None = Field(
        None, description=f"tokens per sample (language models; empty: {DEFAULT_SEQ_LEN})"
    )
    image_size: spec_int(ge=16, le=1024) | None = Field(
        None, description=f"image height and width, pixels (vision models; empty: {DEFAULT_IMAGE_SIZE})"
    )

    @model_validator(mode="before")
    @classmethod
    def _config_fields(cls, data: Any) -> Any:
        name = data.get("architecture") if isinstance(data, dict) else None
        if not isinstance(name, str) or name not in HF_ARCHITECTURES:
            return data  # the field's own validation names what is wrong
        arch = HF_ARCHITECTURES[data["architecture"]]
        data = dict(data)
        unused = "image_size" if arch.family == "causal_lm" else "seq_len"
        for name, value in data.items():
            if name in _HF_OWN_FIELDS:
                continue
            if name not in arch.fields:
                known = ", ".join([*(f for f in _HF_OWN_FIELDS[2:] if f != unused), *arch.fields])
                raise _field_error(
                    (name,), value, f"unknown field for hf {data['architecture']!r}; expected one of {known}"
                )
            if arch.fields[name].type == "int":
                value = data[name] = integral(value)
            elif arch.fields[name].type == "int_list" and isinstance(value, list):
                value = data[name] = [integral(v) for v in value]
            problem = _hf_field_problem(arch.fields[name], value)
            if problem:
                raise _field_error((name,), value, problem)
        if data.get(unused) is not None:
            raise _field_error((unused,), data[unused], f"{unused} does not apply to {arch.family} models")
        return data

    @model_validator(mode="after")
    def _cross_field(self) -> HFModelSpec:
        c = self.config_values
        heads = c.get("num_attention_heads")
        if heads is not None and "hidden_size" in c and c["hidden_size"] % heads:
            raise _field_error(
                ("num_attention_heads",), heads, f"heads ({heads}) must divide hidden_size ({c['hidden_size']})"
            )
        kv = c.get("num_key_value_heads")
        origin = "given" if "num_key_value_heads" in self.config_overrides else "the config default"
        if kv is not None and heads % kv:
            raise _field_error(
                ("num_key_value_heads",),
                kv,
                f"num_key_value_heads ({kv}, {origin}) must divide num_attention_heads ({heads})",
            )
        for other in ("hidden_sizes", "num_heads"):
            if other in c and len(c[other]) != len(c["depths"]):
                raise _field_error(
                    (other,), c[other], f"{other} needs one value per stage ({len(c['depths'])} stages in depths)"
                )
        problem = hf_shape_problem(self.architecture, c, self.input_size)
        if problem:
            raise _field_error((problem[0],), problem[1], problem[2])
        return self

    def batch_problem(self, batch_size: int) -> str | None:
        """Why ``batch_size`` samples cannot train this model (:func:`hf_batch_problem`), or None."""
        return hf_batch_problem(self.architecture, self.config_values, self.input_size, batch_size)

    @property
    def arch(self) -> HFArchitecture:
        """The architecture's entry in :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES`."""
        return HF_ARCHITECTURES[self.architecture]

    @property
    def config_overrides(self) -> dict[str, Any]:
        """The config fields this spec sets (the rest take the config class's defaults)."""
        return dict(self.model_extra or {})

    @property
    def config_values(self) -> dict[str, Any]:
        """Every config field of the architecture: the spec's value, else the default."""
        return {name: f.default for name, f in self.arch.fields.items()} | self.config_overrides

    @property
    def depth(self) -> int:
        """The number of blocks (decoder layers, encoder layers, stage layers or stages)."""
        return self.arch.depth(self.config_values)

    @property
    def input_size(self) -> int:
        """``seq_len`` (default 128) for a language model, ``image_size`` (default 64) else."""
        if self.arch.family == "causal_lm":
            return self.seq_len or DEFAULT_SEQ_LEN
        return self.image_size or DEFAULT_IMAGE_SIZE


def _hf_field_problem(f: HFField, value: Any) -> str | None:
    """Why ``value`` does not fit the config field ``f`` (None when it does)."""

    def number(v: Any, kind: str) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) if kind == "int" else isinstance(v, (int, float))
        if not ok or isinstance(v, bool):
            return f"expected {'an integer' if kind == 'int' else 'a number'}"
        if (f.ge is not None and v < f.ge) or (f.le is not None and v > f.le):
            return f"must be between {f.ge} and {f.le}"
        return None

    if f.type == "bool":
        return None if isinstance(value, bool) else "expected true or false"
    if f.type == "choice":
        return None if value in f.choices else f"expected one of {', '.join(f.choices)}"
    if f.type in ("int", "float"):
        return number(value, f.type)
    if not isinstance(value, list) or not 1 <= len(value) <= f.max_items:
        return f"expected a list of 1 to {f.max_items} numbers"
    problems = [number(v, f.type.removesuffix("_list")) for v in value]
    return next((p for p in problems if p), None)


# ----------------------------------------------------------------- shape rules

#: Why a config cannot run: ``(field, value, message)``.
Problem = tuple[str, Any, str]


def _rotary_problem(c: Mapping[str, Any], _size: int) -> Problem | None:
    """Llama-style decoders rotate pairs of each head's features (rotary position
    embeddings): ``hidden_size / num_attention_heads`` must be even."""
    heads = c["num_attention_heads"]
    head = c["hidden_size"] // heads
    if head % 2 == 0:
        return None
    return (
        "num_attention_heads",
        heads,
        f"hidden_size / num_attention_heads is {head} features per head; rotary position embeddings rotate "
        "pairs of features, so it must be even",
    )


def _vit_problem(c: Mapping[str, Any], size: int) -> Problem | None:
    """ViT's patch convolution (kernel and stride ``patch_size``, no padding) needs
    ``patch_size ≤ image_size``."""
    p = c["patch_size"]
    if p <= size:
        return None
    return "patch_size", p, f"patch_size ({p}) is larger than image_size ({size}): no patch fits in the image"


def _convnext_problem(c: Mapping[str, Any], size: int) -> Problem | None:
    """ConvNeXt's later stages each halve the map with a 2x2 stride-2 convolution, which
    needs a map of at least 2x2: the stem's map (``image_size // patch_size``) must be at
    least ``2^(stages - 1)``."""
    first, stages, p = convnext_maps(c, size)[0], len(c["depths"]), c["patch_size"]
    need = 2 ** (stages - 1)
    if first >= need:
        return None
    return (
        "image_size",
        size,
        f"image_size {size} leaves a {first}×{first} map after the patch_size {p} stem, and each of the "
        f"{stages - 1} later stages halves it with a 2×2 stride-2 convolution, which needs at least 2×2: "
        f"the stem's map must be at least {need}×{need} (image_size ≥ {p * need} with patch_size {p}, "
        "or fewer stages in depths)",
    )


def _swin_problem(c: Mapping[str, Any], size: int) -> Problem | None:
    """Swin: each stage's channels (``embed_dim × 2^i``) must split into its heads; and
    each stage's patch grid (:func:`swin_grids`) must be at least ``window_size``: a
    smaller grid makes transformers shrink the window to it while the relative-position
    bias stays that of a ``window_size`` window, and the two do not add up (a grid of
    ``window_size`` or more is padded to whole windows, which runs)."""
    for i, heads in enumerate(c["num_heads"]):
        dim = c["embed_dim"] * 2**i
        if dim % heads:
            msg = f"stage {i + 1} has {dim} channels (embed_dim × {2**i}), which its {heads} heads do not divide"
            return "num_heads", list(c["num_heads"]), msg
    grids, w, p = swin_grids(c, size), c["window_size"], c["patch_size"]
    if grids[-1] >= w:
        return None
    least = (w - 1) * 2 ** (len(grids) - 1) * p + 1
    return (
        "window_size",
        w,
        f"the last stage's patch grid is {grids[-1]}×{grids[-1]} (image_size {size} over patch_size {p}, halved "
        f"{len(grids) - 1} times rounding up), smaller than window_size {w}: transformers shrinks the window "
        f"to the grid but keeps the relative-position bias of a {w}×{w} window, which then does not fit; use "
        f"window_size ≤ {grids[-1]}, image_size ≥ {least}, or fewer stages",
    )


def _resnet_problem(c: Mapping[str, Any], _size: int) -> Problem | None:
    """A bottleneck layer narrows to ``hidden_sizes[i] // 4`` channels: each must be at
    least 4."""
    if c["layer_type"] != "bottleneck" or min(c["hidden_sizes"]) >= 4:
        return None
    return (
        "hidden_sizes",
        list(c["hidden_sizes"]),
        "a bottleneck layer narrows to hidden_sizes[i] // 4 channels, so each must be at least 4 "
        "(or use layer_type basic)",
    )


_SHAPE_RULES: dict[str, Callable[[Mapping[str, Any], int], Problem | None]] = {
    "llama": _rotary_problem,
    "mistral": _rotary_problem,
    "qwen2": _rotary_problem,
    "resnet": _resnet_problem,
    "convnext": _convnext_problem,
    "vit": _vit_problem,
    "swin": _swin_problem,
}


def hf_shape_problem(architecture: str, config: Mapping[str, Any], input_size: int) -> Problem | None:
    """Why an ``hf`` config cannot run at all (its shapes do not fit together), or None.

    Exact for the catalog's architectures as transformers builds them: each rule is the
    failure a forward would meet (``tests/ckptlab/spec/test_hf_shapes.py`` runs each
    rule's boundary, which passes and runs, and the config just past it, which fails the
    rule and fails to run). GPT-2 has none.

    Args:
        architecture: a key of :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES`.
        config: every config field of the architecture (``HFModelSpec.config_values``).
        input_size: ``seq_len`` (tokens) or ``image_size`` (pixels).

    Returns:
        ``(field, value, message)``: the field to change, its value and why, or None.
    """
    rule = _SHAPE_RULES.get(architecture)
    return rule(config, input_size) if rule else None


def hf_batch_problem(architecture: str, config: Mapping[str, Any], input_size: int, batch_size: int) -> str | None:
    """Why ``batch_size`` cannot train an ``hf`` config, or None: a ResNet's BatchNorm in
    training mode needs more than one value per channel, so ``batch_size × side²`` of the
    last stage's map (:func:`resnet_layers`) must be at least 2."""
    if architecture != "resnet":
        return None
    side = resnet_layers(config, input_size)[1][-1][1]
    if batch_size * side * side >= 2:
        return None
    return (
        f"the last stage's map is {side}×{side} at image_size {input_size}, so with batch_size {batch_size} its "
        "BatchNorm layers see one value per channel, which training cannot normalise; use batch_size ≥ 2 or a "
        "larger image_size"
    )
