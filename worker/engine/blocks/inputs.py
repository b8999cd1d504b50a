"""The inputs of a chain's blocks as a checkpoint keeps them, and which blocks are the same
computation: what the timing pass (:mod:`ckptlab.worker.engine.block_timing`) and the
selective measurement (:mod:`ckptlab.worker.engine.blocks.selective`) run each block alone
from.

Example usage::

    inputs = capture_inputs(built.blocks, lambda: built.module(x))
    groups = group_blocks(built.blocks, inputs)   # [0, 0, 0, 0]: four identical layers
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map, tree_structure

__all__ = ["Inputs", "detached", "signature", "threads", "capture_inputs", "group_blocks"]

#: One block's positional and keyword arguments.
Inputs = tuple[tuple, dict]


def detached(value: Any) -> Any:
    """A tensor as a checkpoint keeps it (detached, same ``requires_grad``); else as is."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    return value


def signature(block: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What makes two blocks the same computation: module type, parameter shapes and dtypes,
    and the structure, shapes and dtypes of the inputs."""
    params = tuple((tuple(p.shape), p.dtype) for p in block.parameters())
    leaves = tuple(
        (tuple(t.shape), t.dtype, t.requires_grad) if isinstance(t, torch.Tensor) else type(t).__name__
        for t in tree_leaves((args, kwargs))
    )
    return type(block).__qualname__, params, repr(tree_structure((args, kwargs))), leaves


def group_blocks(blocks: Sequence[torch.nn.Module], inputs: Sequence[Inputs]) -> tuple[int, ...]:
    """Per block, the index of the first block of its group of identical blocks
    (:func:`signature`)."""
    seen: dict[tuple, int] = {}
    return tuple(seen.setdefault(signature(b, *inputs[i]), i) for i, b in enumerate(blocks))


@contextlib.contextmanager
def threads(n: int) -> Iterator[int | None]:
    """``n`` torch threads inside (0: as they are); yields the count."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def capture_inputs(blocks: Sequence[torch.nn.Module], run: Callable[[], Any]) -> list[Inputs]:
    """Each block's inputs (positional and keyword, :func:`detached`) in ``run()`` (a forward
    or a step of the model that calls ``blocks``), read by a forward pre-hook on every block.

    Raises:
        ValueError: a block did not run in ``run()``.
    """
    inputs: list[Inputs | None] = [None] * len(blocks)

    def keep(i: int):
        def hook(module, args, kwargs):
            inputs[i] = (tree_map(detached, args), tree_map(detached, kwargs))

        return hook

    hooks = [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    missing = [i for i, x in enumerate(inputs) if x is None]
    if missing:
        raise ValueError(f"blocks {missing} did not run in the model's forward: the blocks must form a chain")
    return inputs  # type: ignore[return-value]
