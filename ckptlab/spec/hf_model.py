"""The ``hf`` model of the experiment spec: a Hugging Face ``transformers`` architecture and
the config fields it sets, checked against :data:`ckptlab.spec.hf_catalog.HF_ARCHITECTURES` (no
transformers import)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ckptlab.spec.base import SpecInt, _field_error, _Strict, integral
from ckptlab.spec.hf_catalog import ATTN_IMPLEMENTATIONS, HF_ARCHITECTURES, HFArchitecture, HFField

__all__ = ["HFModelSpec", "DEFAULT_SEQ_LEN", "DEFAULT_IMAGE_SIZE"]

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
    seq_len: SpecInt | None = Field(
        None, ge=2, le=32768, description=f"tokens per sample (language models; empty: {DEFAULT_SEQ_LEN})"
    )
    image_size: SpecInt | None = Field(
        None, ge=16, le=1024, description=f"image height and width, pixels (vision models; empty: {DEFAULT_IMAGE_SIZE})"
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
        return self

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
