"""Checkpointing strategies, applied by regrouping a model's block container in place.

Each checkpointed group of consecutive blocks becomes one :class:`CheckpointedGroup` at the
group's first position and a :class:`GroupedAway` placeholder (which hands the group's
output on) at the others, so the model's own forward (which applies the blocks in order,
with whatever arguments it passes them) runs the group through
``torch.utils.checkpoint.checkpoint``.

The strategies, their groups and mechanisms are declared in :mod:`ckptlab.strategies`;
this module carries them out. The built-ins:

- ``sequential``: exactly the segmenting of ``torch.utils.checkpoint.checkpoint_sequential``:
  ``len(blocks) // segments`` blocks per segment, the first ``segments - 1`` segments
  checkpointed, the rest (the last segment) run normally. ``segments=1`` checkpoints nothing.
- ``per_block``: every group of ``every`` blocks is checkpointed, the last included
  (Megatron-LM's "uniform" recompute method).
- ``selective``: like ``per_block`` with ``context_fn`` =
  ``create_selective_checkpoint_contexts(policy)`` (PyTorch >= 2.4): ops the policy marks
  ``MUST_SAVE`` are kept, the rest recomputed.
- ``offload``: no recomputation; tensors saved for backward inside the blocks go to host
  memory via ``torch.autograd.graph.save_on_cpu`` (pinned on CUDA).
- ``compile_budget``: the blocks run as one group under ``torch.compile`` with
  ``torch._functorch.config.activation_memory_budget`` set, so the compiler's min-cut
  partitioner decides what to save and what to recompute (:class:`CompiledGroup`); with
  ``compile_scope`` ``step`` the blocks stay as they are and the whole forward and loss are
  compiled instead (:class:`ckptlab.worker.engine.training.CompiledStep`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ckptlab.spec.experiment import CheckpointSpec
from ckptlab.strategies import CompileScope, Mechanism, SelectivePolicy, Strategy, get_strategy

__all__ = [
    "CheckpointedGroup",
    "OffloadedGroup",
    "CompiledGroup",
    "GroupedAway",
    "apply_strategy",
    "selective_policy",
    "policy_saved_ops",
    "RecomputeHook",
    "first_tensor",
    "next_args",
]

#: Called with True when a group's recomputation starts during backward, False when it ends.
RecomputeHook = Callable[[bool], None]

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.convolution.default}
_ATTENTION = {
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
}


def _saved_ops(name: str) -> set:
    """The ops whose outputs the selective policy ``name`` saves.

    Raises:
        ValueError: unknown name.
    """
    saved = {
        SelectivePolicy.SAVE_MATMULS: _MATMULS,
        SelectivePolicy.SAVE_MATMULS_AND_ATTENTION: _MATMULS | _ATTENTION,
        SelectivePolicy.RECOMPUTE_ALL: set(),
    }
    if name not in saved:
        raise ValueError(f"unknown selective policy {name!r}")
    return saved[SelectivePolicy(name)]


def policy_saved_ops(name: str) -> frozenset[str]:
    """Names of the ops whose outputs the selective policy ``name`` saves (``aten.mm.default``:
    what a memory timeline names an op).

    Raises:
        ValueError: unknown name.
    """
    return frozenset(str(op) for op in _saved_ops(name))


def selective_policy(name: str) -> Callable:
    """The policy function for a named selective-checkpointing policy
    (:class:`ckptlab.strategies.SelectivePolicy` says what each keeps).

    Raises:
        ValueError: unknown name.
    """
    keep = _saved_ops(name)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_context(policy: str, saved: set[str] | None = None) -> Callable[[], Any]:
    """``checkpoint``'s ``context_fn`` for the selective policy ``policy``
    (:func:`selective_policy`); ``saved``, when given,
    collects the names of the ops whose outputs the forward saved.

    Raises:
        ValueError: unknown policy.
    """
    decide = selective_policy(policy)
    if saved is None:
        return functools.partial(create_selective_checkpoint_contexts, decide)

    def noting(ctx, op, *args, **kwargs):
        decision = decide(ctx, op, *args, **kwargs)
        if decision == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            saved.add(str(op))
        return decision

    return functools.partial(create_selective_checkpoint_contexts, noting)


def first_tensor(output: Any) -> Any:
    """The hidden states in a block's output: the output itself, or its first item when the
    block returns a tuple (older Hugging Face layers return ``(hidden_states, ...)``)."""
    return output[0] if isinstance(output, tuple) else output


def next_args(block: nn.Module, args: tuple, output: Any) -> tuple:
    """The positional arguments of the block after ``block`` in a group: ``block``'s hidden
    states in place of the first argument, the other arguments (masks, position
    embeddings, cache flags: shared by every layer) unchanged.

    Swin stages also pass the feature map's ``(height, width)`` on: a stage with a patch
    merging layer (``downsample``) halves it (as ``SwinEncoder.forward`` does between
    stages)."""
    rest = args[1:]
    if rest and getattr(block, "downsample", None) is not None and isinstance(rest[0], tuple) and len(rest[0]) == 2:
        height, width = rest[0]
        rest = (((height + 1) // 2, (width + 1) // 2), *rest[1:])
    return (first_tensor(output), *rest)


class _Group(nn.Module):
    """Consecutive blocks run as one: the first block gets the arguments the model passed at
    the group's position, each next block the previous one's hidden states with the same
    other arguments (:func:`next_args`); the group returns what its last block returned.

    Blocks may take keyword arguments and return a tensor or a tuple (Hugging Face decoder
    layers get ``attention_mask``, ``position_embeddings``, ...). The positions of the other
    members in the model's container hold :class:`GroupedAway` placeholders that hand the
    group's output on, so the model's own loop runs unchanged.
    """

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.group = nn.ModuleList(blocks)
        # The output the placeholders hand on: set only when there are placeholders, and
        # dropped by the last one, so no step's activations outlive their forward.
        self.last_output: Any = None

    def run_blocks(self, *args: Any, **kwargs: Any) -> Any:
        output = None
        for i, block in enumerate(self.group):
            output = block(*args, **kwargs)
            if i + 1 < len(self.group):
                args = next_args(block, args, output)
        return output

    def __getattr__(self, name: str) -> Any:
        # Attributes the model reads from the layer at the group's position (a Swin stage's
        # ``downsample``) are the first member's: the model sees it where it was.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("group")[0], name)

    def remember(self, output: Any) -> Any:
        if len(self.group) > 1:
            self.last_output = output
        return output


class GroupedAway(nn.Module):
    """Stands where a block that joined a group was: returns the group's output (what the
    model would have passed on after the last member), whatever it is called with.
    Attributes the model reads from its layers (a Swin stage's ``downsample``) are those of
    the block it stands for, which the group ran."""

    def __init__(self, group: _Group, block: nn.Module, *, last: bool):
        super().__init__()
        object.__setattr__(self, "_owner", group)  # not a submodule: parameters stay the group's
        object.__setattr__(self, "_block", block)
        self.last = last

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The group's output (the arguments are the group's own output, already used)."""
        owner = object.__getattribute__(self, "_owner")
        output = owner.last_output
        if self.last:
            owner.last_output = None
        return output

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_block"), name)


class CheckpointedGroup(_Group):
    """Runs ``blocks`` in order under ``torch.utils.checkpoint.checkpoint``.

    Args:
        blocks: the group's blocks: one tensor in and out, or (Hugging Face layers)
            hidden states plus keyword arguments in, a tensor or tuple out (:class:`_Group`).
        use_reentrant: passed to ``checkpoint``. Keyword arguments need ``False``: PyTorch's
            reentrant variant does not take them (torch.utils.checkpoint docs).
        preserve_rng_state: passed to ``checkpoint``.
        context_fn: passed to ``checkpoint`` (non-reentrant only). Default: None.
        on_recompute: called with True/False around a run of the group during backward
            (that is, its recomputation). Default: None.
    """

    def __init__(
        self,
        blocks: list[nn.Module],
        *,
        use_reentrant: bool,
        preserve_rng_state: bool,
        context_fn: Callable | None = None,
        on_recompute: RecomputeHook | None = None,
    ):
        super().__init__(blocks)
        self.use_reentrant = use_reentrant
        self.preserve_rng_state = preserve_rng_state
        self.context_fn = context_fn
        self.on_recompute = on_recompute
        self.in_forward = False
        #: The selective policy ``context_fn`` applies
        #: (:class:`ckptlab.spec.experiment.SelectivePolicy`), or None; set by :func:`apply_strategy`.
        self.policy: str | None = None
        #: Set by the gradient check: the first forward's outputs (kept), compared with what
        #: the recomputation produces (``recompute_max_abs_diff``: the largest difference,
        #: ``recompute_rel_diff``: it over the largest absolute first output).
        self.check_recompute = False
        self._first_outputs: list[torch.Tensor] = []
        self.recompute_max_abs_diff: float | None = None
        self.recompute_rel_diff: float | None = None

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        recomputing = not self.in_forward and self.on_recompute is not None
        if recomputing:
            self.on_recompute(True)
        try:
            output = self.run_blocks(*args, **kwargs)
        finally:
            if recomputing:
                self.on_recompute(False)
        if self.check_recompute:
            self._compare(first_tensor(output))
        return output

    def _compare(self, output: Any) -> None:
        """Keep the first forward's output; compare a recomputation's with it (issue 19:
        a redrawn dropout mask shows here whatever the scale of the gradients)."""
        if not isinstance(output, torch.Tensor):
            return
        # outside any dispatch mode (selective checkpointing caches the ops it sees: these
        # are not the model's) and outside autograd
        with _disable_current_modes(), torch.no_grad():
            self._compare_now(output)

    def _compare_now(self, output: torch.Tensor) -> None:
        if self.in_forward:
            self._first_outputs.append(output.detach().clone())
        elif self._first_outputs:
            first = self._first_outputs.pop(0)
            same_shape = output.shape == first.shape
            diff = float((output.detach().float() - first.float()).abs().max()) if same_shape else math.inf
            scale = float(first.float().abs().max()) if first.numel() else 0.0
            self.recompute_max_abs_diff = max(self.recompute_max_abs_diff or 0.0, diff)
            self.recompute_rel_diff = max(self.recompute_rel_diff or 0.0, diff / scale if scale > 0 else diff)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the group keeping only its inputs for backward; returns the last block's
        output. Keyword arguments go to every block (non-reentrant checkpoint only).

        Raises:
            ValueError: keyword arguments with ``use_reentrant=True``.
        """
        extra = {"context_fn": self.context_fn} if self.context_fn is not None else {}
        if kwargs and self.use_reentrant:
            raise ValueError(
                f"these blocks take keyword arguments ({', '.join(kwargs)}), which reentrant checkpoint "
                "cannot take: use use_reentrant=False"
            )
        self.in_forward = True
        try:
            output = checkpoint(
                self._run,
                *args,
                use_reentrant=self.use_reentrant,
                preserve_rng_state=self.preserve_rng_state,
                **extra,
                **kwargs,
            )
        finally:
            self.in_forward = False
        return self.remember(output)


class OffloadedGroup(_Group):
    """Runs ``blocks`` in order inside ``torch.autograd.graph.save_on_cpu(pin_memory)``."""

    def __init__(self, blocks: list[nn.Module], *, pin_memory: bool):
        super().__init__(blocks)
        self.pin_memory = pin_memory

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the group; tensors saved for backward are packed to host memory."""
        with torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory):
            return self.remember(self.run_blocks(*args, **kwargs))


class CompiledGroup(_Group):
    """Runs ``blocks`` in order as one function compiled by ``torch.compile``, with
    ``torch._functorch.config.activation_memory_budget = activation_memory_budget``: the
    fraction of the activation memory the min-cut partitioner may save for backward
    (AOTAutograd's ``min_cut_rematerialization_partition``; PyTorch blog "Activation
    checkpointing techniques in PyTorch", 2025). The first call compiles the forward and
    the first backward the backward: the engine does both in a warm-up step before the
    measured ones (``RunContext.build``, its ``compile_ms``).

    Known limitation: dynamo's cache is reset when a group is made (one compiled group
    per process at a time: the worker runs one experiment per child), so its recompile
    limit is never reached by successive runs.
    """

    def __init__(self, blocks: list[nn.Module], *, activation_memory_budget: float, backend: str = "inductor"):
        super().__init__(blocks)
        torch._dynamo.reset()
        self.activation_memory_budget = activation_memory_budget
        self.backend = backend
        self.compiled = torch.compile(self.run_blocks, backend=backend)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled group (compiling at the first call); never under a
        ``TorchDispatchMode``: compiled graphs do not run under one (see
        :mod:`ckptlab.worker.measure.allocator_probe`), so the engine measures these runs without the
        CPU tracker."""
        import torch._functorch.config as functorch_config

        with functorch_config.patch(activation_memory_budget=self.activation_memory_budget):
            return self.remember(self.compiled(*args, **kwargs))


def _ranges(
    strategy: Strategy, ck: CheckpointSpec, n: int, ranges: Sequence[tuple[int, int] | tuple[int, int, str]] | None
) -> Sequence[tuple[int, int] | tuple[int, int, str]]:
    """The block ranges to wrap: ``ranges`` when given, else the strategy table's groups;
    none where nothing wraps blocks (``none``; the whole step compiled, which
    :class:`ckptlab.worker.engine.training.CompiledStep` runs instead).

    Raises:
        ValueError: a planned strategy without its ranges, or ranges with ``compile_scope``
            ``step``.
    """
    whole = strategy.mechanism == Mechanism.COMPILE and ck.compile_scope == CompileScope.STEP
    if whole and ranges:
        raise ValueError("compile_scope 'step' compiles the whole forward and loss: it takes no block ranges")
    if ranges is not None:
        return ranges
    if strategy.planned:
        raise ValueError(f"strategy {ck.strategy!r} is planned at run time: pass its ranges")
    return strategy.groups(n, ck) if strategy.mechanism != Mechanism.KEEP and not whole else []


def apply_strategy(
    blocks: nn.Sequential | nn.ModuleList,
    ck: CheckpointSpec,
    *,
    device: torch.device,
    on_recompute: RecomputeHook | None = None,
    ranges: Sequence[tuple[int, int] | tuple[int, int, str]] | None = None,
) -> int:
    """Regroup ``blocks`` in place for ``ck.strategy``; returns the number of wrapped groups.

    The groups and how each is wrapped come from the strategy table
    (:mod:`ckptlab.strategies`: ``groups`` and ``mechanism``). Parameters keep their
    identity (the optimizer may be built before or after). ``ranges``: the groups of a
    planned strategy (``auto``: :mod:`ckptlab.worker.engine.autoplan`), in place of the table's;
    a range ``(start, end, policy)`` is checkpointed under that selective policy
    (``context_fn``, non-reentrant), whatever the strategy.

    Raises:
        ValueError: an unknown strategy, or one that needs ``use_reentrant=False`` with
            ``use_reentrant=True`` (PyTorch requires it for ``context_fn``), or a range with a
            policy under ``use_reentrant=True`` or an unknown policy, or ranges with
            ``compile_scope`` ``step`` (which compiles no block group).
    """
    strategy = get_strategy(ck.strategy)
    if strategy.needs_non_reentrant and ck.use_reentrant:
        raise ValueError(f"strategy {ck.strategy!r} needs use_reentrant=False")
    context_fn = selective_context(ck.policy) if strategy.mechanism == Mechanism.CHECKPOINT_WITH_POLICY else None
    ranges = _ranges(strategy, ck, len(blocks), ranges)
    for start, end, *policy in ranges:
        members = [blocks[i] for i in range(start, end)]
        if policy:
            if ck.use_reentrant:
                raise ValueError(f"a selective range {(start, end, *policy)} needs use_reentrant=False")
            wrapped: nn.Module = CheckpointedGroup(
                members,
                use_reentrant=False,
                preserve_rng_state=ck.preserve_rng_state,
                context_fn=selective_context(policy[0]),
                on_recompute=on_recompute,
            )
        elif strategy.mechanism == Mechanism.SAVE_ON_CPU:
            wrapped = OffloadedGroup(members, pin_memory=device.type == "cuda")
        elif strategy.mechanism == Mechanism.COMPILE:
            wrapped = CompiledGroup(members, activation_memory_budget=ck.activation_memory_budget)
        else:
            wrapped = CheckpointedGroup(
                members,
                use_reentrant=ck.use_reentrant,
                preserve_rng_state=ck.preserve_rng_state,
                context_fn=context_fn,
                on_recompute=on_recompute,
            )
        wrapped.blocks_range = (start, end)  # type: ignore[assignment]
        if isinstance(wrapped, CheckpointedGroup):  # the selective policy it runs under, if any
            wrapped.policy = policy[0] if policy else ck.policy if context_fn is not None else None
        blocks[start] = wrapped
        for i in range(start + 1, end):
            blocks[i] = GroupedAway(wrapped, members[i - start], last=i == end - 1)
    return len(ranges)
