"""Models for checkpointing experiments.

Every builder returns a :class:`Built`: the module, the block container inside it (the
only part that is checkpointed), a batch maker for synthetic data and a loss. The block
container must be an ``nn.Sequential`` or ``nn.ModuleList`` whose blocks each map one
tensor to one tensor and are applied in order by the module's forward, so that a strategy
can regroup them (:mod:`worker.strategies`).

Users' own models: an installed package registers a factory in the ``ckptlab.models``
entry-point group, e.g. in its ``pyproject.toml``::

    [project.entry-points."ckptlab.models"]
    my_model = "my_pkg.ckpt:factory"

``factory(**options)`` returns ``(module, blocks, make_batch)`` or ``(module, blocks,
make_batch, loss_fn)`` where ``make_batch(batch_size, generator) -> (inputs, targets)``.
The default loss: the output itself when it is a scalar, cross-entropy for integer
targets, else mean squared error.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch
from torch import nn
from torch.nn import functional as F

from ckptlab.spec import (
    MODEL_ENTRY_POINT_GROUP,
    CustomModelSpec,
    DenseNetSpec,
    HFModelSpec,
    MLPSpec,
    PythonModelSpec,
    ResNetSpec,
    TorchvisionModelSpec,
    TransformerSpec,
)

__all__ = ["Built", "ENTRY_POINT_GROUP", "build_model", "default_loss"]

ENTRY_POINT_GROUP = MODEL_ENTRY_POINT_GROUP
N_CLASSES = 10

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Built:
    """A model ready for a checkpointing experiment.

    Attributes:
        module: the whole model; ``module(inputs)`` returns the loss input.
        blocks: the block container inside ``module`` that strategies regroup.
        make_batch: ``(batch_size, generator) -> (inputs, targets)``, on CPU.
        loss_fn: ``(output, targets) -> scalar loss``.
    """

    module: nn.Module
    blocks: nn.Sequential | nn.ModuleList
    make_batch: Callable[[int, torch.Generator], Batch]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def default_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Loss for models that bring none: the output if it is a scalar, cross-entropy over the
    last dimension for integer targets, else mean squared error (all in float32)."""
    if out.dim() == 0:
        return out.float()
    if not targets.is_floating_point():
        return F.cross_entropy(out.float().flatten(0, -2), targets.flatten())
    return F.mse_loss(out.float(), targets.float())


class _Chain(nn.Module):
    """``head(blocks(stem(x)))``: blocks applied in order, one tensor in, one out."""

    def __init__(self, stem: nn.Module, blocks: nn.Sequential, head: nn.Module):
        super().__init__()
        self.stem, self.blocks, self.head = stem, blocks, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def _mlp(spec: MLPSpec) -> Built:
    """MLP of :class:`ckptlab.spec.MLPSpec`. Inputs ``(B, width)``, targets ``(B,)`` in
    ``[0, 10)``. Each block retains one ``(B, width)`` activation (the ReLU output, also the
    next Linear's saved input) plus a dropout mask when ``dropout > 0``."""
    w = spec.width

    def block() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Linear(w, w), nn.ReLU()]
        if spec.dropout > 0:
            layers.append(nn.Dropout(spec.dropout))
        return nn.Sequential(*layers)

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        return torch.randn(batch_size, w, generator=gen), torch.randint(0, N_CLASSES, (batch_size,), generator=gen)

    stem = nn.Sequential(nn.Linear(w, w), nn.ReLU()) if spec.stem else nn.Identity()
    blocks = nn.Sequential(*[block() for _ in range(spec.depth)])
    return Built(_Chain(stem, blocks, nn.Linear(w, N_CLASSES)), blocks, make_batch, default_loss)


class _ResidualBlock(nn.Module):
    """``x + (Conv3x3 -> BN -> ReLU [-> Dropout] -> Conv3x3 -> BN)(x)`` at constant channels."""

    def __init__(self, c: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _resnet(spec: ResNetSpec) -> Built:
    """ResNet generator of :class:`ckptlab.spec.ResNetSpec` (CycleGAN-style, as in the seed
    documents). Inputs and targets ``(B, 3, image_size, image_size)``; blocks at
    ``(B, 4*channels, image_size/4, image_size/4)``; loss L1."""
    c, s = spec.channels, spec.image_size

    def cbr(cin: int, cout: int, k: int, stride: int = 1, pad: int = 0) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    stem = nn.Sequential(*cbr(3, c, 7, pad=3), *cbr(c, 2 * c, 3, 2, 1), *cbr(2 * c, 4 * c, 3, 2, 1))
    blocks = nn.Sequential(*[_ResidualBlock(4 * c, spec.dropout) for _ in range(spec.depth)])
    head = nn.Sequential(
        nn.ConvTranspose2d(4 * c, 2 * c, 3, 2, 1, output_padding=1, bias=False),
        nn.BatchNorm2d(2 * c),
        nn.ReLU(),
        nn.ConvTranspose2d(2 * c, c, 3, 2, 1, output_padding=1, bias=False),
        nn.BatchNorm2d(c),
        nn.ReLU(),
        nn.Conv2d(c, 3, 7, padding=3),
        nn.Tanh(),
    )

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        x = torch.randn(batch_size, 3, s, s, generator=gen)
        return x, torch.rand(batch_size, 3, s, s, generator=gen) * 2 - 1

    return Built(_Chain(stem, blocks, head), blocks, make_batch, lambda out, y: F.l1_loss(out.float(), y))


class _DecoderBlock(nn.Module):
    """Pre-norm GPT block: ``x + proj(SDPA(LN(x)))`` then ``x + MLP(LN(x))``; causal."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class _Embed(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


def _transformer(spec: TransformerSpec) -> Built:
    """GPT-style decoder of :class:`ckptlab.spec.TransformerSpec`. Inputs and targets
    ``(B, seq_len)`` token ids (targets: inputs shifted by one); logits ``(B, seq_len,
    vocab_size)``; loss: next-token cross-entropy."""
    d = spec.d_model
    blocks = nn.Sequential(*[_DecoderBlock(d, spec.heads, spec.dropout) for _ in range(spec.depth)])
    head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, spec.vocab_size, bias=False))

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        tokens = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Built(_Chain(_Embed(spec.vocab_size, spec.seq_len, d), blocks, head), blocks, make_batch, default_loss)


class _DenseLayer(nn.Module):
    """``x -> cat([x, f(x)])`` with ``f`` = BN-ReLU-Conv1x1 (the bottleneck that
    memory-efficient DenseNet recomputes) then BN-ReLU-Conv3x3 to ``growth`` channels."""

    def __init__(self, cin: int, growth: int, bn_size: int, dropout: float):
        super().__init__()
        mid = bn_size * growth
        layers: list[nn.Module] = [
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, growth, 3, padding=1, bias=False),
        ]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.f(x)], dim=1)


def _densenet(spec: DenseNetSpec) -> Built:
    """One dense block of :class:`ckptlab.spec.DenseNetSpec`. Inputs ``(B, 3, image_size,
    image_size)``, targets ``(B,)`` in ``[0, 10)``; layer ``i`` sees ``2k + i*k`` channels."""
    k, s = spec.growth_rate, spec.image_size
    stem = nn.Conv2d(3, 2 * k, 3, padding=1, bias=False)
    blocks = nn.Sequential(*[_DenseLayer(2 * k + i * k, k, spec.bn_size, spec.dropout) for i in range(spec.depth)])
    cout = 2 * k + spec.depth * k
    head = nn.Sequential(
        nn.BatchNorm2d(cout), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cout, N_CLASSES)
    )

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        x = torch.randn(batch_size, 3, s, s, generator=gen)
        return x, torch.randint(0, N_CLASSES, (batch_size,), generator=gen)

    return Built(_Chain(stem, blocks, head), blocks, make_batch, default_loss)


def _custom(spec: CustomModelSpec) -> Built:
    """A model from the ``ckptlab.models`` entry-point group, looked up when the experiment
    is built (in the child of a claimed experiment), so a package installed while the worker
    runs is found without a restart. The factory is called as :func:`_from_factory` says.

    Raises:
        ValueError: no installed entry point has that name, or the factory's result is
            wrong (see :func:`_from_factory`).
    """
    _see_new_packages()
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.name]
    if not found:
        names = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise ValueError(
            f"no model {spec.name!r} in entry-point group {ENTRY_POINT_GROUP!r}; installed: {names or 'none'}"
        )
    return _from_factory(found[0].load(), spec.options, depth=spec.depth, label=spec.name)


def _python(spec: PythonModelSpec) -> Built:
    """A model from the factory at ``spec.target`` (``package.module:factory``), imported
    here. Whether it may be imported is decided before: a worker checks its allow-list
    (:func:`worker.outcome.record_run`), the API never imports it.

    Raises:
        ValueError: the module or attribute does not exist, or the factory's result is
            wrong (see :func:`_from_factory`).
    """
    _see_new_packages()
    module_name, attr = spec.target.split(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"python target {spec.target!r} cannot be loaded: {exc}") from exc
    return _from_factory(factory, spec.kwargs, depth=spec.depth, label=spec.target)


def _from_factory(factory: Callable, options: dict, *, depth: int, label: str) -> Built:
    """Call a model factory: ``factory(depth=depth, **options)`` (``depth`` only when the
    factory takes it, by name or ``**kwargs``, and ``options`` does not set it). It returns
    ``(module, blocks, make_batch)`` or ``(module, blocks, make_batch, loss_fn)``.

    Raises:
        ValueError: the result has the wrong shape, ``blocks`` is not an
            ``nn.Sequential`` / ``nn.ModuleList``, or it holds other than ``depth`` blocks.
    """
    kwargs = dict(options)
    if "depth" not in kwargs and _takes(factory, "depth"):
        kwargs["depth"] = depth
    result = factory(**kwargs)
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        raise ValueError(f"factory {label!r} must return (module, blocks, make_batch[, loss_fn])")
    module, blocks, make_batch = result[:3]
    loss_fn = result[3] if len(result) == 4 else default_loss
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"factory {label!r}: blocks must be nn.Sequential or nn.ModuleList")
    if len(blocks) != depth:
        raise ValueError(f"factory {label!r} returned {len(blocks)} blocks but model.depth is {depth}")
    return Built(module, blocks, make_batch, loss_fn)


def _see_new_packages() -> None:
    """Make packages installed since this process started importable: drop the import
    system's directory caches, and re-read the site directories' ``.pth`` files, which is
    where ``pip install -e`` puts a project's path (``site.addsitedir`` skips paths already
    on ``sys.path``). Runs in the disposable child of one experiment."""
    import site

    importlib.invalidate_caches()
    dirs = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    for d in dirs:
        if os.path.isdir(d):
            site.addsitedir(d)
    importlib.invalidate_caches()


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts a keyword argument ``name`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _hf(spec: HFModelSpec) -> Built:
    """A Hugging Face ``transformers`` model (:func:`worker.hf_models.build_hf`)."""
    from worker.hf_models import build_hf

    return build_hf(spec)


def _torchvision(spec: TorchvisionModelSpec) -> Built:
    """A torchvision model (:func:`worker.torchvision_models.build_torchvision`)."""
    from worker.torchvision_models import build_torchvision

    return build_torchvision(spec)


_BUILDERS: dict[str, Callable[..., Built]] = {
    "mlp": _mlp,
    "resnet": _resnet,
    "transformer": _transformer,
    "densenet": _densenet,
    "custom": _custom,
    "python": _python,
    "hf": _hf,
    "torchvision": _torchvision,
}


def build_model(spec: MLPSpec | ResNetSpec | TransformerSpec | DenseNetSpec | CustomModelSpec) -> Built:
    """Build the model a spec describes (dispatch on ``spec.kind``).

    Raises:
        ValueError: unknown kind, or a custom model that cannot be loaded.
    """
    return _BUILDERS[spec.kind](spec)
