"""The built-in model kinds' spec classes: ``mlp``, ``resnet``, ``transformer``,
``densenet`` (built by ``ckptlab.worker.models.builtin``) and users' own models, ``custom``
(an installed entry point) and ``python`` (a factory at an import path). Their entries in the
model-kind table are in :mod:`ckptlab.spec.model_kinds`; the ``hf`` and ``torchvision``
classes are in :mod:`ckptlab.spec.hf_model` and :mod:`ckptlab.spec.torchvision_model`.

Each class's ``kind: Literal[...]`` field is its discriminator; the titles, descriptions and
bounds of the fields are what the form shows (``GET /api/meta`` ``model_kind_table``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from ckptlab.spec.base import SpecInt, _field_error, _Strict

__all__ = [
    "MLPSpec",
    "ResNetSpec",
    "TransformerSpec",
    "DenseNetSpec",
    "CustomModelSpec",
    "PythonModelSpec",
    "MODEL_ENTRY_POINT_GROUP",
    "installed_model_names",
]

_DROPOUT = "dropout probability after each block"


class MLPSpec(_Strict):
    """A multi-layer perceptron: stem, ``depth`` identical blocks, head.

    Shapes: input ``(batch_size, width)`` float32 -> stem ``Linear(width, width) -> ReLU``
    -> ``depth`` x block ``Linear(width, width) -> ReLU [-> Dropout(dropout)]`` -> head
    ``Linear(width, 10)`` -> cross-entropy against 10 synthetic classes.
    Only the block list is checkpointed. With ``stem: false`` the blocks receive the raw
    input, which does not require grad (the reentrant-checkpoint pitfall of the seeds).
    """

    kind: Literal["mlp"] = "mlp"
    depth: SpecInt = Field(32, ge=1, le=1024, description="number of identical blocks")
    width: SpecInt = Field(1024, ge=1, le=16384, description="features per block")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description=_DROPOUT)
    stem: StrictBool = Field(
        True, description="a Linear+ReLU stem before the blocks (off: they get the raw input, the reentrant pitfall)"
    )


class ResNetSpec(_Strict):
    """The image-to-image generator of the seed documents (CycleGAN-style ResNet generator).

    Shapes: input ``(B, 3, image_size, image_size)`` -> stem ``Conv7x7(3, channels) ->
    BN -> ReLU`` and two stride-2 ``Conv3x3`` downsamplings to ``4*channels`` at
    ``image_size/4`` -> ``depth`` residual blocks ``x + (Conv3x3 -> BN -> ReLU [-> Dropout]
    -> Conv3x3 -> BN)(x)`` -> head: two ``ConvTranspose`` upsamplings and ``Conv7x7 -> tanh``
    back to ``(B, 3, image_size, image_size)``; loss: L1 against a synthetic target image.
    """

    kind: Literal["resnet"] = "resnet"
    depth: SpecInt = Field(9, ge=1, le=256, description="residual blocks")
    channels: SpecInt = Field(16, ge=1, le=1024, description="channels of the stem (blocks use 4x)")
    image_size: SpecInt = Field(64, ge=8, le=1024, description="input height and width, pixels (multiple of 4)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description=_DROPOUT)

    @model_validator(mode="after")
    def _size_multiple_of_4(self) -> ResNetSpec:
        if self.image_size % 4:
            raise _field_error(("image_size",), self.image_size, "image_size must be a multiple of 4")
        return self


class TransformerSpec(_Strict):
    """A GPT-style decoder: token + position embeddings, ``depth`` pre-norm blocks
    ``x + Attn(LN(x))``, ``x + MLP(LN(x))`` with causal ``F.scaled_dot_product_attention``
    and a 4x GELU MLP, final LN and a linear LM head.

    Shapes: tokens ``(B, seq_len)`` int64 in ``[0, vocab_size)``; blocks ``(B, seq_len,
    d_model)``; logits ``(B, seq_len, vocab_size)``; loss: next-token cross-entropy.
    """

    kind: Literal["transformer"] = "transformer"
    depth: SpecInt = Field(4, ge=1, le=256, description="decoder blocks")
    d_model: SpecInt = Field(128, ge=8, le=16384, title="d_model", description="width of the hidden states")
    heads: SpecInt = Field(4, ge=1, le=256, description="attention heads (must divide d_model)")
    seq_len: SpecInt = Field(128, ge=2, le=32768, title="Sequence length", description="tokens per sample")
    vocab_size: SpecInt = Field(1000, ge=2, le=1_000_000, title="Vocabulary", description="token ids")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description=_DROPOUT)

    @model_validator(mode="after")
    def _heads_divide_d_model(self) -> TransformerSpec:
        if self.d_model % self.heads:
            raise _field_error(("heads",), self.heads, f"heads ({self.heads}) must divide d_model ({self.d_model})")
        return self


class DenseNetSpec(_Strict):
    """A DenseNet dense block (Huang et al. 2017) with the bottleneck that "memory-efficient
    DenseNet" (Pleiss et al. 2017) checkpoints.

    Shapes: input ``(B, 3, image_size, image_size)`` -> stem ``Conv3x3(3, 2*growth_rate)``
    -> ``depth`` dense layers, each ``x -> cat([x, f(x)])`` where ``f`` = the bottleneck
    (BN -> ReLU -> Conv1x1 to ``bn_size*growth_rate``) then BN -> ReLU -> Conv3x3 to
    ``growth_rate`` channels -> head: BN -> ReLU -> global average pool -> Linear(…, 10).
    """

    kind: Literal["densenet"] = "densenet"
    depth: SpecInt = Field(12, ge=1, le=256, description="dense layers")
    growth_rate: SpecInt = Field(12, ge=1, le=256, description="channels each layer adds")
    bn_size: SpecInt = Field(4, ge=1, le=16, title="Bottleneck size", description="bottleneck width, x growth_rate")
    image_size: SpecInt = Field(32, ge=4, le=512, description="input height and width, pixels")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description=_DROPOUT)


#: Entry-point group under which installed packages register model factories.
MODEL_ENTRY_POINT_GROUP = "ckptlab.models"


def installed_model_names() -> set[str]:
    """Names registered in the :data:`MODEL_ENTRY_POINT_GROUP` entry-point group of this
    environment, read from the installed distributions' metadata (``importlib.metadata``):
    nothing is imported. Read afresh on every call, so a package installed after start-up
    is seen."""
    import importlib
    from importlib.metadata import entry_points

    importlib.invalidate_caches()
    return {ep.name for ep in entry_points(group=MODEL_ENTRY_POINT_GROUP)}


class CustomModelSpec(_Strict):
    """A model registered by an installed package under the ``ckptlab.models`` entry-point
    group. Only installed entry points can be named; a request never names code to import.

    Args:
        name: the entry point's name (an API that sees the installed entry points answers
            422 for an unknown one, see ``Settings.check_model_entry_points``).
        depth: number of blocks; passed to the factory as ``depth`` (unless ``options``
            gives it) and checked against the blocks it returns.
        options: other keyword arguments for the factory (numbers, strings, booleans).
    """

    kind: Literal["custom"] = "custom"
    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        title="Entry point",
        description=f"an installed {MODEL_ENTRY_POINT_GROUP} entry point",
        examples=["my_model"],
    )
    depth: SpecInt = Field(ge=1, le=4096, description="blocks the factory returns")
    options: dict[str, int | float | bool | str] = Field(
        default_factory=dict, max_length=64, description="keyword arguments of the factory"
    )


class PythonModelSpec(_Strict):
    """A model factory named by its import path, ``package.module:factory``, with the same
    contract as a ``custom`` entry point. A worker imports it only when its operator allowed
    that exact name (``CKPTLAB_ALLOWED_MODEL_TARGETS``); ``ckptlab run`` in one's own process
    always may. The API never imports it: a target outside the allow-list is a 422.

    Args:
        target: ``package.module:factory`` (dotted module path, colon, attribute name).
        depth: number of blocks; passed to the factory as ``depth`` (unless ``kwargs``
            gives it) and checked against the blocks it returns.
        kwargs: other keyword arguments for the factory (numbers, strings, booleans).
    """

    kind: Literal["python"] = "python"
    target: str = Field(
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$",
        description="package.module:factory, allowed by the operator (CKPTLAB_ALLOWED_MODEL_TARGETS)",
        examples=["my_pkg.models:factory"],
    )
    depth: SpecInt = Field(ge=1, le=4096, description="blocks the factory returns")
    kwargs: dict[str, int | float | bool | str] = Field(
        default_factory=dict, max_length=64, title="Keyword arguments", description="of the factory"
    )
