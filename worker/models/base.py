"""What every model builder returns (:class:`Built`) and the loss a model gets when it brings
none (:func:`default_loss`): the floor of the builders, imported by each of them.

Every builder returns a :class:`Built`: the module, the block container inside it (the
only part that is checkpointed), a batch maker for synthetic data and a loss. The block
container must be an ``nn.Sequential`` or ``nn.ModuleList`` whose blocks each map one
tensor to one tensor and are applied in order by the module's forward, so that a strategy
can regroup them (:mod:`ckptlab.worker.engine.strategies`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["N_CLASSES", "Batch", "Built", "Chain", "WrappedModel", "default_loss"]

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
        step_fn: ``(inputs, targets) -> (output, loss)`` in place of the two calls, or None:
            the whole forward and loss compiled as one function (``compile_budget`` with
            ``compile_scope`` ``step``: :class:`ckptlab.worker.engine.training.CompiledStep`).
    """

    module: nn.Module
    blocks: nn.Sequential | nn.ModuleList
    make_batch: Callable[[int, torch.Generator], Batch]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    step_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None

    def output_and_loss(
        self, x: torch.Tensor, y: torch.Tensor, autocast: Callable[[], AbstractContextManager] = nullcontext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's output on ``x`` (its forward under ``autocast()``) and the loss
        against ``y``, outside autocast; through :attr:`step_fn` when set (which runs the
        run's autocast itself)."""
        if self.step_fn is not None:
            return self.step_fn(x, y)
        with autocast():
            out = self.module(x)
        return out, self.loss_fn(out, y)


def default_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Loss for models that bring none: the output if it is a scalar, cross-entropy over the
    last dimension for integer targets, else mean squared error (all in float32)."""
    if out.dim() == 0:
        return out.float()
    if not targets.is_floating_point():
        return F.cross_entropy(out.float().flatten(0, -2), targets.flatten())
    return F.mse_loss(out.float(), targets.float())


class Chain(nn.Module):
    """``head(blocks(stem(x)))``: blocks applied in order, one tensor in, one out."""

    def __init__(self, stem: nn.Module, blocks: nn.Sequential, head: nn.Module):
        super().__init__()
        self.stem, self.blocks, self.head = stem, blocks, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class WrappedModel(nn.Module):
    """A model the engine calls through an adapter (``inputs -> loss input``): ``self.model``
    is the model as its author built it (a ``transformers`` model, a model handed to
    ``ckptlab.profile``). Its modules keep their author's names in what ckptlab reports (a
    memory timeline's ``layers.0``, not ``model.layers.0``:
    :func:`ckptlab.worker.engine.timeline.module_names`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
