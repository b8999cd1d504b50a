"""The Hugging Face ``transformers`` architectures ckptlab builds from a config: their
config fields (names, types, bounds, the config class's defaults), what their blocks are,
and how many there are. Pure data: this module imports neither torch nor transformers, so
the API validates and describes ``hf`` specs without them (``GET /api/meta``).

The defaults are those of transformers 5.23's config classes
(``tests/ckptlab/spec/test_hf.py`` checks them against the installed package); a field left
out of a spec takes them. Models are built with random weights by
``AutoModelForCausalLM.from_config`` / ``AutoModelForImageClassification.from_config``:
nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["HFField", "HFArchitecture", "HF_ARCHITECTURES", "HF_FAMILIES", "ATTN_IMPLEMENTATIONS"]

#: ``attn_implementation`` values a spec may ask for (``config._attn_implementation``).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
#: Model families: a causal language model on random tokens, or an image classifier on
#: random images.
HF_FAMILIES = ("causal_lm", "image_classification")

FieldType = Literal["int", "float", "bool", "int_list", "float_list", "choice"]


@dataclass(frozen=True)
class HFField:
    """One config field a spec may set.

    Attributes:
        type: ``int``, ``float``, ``bool``, ``int_list``, ``float_list`` or ``choice``.
        default: the config class's default (None: the config derives it, e.g. GPT-2's
            ``n_inner`` is ``4 * hidden_size``).
        ge, le: bounds of a number or of each list item.
        description: what it is, with its unit.
        choices: the values of a ``choice`` field.
        max_items: longest list.
    """

    type: FieldType
    default: Any
    description: str
    ge: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    max_items: int = 8

    def public(self) -> dict[str, Any]:
        """The field as ``GET /api/meta`` describes it (JSON-ready)."""
        out: dict[str, Any] = {"type": self.type, "default": _jsonable(self.default), "description": self.description}
        if self.ge is not None:
            out["minimum"] = self.ge
        if self.le is not None:
            out["maximum"] = self.le
        if self.choices:
            out["choices"] = list(self.choices)
        if self.type.endswith("_list"):
            out["max_items"] = self.max_items
        return out


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class HFArchitecture:
    """An architecture the ``hf`` model kind builds.

    Attributes:
        family: ``causal_lm`` (input ``seq_len`` token ids, the model's own causal-LM loss)
            or ``image_classification`` (input ``image_size`` RGB images, cross-entropy
            over ``num_labels``).
        config_class: the ``transformers`` config class.
        blocks: what is checkpointed, in order, as a user reads it.
        fields: config fields a spec may set.
        depth: the number of blocks, from the config values (defaults filled in).
        attention: whether the model has attention (``attn_implementation`` applies) and
            its blocks take keyword arguments (masks, position embeddings, flags): then
            only non-reentrant checkpoint can run them.
        example: a small config (spec fields: config fields plus ``seq_len`` or
            ``image_size``) that runs in seconds per step on a laptop CPU; the form starts
            from it, since the defaults are the published sizes (Llama's are 6.7 B
            parameters).
    """

    family: Literal["causal_lm", "image_classification"]
    config_class: str
    blocks: str
    fields: Mapping[str, HFField]
    depth: Callable[[Mapping[str, Any]], int] = field(repr=False)
    attention: bool = True
    example: Mapping[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The architecture as ``GET /api/meta`` describes it (JSON-ready)."""
        return {
            "family": self.family,
            "config_class": self.config_class,
            "blocks": self.blocks,
            "attention": self.attention,
            "example": {k: _jsonable(v) for k, v in self.example.items()},
            "fields": {name: f.public() for name, f in self.fields.items()},
        }


def _int(default: Any, description: str, ge: int = 1, le: int = 1_000_000) -> HFField:
    return HFField("int", default, description, ge=ge, le=le)


def _prob(default: float, description: str) -> HFField:
    return HFField("float", default, description, ge=0.0, le=0.99)


def _ints(default: tuple[int, ...], description: str, le: int = 8192) -> HFField:
    return HFField("int_list", default, description, ge=1, le=le)


def _decoder_fields(
    hidden: int, layers: int, heads: int, kv_heads: int | None, intermediate: int, vocab: int, tie: bool
) -> dict[str, HFField]:
    return {
        "hidden_size": _int(hidden, "width of the hidden states", ge=8, le=16384),
        "num_hidden_layers": _int(layers, "decoder layers (the blocks)", le=256),
        "num_attention_heads": _int(heads, "attention heads", le=256),
        "num_key_value_heads": _int(kv_heads, "key/value heads (grouped-query); must divide the heads", le=256),
        "intermediate_size": _int(intermediate, "width of the MLP", ge=8, le=131072),
        "vocab_size": _int(vocab, "tokens in the vocabulary", ge=2, le=1_000_000),
        "attention_dropout": _prob(0.0, "dropout on attention probabilities"),
        "tie_word_embeddings": HFField("bool", tie, "share the input embedding with the LM head"),
    }


#: The issue's small decoder: 4 layers of width 256, 1,000 tokens, sequence 128.
_SMALL_DECODER = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 688,
    "vocab_size": 1000,
    "seq_len": 128,
}


def _decoder(
    family: str, hidden: int, layers: int, heads: int, kv_heads: int | None, intermediate: int, vocab: int, tie: bool
) -> HFArchitecture:
    """A Llama-style causal decoder (``<family>Config``, blocks ``model.layers``)."""
    return HFArchitecture(
        "causal_lm",
        f"{family}Config",
        f"model.layers ({family}DecoderLayer)",
        _decoder_fields(hidden, layers, heads, kv_heads, intermediate, vocab, tie),
        lambda c: c["num_hidden_layers"],
        example=_SMALL_DECODER | ({"num_key_value_heads": 2} if kv_heads else {}),
    )


_GPT2_FIELDS = {
    "hidden_size": _int(768, "width of the hidden states (n_embd)", ge=8, le=16384),
    "num_hidden_layers": _int(12, "transformer blocks (n_layer)", le=256),
    "num_attention_heads": _int(12, "attention heads (n_head)", le=256),
    "n_inner": _int(None, "width of the MLP (default 4 x hidden_size)", ge=8, le=131072),
    "vocab_size": _int(50257, "tokens in the vocabulary", ge=2, le=1_000_000),
    "resid_pdrop": _prob(0.1, "dropout on residual branches"),
    "attn_pdrop": _prob(0.1, "dropout on attention probabilities"),
    "embd_pdrop": _prob(0.1, "dropout on embeddings"),
}

_RESNET_FIELDS = {
    "embedding_size": _int(64, "channels of the stem", le=4096),
    "hidden_sizes": _ints((256, 512, 1024, 2048), "channels of each stage"),
    "depths": _ints((3, 4, 6, 3), "layers of each stage (ResNet-50: 3, 4, 6, 3)", le=64),
    "layer_type": HFField("choice", "bottleneck", "residual layer", choices=("bottleneck", "basic")),
    "num_labels": _int(2, "classes", le=100_000),
}
_CONVNEXT_FIELDS = {
    "hidden_sizes": _ints((96, 192, 384, 768), "channels of each stage"),
    "depths": _ints((3, 3, 9, 3), "layers of each stage (ConvNeXt-T: 3, 3, 9, 3)", le=64),
    "patch_size": _int(4, "stem patch size, pixels", le=64),
    "drop_path_rate": _prob(0.0, "stochastic depth rate"),
    "num_labels": _int(2, "classes", le=100_000),
}
_VIT_FIELDS = {
    "hidden_size": _int(768, "width of the hidden states", ge=8, le=16384),
    "num_hidden_layers": _int(12, "encoder layers (the blocks)", le=256),
    "num_attention_heads": _int(12, "attention heads", le=256),
    "intermediate_size": _int(3072, "width of the MLP", ge=8, le=131072),
    "patch_size": _int(16, "patch size, pixels", le=256),
    "hidden_dropout_prob": _prob(0.0, "dropout on hidden states"),
    "attention_probs_dropout_prob": _prob(0.0, "dropout on attention probabilities"),
    "num_labels": _int(2, "classes", le=100_000),
}
_SWIN_FIELDS = {
    "embed_dim": _int(96, "channels after the patch embedding", ge=8, le=4096),
    "depths": _ints((2, 2, 6, 2), "Swin layers of each stage (Swin-T: 2, 2, 6, 2)", le=64),
    "num_heads": _ints((3, 6, 12, 24), "attention heads of each stage", le=256),
    "window_size": _int(7, "attention window, patches", le=64),
    "patch_size": _int(4, "patch size, pixels", le=64),
    "drop_path_rate": _prob(0.1, "stochastic depth rate"),
    "hidden_dropout_prob": _prob(0.0, "dropout on hidden states"),
    "num_labels": _int(2, "classes", le=100_000),
}

HF_ARCHITECTURES: dict[str, HFArchitecture] = {
    "gpt2": HFArchitecture(
        "causal_lm",
        "GPT2Config",
        "transformer.h (GPT2Block)",
        _GPT2_FIELDS,
        lambda c: c["num_hidden_layers"],
        example={k: v for k, v in _SMALL_DECODER.items() if k != "intermediate_size"},
    ),
    "llama": _decoder("Llama", 4096, 32, 32, None, 11008, 32000, False),
    "mistral": _decoder("Mistral", 4096, 32, 32, 8, 14336, 32000, False),
    "qwen2": _decoder("Qwen2", 4096, 32, 32, 32, 22016, 151936, False),
    "resnet": HFArchitecture(
        "image_classification",
        "ResNetConfig",
        "every stage's layers in order, the downsampling first layers included",
        _RESNET_FIELDS,
        lambda c: sum(c["depths"]),
        attention=False,
        example={
            "embedding_size": 16,
            "hidden_sizes": (32, 64, 128, 256),
            "depths": (2, 2, 2, 2),
            "layer_type": "basic",
            "num_labels": 10,
            "image_size": 64,
        },
    ),
    "convnext": HFArchitecture(
        "image_classification",
        "ConvNextConfig",
        "every stage's downsampling layer (from stage 2) and layers in order",
        _CONVNEXT_FIELDS,
        lambda c: sum(c["depths"]) + len(c["depths"]) - 1,
        attention=False,
        example={"hidden_sizes": (32, 64, 128, 256), "depths": (2, 2, 2, 2), "num_labels": 10, "image_size": 64},
    ),
    "vit": HFArchitecture(
        "image_classification",
        "ViTConfig",
        "vit.encoder.layer (ViTLayer)",
        _VIT_FIELDS,
        lambda c: c["num_hidden_layers"],
        example={
            "hidden_size": 192,
            "num_hidden_layers": 4,
            "num_attention_heads": 3,
            "intermediate_size": 768,
            "patch_size": 8,
            "num_labels": 10,
            "image_size": 64,
        },
    ),
    "swin": HFArchitecture(
        "image_classification",
        "SwinConfig",
        "swin.encoder.layers: the stages (SwinStage, patch merging included)",
        _SWIN_FIELDS,
        lambda c: len(c["depths"]),
        example={
            "embed_dim": 32,
            "depths": (2, 2, 2),
            "num_heads": (2, 4, 8),
            "window_size": 4,
            "num_labels": 10,
            "image_size": 64,
        },
    ),
}
