"""Models for checkpointing experiments.

Each builder returns a :class:`Built`: the module pieces (only ``blocks`` is checkpointed),
and a batch maker that draws synthetic data from a ``torch.Generator``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ckptlab.spec import MLPSpec

__all__ = ["Built", "build_mlp", "build_model"]

MLP_CLASSES = 10


@dataclass
class Built:
    """A model split for checkpointing.

    Attributes:
        stem: runs before the blocks (never checkpointed).
        blocks: ``nn.Sequential`` of identical blocks; the checkpointed part.
        head: maps the blocks' output to the loss input (never checkpointed).
        make_batch: ``(batch_size, generator) -> (inputs, targets)`` on CPU.
        loss_fn: ``(head_output, targets) -> scalar loss``.
    """

    stem: nn.Module
    blocks: nn.Sequential
    head: nn.Module
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def modules(self) -> nn.ModuleList:
        """All pieces as one module (for ``.parameters()`` and ``.to()``)."""
        return nn.ModuleList([self.stem, self.blocks, self.head])


def build_mlp(spec: MLPSpec) -> Built:
    """Build the MLP of :class:`ckptlab.spec.MLPSpec`.

    Shapes: inputs ``(B, width)`` float32, targets ``(B,)`` int64 in ``[0, 10)``; stem
    ``Linear(width, width) -> ReLU``; ``depth`` blocks ``Linear(width, width) -> ReLU
    [-> Dropout]``; head ``Linear(width, 10)``; loss: cross-entropy (float32).
    Each block retains one ``(B, width)`` activation for backward (the ReLU output, which
    the next Linear also saves), plus the dropout mask when ``dropout > 0``.
    """
    w = spec.width

    def block() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Linear(w, w), nn.ReLU()]
        if spec.dropout > 0:
            layers.append(nn.Dropout(spec.dropout))
        return nn.Sequential(*layers)

    def make_batch(batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, w, generator=gen)
        y = torch.randint(0, MLP_CLASSES, (batch_size,), generator=gen)
        return x, y

    return Built(
        stem=nn.Sequential(nn.Linear(w, w), nn.ReLU()),
        blocks=nn.Sequential(*[block() for _ in range(spec.depth)]),
        head=nn.Linear(w, MLP_CLASSES),
        make_batch=make_batch,
        loss_fn=lambda out, y: F.cross_entropy(out.float(), y),
    )


def build_model(spec) -> Built:
    """Build the model a spec names (``spec.kind``). Raises ValueError for an unknown kind."""
    if spec.kind == "mlp":
        return build_mlp(spec)
    raise ValueError(f"unknown model kind {spec.kind!r}")
