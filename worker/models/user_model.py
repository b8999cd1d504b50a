"""A model in hand made ready for the engine (``ckptlab.profile``): its blocks found, its
sample and its loss understood, and both checked before anything is stored.

- **Blocks.** ``blocks=`` (a submodule or its qualified name) wins. Otherwise a Hugging
  Face ``transformers`` model's own layout (:func:`ckptlab.worker.models.hf_models.hf_blocks`: decoder
  layers, encoder layers, every ResNet / ConvNeXt stage's layers in order, Swin stages), a
  torchvision model's (:func:`ckptlab.worker.models.torchvision_models.torchvision_blocks`: every ResNet
  stage's blocks, ConvNeXt / Swin features, ViT encoder layers), else the longest
  ``nn.ModuleList`` / ``nn.Sequential`` of same-type children (:func:`find_blocks`).
- **Sample.** A tensor (the inputs), ``(inputs, targets)``, or a mapping of keyword
  arguments (``{"input_ids": ..., "labels": ...}``), with which the model is called as
  ``model(**sample)``.
- **Loss.** ``loss_fn(output, targets)`` when given; else the ``loss`` a model output carries
  (``transformers``' ``ModelOutput``, e.g. ``CausalLMOutputWithPast`` with ``labels``); else
  the engine's default on the output (or its ``logits``) and the targets; else the mean of
  the squared output.
- **No KV cache**: a ``transformers`` config's ``use_cache`` is turned off in the copy (as
  transformers does when training with gradient checkpointing): a recomputed layer would
  otherwise append its keys and values to the cache a second time.
- **Checks** (:func:`check_model`): one forward on a copy, without gradients, hooks on the
  blocks: every block runs once, in order, on a tensor, and returns a tensor or a tuple
  starting with one; the loss is a finite-dtype scalar. A failure is a ``ValueError``
  saying what to pass, instead of a ``failed`` run with a raw ``TypeError``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ckptlab.worker.models.base import Built, WrappedModel, default_loss

__all__ = ["find_blocks", "ProfiledModel", "prepare_model", "check_model", "describe_model"]


def find_blocks(model: nn.Module) -> str:
    """The qualified name of ``model``'s repeated blocks: the longest ``nn.ModuleList`` or
    ``nn.Sequential`` whose children all have one type (the first of equal length).

    Raises:
        ValueError: ``model`` holds no such container.
    """
    best: tuple[int, str] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) > 0:
            if len({type(c) for c in mod}) == 1 and (best is None or len(mod) > best[0]):
                best = (len(mod), name)
    if best is None:
        raise ValueError(
            f"{type(model).__name__} has no nn.ModuleList / nn.Sequential of same-type blocks; pass blocks="
        )
    return best[1]


def _library(model: nn.Module) -> str:
    return type(model).__module__.split(".", 1)[0]


def _own_layout(model: nn.Module) -> nn.Module | None:
    """The blocks of a transformers or torchvision model by its family's layout (may regroup
    stages inside ``model``), or None."""
    if _library(model) == "transformers":
        from ckptlab.worker.models.hf_models import hf_blocks

        return hf_blocks(model)
    if _library(model) == "torchvision":
        from ckptlab.worker.models.torchvision_models import torchvision_blocks

        try:
            return torchvision_blocks(model)
        except ValueError:
            return None
    return None


def _locate(model: nn.Module, blocks: nn.Module | str | None) -> tuple[nn.Module, str]:
    """The block container in ``model`` (a fresh copy of the user's model) and how it was
    chosen, for the summary."""
    if isinstance(blocks, str):
        try:
            found = model.get_submodule(blocks)
        except AttributeError as exc:
            raise ValueError(f"blocks={blocks!r}: {exc}") from exc
        return found, f"{blocks} (given)"
    if blocks is None:
        own = _own_layout(model)
        if own is not None:
            return own, f"{_library(model)} layout"
        name = find_blocks(model)
        return model.get_submodule(name), f"{name} (longest same-type container)"
    raise TypeError("a module given as blocks= is resolved to its name first")


def _describe(found: nn.Module, how: str) -> str:
    kinds = sorted({type(b).__name__ for b in found})
    return f"{len(found)} × {' / '.join(kinds)}: {how}"


class _Inputs(dict):
    """Keyword-argument inputs that move like a tensor (the engine calls ``x.to(device)``)."""

    def to(self, device: torch.device | str) -> _Inputs:
        return _Inputs({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()})


class _Call(WrappedModel):
    """``model(**inputs)`` for mapping inputs, ``model(inputs)`` otherwise."""

    def forward(self, inputs: Any) -> Any:
        return self.model(**inputs) if isinstance(inputs, Mapping) else self.model(inputs)


def _loss_of(loss_fn: Callable | None, has_targets: bool) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    def loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
        if loss_fn is not None:
            return loss_fn(out, targets if has_targets else None)
        carried = getattr(out, "loss", None)
        if isinstance(carried, torch.Tensor):
            return carried.float()
        tensor = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
        if tensor is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            tensor = out[0]
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"the model returned {type(out).__name__}, with no loss, logits or tensor: pass loss_fn=")
        return default_loss(tensor, targets) if has_targets else tensor.float().square().mean()

    return loss


@dataclass
class ProfiledModel:
    """A model in hand, ready for :func:`ckptlab.worker.engine.run.run_experiment` (``model=build()``).

    Attributes:
        build: a fresh deep copy wrapped as a :class:`Built` (each call: same weights).
        depth: number of blocks.
        batch_size: the sample's first dimension.
        blocks: which blocks were chosen and why, e.g. ``"4 × LlamaDecoderLayer:
            transformers layout"``.
        model: class name and parameter count, e.g. ``"LlamaForCausalLM (1,234,567
            parameters)"``.
    """

    build: Callable[[], Built]
    depth: int
    batch_size: int
    blocks: str
    model: str


def describe_model(model: nn.Module) -> str:
    """``"ClassName (N parameters)"``, N counted as ``model.parameters()`` yields them."""
    return f"{type(model).__name__} ({sum(p.numel() for p in model.parameters()):,} parameters)"


def _split(sample: Any) -> tuple[Any, torch.Tensor | None]:
    if isinstance(sample, Mapping):
        if not sample or not all(isinstance(v, torch.Tensor) for v in sample.values()):
            raise ValueError("a mapping sample holds the model's keyword arguments, each a tensor")
        return _Inputs(sample), None
    if isinstance(sample, torch.Tensor):
        return sample, None
    if isinstance(sample, Sequence) and len(sample) == 2 and all(isinstance(s, torch.Tensor) for s in sample):
        return sample[0], sample[1]
    raise ValueError("sample must be a tensor, (inputs, targets), or a mapping of keyword arguments to tensors")


def prepare_model(
    model: nn.Module, sample: Any, *, blocks: nn.Module | str | None = None, loss_fn: Callable | None = None
) -> ProfiledModel:
    """Make ``model`` and ``sample`` ready for the engine, and check them (:func:`check_model`).

    Args:
        model: any ``nn.Module``; never changed (each build deep-copies it).
        sample: a tensor, ``(inputs, targets)`` or a mapping of keyword arguments.
        blocks: the block container (a submodule of ``model`` or its qualified name), or
            None to find it (see the module docstring).
        loss_fn: ``(output, targets or None) -> scalar``, or None (see the module docstring).

    Raises:
        ValueError: what to pass instead: no blocks found, blocks not a submodule, a sample
            of another shape, or a model whose blocks or output cannot be checkpointed.
    """
    if isinstance(blocks, nn.Module):
        name = next((n for n, m in model.named_modules() if m is blocks), None)
        if name is None:
            raise ValueError("blocks is not a submodule of model")
        blocks = name
    inputs, targets = _split(sample)
    batch = (inputs, targets if targets is not None else torch.empty(0))
    first = inputs if isinstance(inputs, torch.Tensor) else next(iter(inputs.values()))
    loss = _loss_of(loss_fn, targets is not None)
    chosen: dict[str, str] = {}

    def build() -> Built:
        copied = copy.deepcopy(model)
        config = getattr(copied, "config", None)
        if getattr(config, "use_cache", None):  # a KV cache in training: recomputation would append twice
            config.use_cache = False
        found, how = _locate(copied, blocks)
        chosen.setdefault("blocks", _describe(found, how))
        return Built(_Call(copied), found, lambda _n, _g: batch, loss)

    built = build()
    check_model(built)
    return ProfiledModel(build, len(built.blocks), int(first.shape[0]), chosen["blocks"], describe_model(model))


def check_model(built: Built) -> None:
    """One forward of ``built`` without gradients, hooks on its blocks: each block runs once,
    in order, gets a tensor first and returns a tensor or a tuple starting with one, and the
    loss is a scalar (what the strategies of :mod:`ckptlab.worker.engine.strategies` need).

    Raises:
        ValueError: which block or what output breaks this, and what to pass.
    """
    calls: list[int] = []
    problems: list[str] = []

    def hook(index: int):
        def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            calls.append(index)
            if not args or not isinstance(args[0], torch.Tensor):
                problems.append(
                    f"block {index} ({type(module).__name__}) gets no tensor as its first positional argument"
                )
            hidden = output[0] if isinstance(output, tuple) and output else output
            if not isinstance(hidden, torch.Tensor):
                problems.append(f"block {index} ({type(module).__name__}) returns {type(output).__name__}")

        return record

    handles = [b.register_forward_hook(hook(i), with_kwargs=True) for i, b in enumerate(built.blocks)]
    try:
        x, y = built.make_batch(0, torch.Generator())
        with torch.no_grad():
            out = built.module(x)
            loss = built.loss_fn(out, y)
    except ValueError:
        raise
    except Exception as exc:  # the user's model, any error: say where it came from
        raise ValueError(f"model(sample) failed before any checkpointing: {type(exc).__name__}: {exc}") from exc
    finally:
        for h in handles:
            h.remove()
    expected = list(range(len(built.blocks)))
    if calls != expected:
        raise ValueError(
            f"the model's forward calls its blocks as {calls[:12]}, not once each in order {expected[:12]}: "
            "pass blocks= the container whose children it applies one after another"
        )
    if problems:
        raise ValueError(f"{problems[0]}: pass blocks= a container of blocks that take and return hidden states")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"the loss is {type(loss).__name__} of shape {getattr(loss, 'shape', None)}: pass loss_fn=")
