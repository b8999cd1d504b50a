"""The built-in entries of the model-kind table (:mod:`ckptlab.spec.kinds`): the eight kinds,
each with its spec class, form text, label, builder, parameter counter, activation floor,
admission check and starting values. Nothing else spells a model kind's name.

The parameter counters are exact for the models ``ckptlab.worker.models`` builds
(``tests/backend/api/test_hardening.py`` and ``tests/ckptlab/spec/test_hf_params.py`` check them
against the built modules), so the API bounds a request's parameters and fixed memory without
importing torch. ``custom``, ``python`` and ``torchvision`` have none: the API never loads
their code (torchvision does not import beside the CPU torch, so its counts cannot be checked
here); their entries say so (``uncounted``) and ``GET /api/meta`` serves it.

The activation floors (:class:`ckptlab.spec.kinds.ActivationFloor`) count, per sample, the
tensors the built models keep for backward that no checkpointing strategy removes (after
the modules of ``ckptlab.worker.models.builtin`` and ``hf_models``);
``tests/ckptlab/spec/test_activation_floor.py`` checks that the bounds built from them stay
under the peaks the engine measures. These kinds have none either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
from ckptlab.spec.hf_model import HFModelSpec
from ckptlab.spec.hf_params import hf_activation_floor, hf_param_count, logits_bytes
from ckptlab.spec.kinds import ActivationFloor, ModelKind, register_model_kind
from ckptlab.spec.models import (
    MODEL_ENTRY_POINT_GROUP,
    CustomModelSpec,
    DenseNetSpec,
    MLPSpec,
    PythonModelSpec,
    ResNetSpec,
    TransformerSpec,
    installed_model_names,
)
from ckptlab.spec.torchvision_model import TORCHVISION_ARCHITECTURES, TorchvisionModelSpec, torchvision_problem

if TYPE_CHECKING:
    from ckptlab.settings import Settings

__all__ = ["N_CLASSES"]

#: Classes of the built-in models' synthetic labels (``ckptlab.worker.models.base.N_CLASSES``).
N_CLASSES = 10
_BUILTIN = "ckptlab.worker.models.builtin"
_PLUGINS = "ckptlab.worker.models.plugins"
_NOT_LOADED = "the API never loads its code, so its parameters are counted by no one before a worker builds it"

# ----------------------------------------------------------------- parameter counters


def _mlp(m: MLPSpec) -> int:
    w = m.width
    linear = w * w + w
    return (linear if m.stem else 0) + m.depth * linear + w * N_CLASSES + N_CLASSES


def _resnet(m: ResNetSpec) -> int:
    c = m.channels

    def conv(cin: int, cout: int, k: int) -> int:  # bias=False
        return cin * cout * k * k

    def bn(ch: int) -> int:
        return 2 * ch

    stem = conv(3, c, 7) + bn(c) + conv(c, 2 * c, 3) + bn(2 * c) + conv(2 * c, 4 * c, 3) + bn(4 * c)
    block = 2 * (conv(4 * c, 4 * c, 3) + bn(4 * c))
    head = conv(4 * c, 2 * c, 3) + bn(2 * c) + conv(2 * c, c, 3) + bn(c) + conv(c, 3, 7) + 3
    return stem + m.depth * block + head


def _transformer(m: TransformerSpec) -> int:
    d = m.d_model
    embed = m.vocab_size * d + m.seq_len * d
    block = 12 * d * d + 13 * d  # 2 LayerNorms, qkv, proj, 4x MLP (all with bias)
    head = 2 * d + d * m.vocab_size  # LayerNorm + Linear without bias
    return embed + m.depth * block + head


def _densenet(m: DenseNetSpec) -> int:
    k, mid = m.growth_rate, m.bn_size * m.growth_rate
    total = 3 * 2 * k * 9  # stem Conv3x3 without bias
    for i in range(m.depth):
        cin = 2 * k + i * k
        total += 2 * cin + cin * mid + 2 * mid + mid * k * 9
    cout = 2 * k + m.depth * k
    return total + 2 * cout + cout * N_CLASSES + N_CLASSES


def _hf(m: HFModelSpec) -> int:
    return hf_param_count(m.architecture, m.config_values, m.input_size)


# ----------------------------------------------------------------- activation floors
# Per sample; ``e``: bytes of an activation element (4; 2 under autocast). The batch is
# float32 inputs and int64 (8 B) class targets; a classifier's loss keeps its logits (held by
# the step), the float32 log-probabilities and their incoming gradient.
_I64 = 8


def _mlp_floor(m: MLPSpec, e: int) -> ActivationFloor:
    """MLP: each block's Linear keeps its ``width`` input (the first block's is the batch
    itself without a stem); the head's Linear keeps the last block's output."""
    w = m.width * e
    return ActivationFloor(
        batch=m.width * 4 + _I64,
        blocks=(w if m.stem else 0,) + (w,) * (m.depth - 1),
        kept=w + logits_bytes(N_CLASSES, e),
        fields=("width", "depth"),
    )


def _resnet_floor(m: ResNetSpec, e: int) -> ActivationFloor:
    """ResNet generator: input and target images (float32); each block's first convolution
    keeps its ``4c × (s/4)²`` input; the stem keeps its three BatchNorms' inputs and two
    ReLUs' outputs (``c·s²`` twice, ``2c·(s/2)²`` twice, ``4c·(s/4)²``), the head its first
    transposed convolution's input (the last block's output), two BatchNorm inputs and two
    ReLU outputs (``2c·(s/2)²`` twice, ``c·s²`` twice) and the tanh output (``3·s²``)."""
    c, s = m.channels, m.image_size
    full, half, quarter = s * s, (s // 2) ** 2, (s // 4) ** 2
    stem = 2 * c * full + 2 * 2 * c * half + 4 * c * quarter
    head = 4 * c * quarter + 2 * 2 * c * half + 2 * c * full + 3 * full
    return ActivationFloor(
        batch=2 * 3 * full * 4,
        blocks=(4 * c * quarter * e,) * m.depth,
        kept=(stem + head) * e,
        fields=("image_size", "channels", "depth"),
    )


def _transformer_floor(m: TransformerSpec, e: int) -> ActivationFloor:
    """GPT blocks: int64 tokens and targets; each block's first LayerNorm keeps its
    ``seq_len × d_model`` input; the head's LayerNorm and Linear keep theirs; the loss keeps
    the logits (``seq_len × vocab_size``, held by the step), the float32 log-probabilities
    and their gradient."""
    t, v = m.seq_len, m.vocab_size
    hidden = t * m.d_model * e
    return ActivationFloor(
        batch=2 * t * _I64,
        blocks=(hidden,) * m.depth,
        kept=2 * hidden + t * logits_bytes(v, e),
        fields=("seq_len", "vocab_size", "d_model", "depth"),
    )


def _densenet_floor(m: DenseNetSpec, e: int) -> ActivationFloor:
    """Dense block: layer ``i``'s first BatchNorm keeps its ``(2k + i·k) × s²`` input; the
    head's BatchNorm keeps the last concatenation and its ReLU the same size again."""
    k, area = m.growth_rate, m.image_size**2
    out = (2 * k + m.depth * k) * area * e
    return ActivationFloor(
        batch=3 * area * 4 + _I64,
        blocks=tuple((2 * k + i * k) * area * e for i in range(m.depth)),
        kept=2 * out + logits_bytes(N_CLASSES, e),
        fields=("image_size", "growth_rate", "depth"),
    )


def _hf_floor(m: HFModelSpec, e: int) -> ActivationFloor:
    return hf_activation_floor(m.architecture, m.config_values, m.input_size, e)


# ----------------------------------------------------------------- admission checks


def _entry_point_installed(m: CustomModelSpec, settings: Settings) -> Iterable[tuple[str, Any, str]]:
    if not settings.check_model_entry_points:
        return []
    names = installed_model_names()
    if m.name in names:
        return []
    return [
        (
            "name",
            m.name,
            f"no model {m.name!r} is installed in entry-point group {MODEL_ENTRY_POINT_GROUP!r} "
            f"(installed: {', '.join(sorted(names)) or 'none'}); install the package that registers it "
            "(no restart needed), or set CKPTLAB_CHECK_MODEL_ENTRY_POINTS=false if the API runs "
            "without the workers' model packages",
        )
    ]


def _target_allowed(m: PythonModelSpec, settings: Settings) -> Iterable[tuple[str, Any, str]]:
    # Compared as text: nothing is imported.
    if m.target in settings.allowed_model_targets:
        return []
    allowed = ", ".join(settings.allowed_model_targets) or "none"
    return [
        (
            "target",
            m.target,
            f"python target {m.target!r} is not allowed on this server (allowed: {allowed}); "
            "an operator allows exact names with CKPTLAB_ALLOWED_MODEL_TARGETS, or run it in your own "
            "process with `ckptlab run`",
        )
    ]


def _torchvision_imports(m: TorchvisionModelSpec, settings: Settings) -> Iterable[tuple[str, Any, str]]:
    problem = torchvision_problem() if settings.check_model_entry_points else None
    return [("kind", m.kind, problem)] if problem else []


# ----------------------------------------------------------------- the entries

_DROPOUT0 = {"dropout": 0.0}
_FIRST_HF = next(iter(HF_ARCHITECTURES))
_FIRST_TV = next(iter(TORCHVISION_ARCHITECTURES))

register_model_kind(
    ModelKind(
        name="mlp",
        spec=MLPSpec,
        summary="multi-layer perceptron",
        label="{kind} {depth}×{width}",
        builder=f"{_BUILTIN}:build_mlp",
        count_parameters=_mlp,
        activation_floor=_mlp_floor,
        example={"depth": 8, "width": 256, **_DROPOUT0, "stem": True},
        rank=0,
        default=True,
    )
)
register_model_kind(
    ModelKind(
        name="resnet",
        spec=ResNetSpec,
        summary="image-to-image generator",
        label="{kind} {depth} blocks, {channels} ch, {image_size}px",
        builder=f"{_BUILTIN}:build_resnet",
        count_parameters=_resnet,
        activation_floor=_resnet_floor,
        example={"depth": 9, "channels": 16, "image_size": 64, **_DROPOUT0},
        rank=10,
    )
)
register_model_kind(
    ModelKind(
        name="transformer",
        spec=TransformerSpec,
        summary="GPT blocks",
        label="{kind} {depth}×{d_model}, seq {seq_len}",
        builder=f"{_BUILTIN}:build_transformer",
        count_parameters=_transformer,
        activation_floor=_transformer_floor,
        example={"depth": 6, "d_model": 256, "heads": 4, "seq_len": 256, "vocab_size": 1000, **_DROPOUT0},
        rank=20,
    )
)
register_model_kind(
    ModelKind(
        name="densenet",
        spec=DenseNetSpec,
        summary="dense block",
        label="{kind} {depth}, k={growth_rate}, {image_size}px",
        builder=f"{_BUILTIN}:build_densenet",
        count_parameters=_densenet,
        activation_floor=_densenet_floor,
        example={"depth": 12, "growth_rate": 12, "bn_size": 4, "image_size": 32, **_DROPOUT0},
        rank=30,
    )
)
register_model_kind(
    ModelKind(
        name="hf",
        spec=HFModelSpec,
        summary="Hugging Face transformers (config, random weights)",
        label="{kind} {architecture}[ {num_hidden_layers} layers][, seq {seq_len}][, {image_size}px]",
        builder="ckptlab.worker.models.hf_models:build_hf",
        count_parameters=_hf,
        activation_floor=_hf_floor,
        example={"architecture": _FIRST_HF, **HF_ARCHITECTURES[_FIRST_HF].public()["example"]},
        rank=40,
        note="Built from its config with random weights; nothing is downloaded. Starts from a small example; "
        "an emptied field takes the config's default (the published size).",
        option_text={
            "architecture": {
                name: f"{name} — {'causal LM' if a.family == 'causal_lm' else 'image classifier'}"
                for name, a in HF_ARCHITECTURES.items()
            },
            "attn_implementation": {"sdpa": "sdpa — fused", "eager": "eager — keeps the attention matrix"},
        },
        extra_fields=frozenset(f for a in HF_ARCHITECTURES.values() for f in a.fields),
        renderer="hf_config",
    )
)
register_model_kind(
    ModelKind(
        name="torchvision",
        spec=TorchvisionModelSpec,
        summary="where torchvision imports",
        label="{kind} {architecture}, {image_size}px",
        builder="ckptlab.worker.models.torchvision_models:build_torchvision",
        uncounted="torchvision does not import beside the API's CPU torch, so no parameter count could be "
        "checked against the models it builds; a worker builds it without the API's parameter limit",
        check=_torchvision_imports,
        example={"architecture": _FIRST_TV, "image_size": 224, "num_classes": 1000},
        rank=50,
        note="Needs a torchvision that imports beside the workers' torch (a CUDA install); the server says so "
        "when it does not.",
        option_text={"architecture": {n: f"{n} — {depth} blocks" for n, depth in TORCHVISION_ARCHITECTURES.items()}},
    )
)
register_model_kind(
    ModelKind(
        name="custom",
        spec=CustomModelSpec,
        summary=f"a {MODEL_ENTRY_POINT_GROUP} entry point",
        label="{kind} {name} ({depth})",
        builder=f"{_PLUGINS}:build_custom",
        uncounted=_NOT_LOADED,
        check=_entry_point_installed,
        example={"depth": 8, "options": {}},
        rank=60,
    )
)
register_model_kind(
    ModelKind(
        name="python",
        spec=PythonModelSpec,
        summary="a factory at an import path the operator allows",
        label="{kind} {target} ({depth})",
        builder=f"{_PLUGINS}:build_python",
        uncounted=_NOT_LOADED,
        check=_target_allowed,
        example={"depth": 8, "kwargs": {}},
        rank=70,
    )
)
