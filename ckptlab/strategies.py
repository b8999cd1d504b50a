"""The strategy table: every checkpointing strategy, declared once.

Each :class:`Strategy` says which checkpoint fields it reads, how the worker wraps its
groups of blocks (:class:`Mechanism`, from which "recomputes" and "needs
``use_reentrant=False``" follow), which half-open block ranges it wraps, its sort rank
and its label. Spec validation (:mod:`ckptlab.spec.experiment`), sweep ordering and charts (the
backend), the worker's regrouping (``ckptlab.worker.engine.strategies.apply_strategy``) and the form
(through ``GET /api/meta`` ``strategy_table``) all read this table; nothing else spells
a strategy or a selective policy name. This module imports neither torch nor FastAPI.

Example usage (adding a strategy; see docs/architecture.md)::

    from ckptlab.strategies import Mechanism, Strategy, register_strategy

    register_strategy(Strategy(
        name="odd_blocks", summary="checkpoint every other block", label="odd_blocks",
        fields=("use_reentrant", "preserve_rng_state"), mechanism=Mechanism.CHECKPOINT,
        groups=lambda n, ck: [(i, i + 1) for i in range(1, n, 2)], rank=35,
    ))

Known limitations:
    - A strategy's parameters are fields of ``CheckpointSpec`` (``segments``, ``every``,
      ``policy``); a strategy with a new kind of parameter also adds that field there.
    - Registration is per process: a strategy registered in a worker that the API
      process does not know is refused by the API (422), never run by surprise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

__all__ = [
    "CompileScope",
    "Mechanism",
    "SelectivePolicy",
    "Strategy",
    "STRATEGIES",
    "BASELINE",
    "PER_BLOCK",
    "get_strategy",
    "strategy_names",
    "register_strategy",
    "registered",
]


class Mechanism(StrEnum):
    """How the worker wraps each group of blocks a strategy names."""

    #: Nothing is wrapped: every activation is kept for backward (the baseline).
    KEEP = "keep"
    #: ``torch.utils.checkpoint.checkpoint`` per group: only the group's inputs are kept,
    #: the rest is recomputed during backward.
    CHECKPOINT = "checkpoint"
    #: Like :attr:`CHECKPOINT` with ``context_fn =
    #: create_selective_checkpoint_contexts(policy)``: ops the policy marks ``MUST_SAVE``
    #: are kept. PyTorch requires ``use_reentrant=False`` for ``context_fn``.
    CHECKPOINT_WITH_POLICY = "checkpoint_with_policy"
    #: ``torch.autograd.graph.save_on_cpu`` per group: no recomputation, the tensors saved
    #: for backward live in host memory (pinned on CUDA).
    SAVE_ON_CPU = "save_on_cpu"
    #: ``torch.compile`` per group, or over the whole forward and loss (``compile_scope``,
    #: :class:`CompileScope`), with ``torch._functorch.config.activation_memory_budget``:
    #: the compiler's min-cut partitioner chooses what to save and what to recompute
    #: (PyTorch blog "Activation checkpointing techniques", 2025). Its memory is read from
    #: the allocator (the CPU tracker cannot watch compiled code: issue 21).
    COMPILE = "compile"


class SelectivePolicy(StrEnum):
    """Named policies for :attr:`Mechanism.CHECKPOINT_WITH_POLICY` (``checkpoint.policy``)."""

    #: Save the outputs of mm/addmm/bmm/convolution, recompute the rest (cheap elementwise
    #: ops, softmax; Korthikanti et al. 2022, arXiv 2205.05198).
    SAVE_MATMULS = "save_matmuls"
    #: Also save the fused scaled-dot-product attention outputs.
    SAVE_MATMULS_AND_ATTENTION = "save_matmuls_and_attention"
    #: Save nothing extra: the same as plain checkpointing.
    RECOMPUTE_ALL = "recompute_all"


class CompileScope(StrEnum):
    """What :attr:`Mechanism.COMPILE` compiles (``checkpoint.compile_scope``)."""

    #: The block list as one function; the stem, the head and the loss run eagerly.
    BLOCKS = "blocks"
    #: The model's whole forward and the loss as one function: the min-cut partitioner
    #: also chooses what the head and the loss save for backward (a cross-entropy's
    #: log-probabilities, which eager autograd keeps, it can recompute from the logits).
    STEP = "step"


class _CheckpointFields(Protocol):
    segments: int
    every: int


#: ``groups(n_blocks, checkpoint_spec) -> [(start, end), ...]``: half-open block ranges.
Groups = Callable[[int, _CheckpointFields], list[tuple[int, int]]]


@dataclass(frozen=True)
class Strategy:
    """One checkpointing strategy.

    Attributes:
        name: the value of ``checkpoint.strategy``.
        summary: one line on what it does (the form's option text).
        label: a ``str.format`` template over the checkpoint fields naming one setting of
            it, e.g. ``"sequential ({segments})"``.
        fields: the ``CheckpointSpec`` fields it reads (the form shows only these; the
            spec checks ``segments``/``every`` against the model's depth when read).
        mechanism: how each group is wrapped (:class:`Mechanism`).
        groups: the half-open block ranges it wraps, from the number of blocks and the
            checkpoint spec (:data:`Groups`).
        rank: sort rank, simplest first; a tie between two runs goes to the lower rank.
        order_by: ``(field, sign)`` pairs ordering settings of this strategy from the
            simplest (``("segments", 1)``: fewer segments first).
        sweep_default: ticked by default on the form's strategy axis.
        planned: the engine plans the groups at run time for ``checkpoint.budget_bytes``
            (profiling the blocks, ``ckptlab.planning.planner``) instead of calling ``groups``.
    """

    name: str
    summary: str
    label: str
    fields: tuple[str, ...]
    mechanism: Mechanism
    groups: Groups
    rank: int
    order_by: tuple[tuple[str, int], ...] = ()
    sweep_default: bool = False
    planned: bool = False

    @property
    def recomputes(self) -> bool:
        """It runs groups through ``torch.utils.checkpoint`` (so ``use_reentrant`` and
        ``preserve_rng_state`` matter)."""
        return self.mechanism in (Mechanism.CHECKPOINT, Mechanism.CHECKPOINT_WITH_POLICY)

    @property
    def compiles(self) -> bool:
        """It runs its groups under ``torch.compile`` (compile time is reported apart)."""
        return self.mechanism == Mechanism.COMPILE

    @property
    def needs_non_reentrant(self) -> bool:
        """It needs ``use_reentrant=False`` (PyTorch: ``context_fn`` requires it)."""
        return self.mechanism == Mechanism.CHECKPOINT_WITH_POLICY

    def label_for(self, checkpoint: Mapping[str, Any]) -> str:
        """The label of one setting (``"sequential (4)"``); fields the mapping lacks read ``?``."""
        return self.label.format_map(_Missing(checkpoint))

    def simplicity(self, checkpoint: Mapping[str, Any]) -> tuple:
        """A sort key, simplest first: the rank, then :attr:`order_by`."""
        values = [(sign, checkpoint.get(f)) for f, sign in self.order_by]
        return (
            self.rank,
            *(sign * v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0 for sign, v in values),
        )

    def public(self) -> dict[str, Any]:
        """What ``GET /api/meta`` serves of it (the frontend's only source)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "label": self.label,
            "fields": list(self.fields),
            "recomputes": self.recomputes,
            "needs_non_reentrant": self.needs_non_reentrant,
            "compiles": self.compiles,
            "rank": self.rank,
            "sweep_default": self.sweep_default,
            "baseline": self.name == BASELINE,
            "planned": self.planned,
        }


class _Missing(dict):
    def __init__(self, values: Mapping[str, Any]):
        super().__init__(values)

    def __missing__(self, key: str) -> str:
        return "?"

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key) if key in self else self.__missing__(key)
        # Byte fields read as bytes ("auto (25,165,824 B)"); the frontend writes MiB.
        return f"{value:,} B" if key.endswith("_bytes") and isinstance(value, int) else value


def _sequential(n: int, ck: _CheckpointFields) -> list[tuple[int, int]]:
    # torch.utils.checkpoint.checkpoint_sequential: len // segments blocks per segment, the
    # first segments - 1 checkpointed, the last run normally.
    size = n // ck.segments
    return [(start, start + size) for start in range(0, size * (ck.segments - 1), size)]


def _every(n: int, ck: _CheckpointFields) -> list[tuple[int, int]]:
    return [(start, min(start + ck.every, n)) for start in range(0, n, ck.every)]


_FLAGS = ("use_reentrant", "preserve_rng_state")
_TABLE: dict[str, Strategy] = {}
#: The table, read-only and live: name -> :class:`Strategy`, in registration order.
STRATEGIES: Mapping[str, Strategy] = MappingProxyType(_TABLE)
#: The strategy every comparison is made against: keep every activation.
BASELINE = "none"
#: The strategy that checkpoints every group of ``every`` blocks (Megatron's "uniform").
PER_BLOCK = "per_block"


def register_strategy(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to the table; returns it.

    Raises:
        ValueError: its name is taken or not ``[a-z0-9_]+``.
    """
    if strategy.name in _TABLE:
        raise ValueError(f"strategy {strategy.name!r} is already registered")
    if not strategy.name or not all(c.islower() or c.isdigit() or c == "_" for c in strategy.name):
        raise ValueError(f"strategy name {strategy.name!r} must be lower-case letters, digits and underscores")
    _TABLE[strategy.name] = strategy
    return strategy


@contextmanager
def registered(strategy: Strategy) -> Iterator[Strategy]:
    """Register ``strategy`` for the ``with`` block only (tests, notebooks)."""
    register_strategy(strategy)
    try:
        yield strategy
    finally:
        _TABLE.pop(strategy.name, None)


def get_strategy(name: str) -> Strategy:
    """The table's entry for ``name``.

    Raises:
        ValueError: no such strategy (the message lists the known ones).
    """
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; expected one of {', '.join(strategy_names())}") from None


def strategy_names() -> list[str]:
    """Every registered strategy's name, by rank."""
    return [s.name for s in sorted(_TABLE.values(), key=lambda s: s.rank)]


register_strategy(
    Strategy(
        name=BASELINE,
        summary="keep every activation",
        label=BASELINE,
        fields=(),
        mechanism=Mechanism.KEEP,
        groups=lambda n, ck: [],
        rank=0,
    )
)
register_strategy(
    Strategy(
        name="sequential",
        summary="checkpoint_sequential",
        label="sequential ({segments})",
        fields=("segments", *_FLAGS),
        mechanism=Mechanism.CHECKPOINT,
        groups=_sequential,
        rank=10,
        order_by=(("segments", 1),),
        sweep_default=True,
    )
)
register_strategy(
    Strategy(
        name=PER_BLOCK,
        summary="every N blocks",
        label="per_block (every {every})",
        fields=("every", *_FLAGS),
        mechanism=Mechanism.CHECKPOINT,
        groups=_every,
        rank=20,
        order_by=(("every", -1),),
        sweep_default=True,
    )
)
register_strategy(
    Strategy(
        name="selective",
        summary="save matmuls, recompute the rest",
        label="selective ({policy}, every {every})",
        fields=("every", "policy", *_FLAGS),
        mechanism=Mechanism.CHECKPOINT_WITH_POLICY,
        groups=_every,
        rank=30,
        order_by=(("every", -1),),
    )
)
register_strategy(
    Strategy(
        name="offload",
        summary="keep activations in host memory",
        label="offload",
        fields=(),
        mechanism=Mechanism.SAVE_ON_CPU,
        groups=lambda n, ck: [(0, n)],
        rank=40,
    )
)
register_strategy(
    Strategy(
        name="auto",
        summary="the least recomputation that fits a memory budget",
        label="auto ({budget_bytes})",
        fields=("budget_bytes", "search_compile", *_FLAGS),
        mechanism=Mechanism.CHECKPOINT,
        groups=lambda n, ck: [],  # planned at run time (ckptlab.worker.engine.autoplan)
        rank=50,
        planned=True,
    )
)
register_strategy(
    Strategy(
        name="compile_budget",
        summary="torch.compile with an activation memory budget (0-1)",
        label="compile_budget ({activation_memory_budget}, {compile_scope})",
        fields=("activation_memory_budget", "compile_scope"),
        mechanism=Mechanism.COMPILE,
        groups=lambda n, ck: [(0, n)],
        rank=60,
        order_by=(("activation_memory_budget", -1),),
    )
)
