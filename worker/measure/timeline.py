"""The memory timeline of one step (issue 34): every allocation and free the exact live-tensor
tracker counts, in order, each with the module that made the tensor, the op, the phase,
whether autograd saved it for backward and the checkpoint region it was made in.

The tracker (:class:`ckptlab.worker.measure.memory.LiveTensorTracker`) tells its
``recorder`` of each counted allocation and free; this module names them:

- **Module**: while a step is recorded, each of the model's modules runs its ``forward``
  through a wrapper (an instance attribute, removed after the step, or after the last of
  steps recorded one after another: :meth:`TimelineRecorder.stop`) that keeps a stack of
  the modules running (in forward, and in a checkpoint's recomputation during backward).
  In backward, the autograd node running (``torch._C._current_autograd_node()``) is mapped
  back to the module whose forward made it, by its sequence number (nodes are numbered in
  the order they are made, ``torch._C._autograd._get_sequence_nr()``: the forward wrappers
  note where each module's forward began and ended in that numbering). What runs outside
  every module is named by its place in the step: ``<batch>`` (the input batch),
  ``<loss>`` (the loss and its backward), ``<optimizer>`` (the optimizer's temporaries).
  Parameters, their gradients and the optimizer state are named after the module owning
  the parameter (:meth:`TimelineRecorder.name`). What none of this names is ``unknown``.
- **Saved for backward**: a saved-tensor pack hook (``torch.autograd.graph.saved_tensors_hooks``)
  marks what autograd saves outside checkpoint regions (a checkpoint's own hooks take over
  inside one); what a checkpoint region made in forward and still held at the end of
  forward (its RNG state, a selective policy's saved outputs, its output) is marked too.
- **Recomputation**: the spans between :meth:`TimelineRecorder.recompute` calls (the
  engine's recomputation hook); blocks made in them are marked recomputed.

Example usage::

    recorder = TimelineRecorder(tracker, names={model: "", model.fc: "fc"})
    with tracker:
        recorder.begin()
        recorder.phase("forward")
        loss = model(x).sum()
        recorder.phase("backward")
        loss.backward()
        events = recorder.end()  # the columns of ckptlab.analysis.timeline.StepTimeline

Known limitations:
    - Tensors a tensor subclass allocates inside its own dispatch are not seen (as by the
      tracker). A gradient buffer autograd hands to a parameter without a copy is named
      after the module whose backward node made it (the module that used the parameter:
      its owner but for shared weights).
    - A checkpoint region's saved tensors other than those it still holds at the end of
      forward are not marked (they are not held).
    - A module's own forward pre-hooks and hooks run outside its wrapper: what they
      allocate is named after the module that called it (global module hooks would run
      before them, but put every module call of the process on ``nn.Module._call_impl``'s
      slow path: about 1% of the tests' tiny transformer's memory pass, docs/benchmarks.md).
    - During a recorded step (and between steps recorded one after another) the model's
      modules carry the wrappers: a copy or pickle of the model made then (user code; the
      engine makes none inside the memory pass) copies or fails on them, and a ``forward``
      a model stores for later calls keeps the step's wrapper. A ``forward`` replaced
      between two steps recorded one after another is not followed in the second.
    - A step's hooks are the thread's that began it (autograd's saved-tensor hooks are per
      thread): begin, stop, release and abort on that thread.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from ckptlab.domain import Unattributed
from ckptlab.worker.measure.memory import LiveTensorTracker
from ckptlab.worker.measure.recorded_step import RecordedStep

__all__ = ["TimelineRecorder"]

UNKNOWN, BATCH, LOSS, OPTIMIZER = (
    Unattributed.UNKNOWN.value,
    Unattributed.BATCH.value,
    Unattributed.LOSS.value,
    Unattributed.OPTIMIZER.value,
)
_LOSS = (LOSS, -1)
#: An autograd node's sequence number when it has none (AccumulateGrad: UINT64_MAX).
_NO_SEQUENCE = 2**63
# (module-level names of the C calls the hooks make at every module call and event)
_sequence_nr, _current_node, _thread_id = (
    torch._C._autograd._get_sequence_nr,
    torch._C._current_autograd_node,
    threading.get_ident,
)
_no_python_dispatch = torch._C._DisableTorchDispatch


def _same(t: Any) -> Any:
    """The unpack hook: the tensor as packed."""
    return t


def _counted(t: Any) -> bool:
    """Whether ``t`` is a tensor whose storage the tracker counts and names: a plain one, or
    a prediction's fake one (:mod:`ckptlab.worker.predict`) but a parameter (a real run's
    parameters are ``nn.Parameter``, not plain: a fake one is a ``FakeTensor`` marked as a
    parameter), not on ``meta``."""
    plain = type(t) is torch.Tensor or (type(t) is FakeTensor and not isinstance(t, nn.Parameter))
    return plain and t.device.type != "meta"


class TimelineRecorder:
    """Records one step's allocations and frees as counted by ``tracker``, named.

    Args:
        tracker: the run's live-tensor tracker (CPU; exact bytes).
        names: module -> its fully-qualified name (their ``forward`` is wrapped while steps
            are recorded, and only then; other modules are not followed).
        regions: module -> the index of the checkpoint region it runs in (the modules of a
            checkpointed group); modules not in it run in none.
        region_roots: the module that is each region (a checkpointed group) -> its index:
            the first tensor of its output is the region's output (what it passes on).
        policy_ops: per region (its index), the names of the ops whose outputs its
            selective policy saves (``aten.mm.default``); a region without one is not in it.
        param_owners: ``id`` of each parameter -> (the parameter, the name of the module
            owning it): a gradient that autograd's ``AccumulateGrad`` node makes for it is
            named after that module (keyed by ``id``: a tensor's hash is a Python call).
        reentrant: the checkpoints are reentrant (``use_reentrant=True``): their recomputed
            graphs are run by a backward of their own, on the thread that recomputed them.

    Attributes:
        op: the op (``OpOverload``) or call the tracker is counting outputs of (set by the tracker).
        blocks: per block of the step, five items in a row: tracker entry, bytes, (module
            name, region), op, recomputations running as it was made. Flat: a tuple per block
            is one more object for the garbage collector to traverse until the columns
            (its slices, :meth:`RecordedStep.columns`, which code names and ops once per kept
            step) are made: a third of its work in a recorded pass (docs/benchmarks.md).
        events: the step's events: a block's index at its allocation, ``~index`` at its free.
        owner: (module name, region) of what is made now: the innermost module running, else
            the place in the step (``<batch>``, ``<loss>``, ``<optimizer>``); None in backward
            outside every module (ask :meth:`node_owner`). Kept up to date by the module
            wrappers and :meth:`phase`, so that an allocation reads one attribute.
        recomputing: recomputations running now.

    The tracker appends to :attr:`blocks` and :attr:`events` itself
    (:meth:`LiveTensorTracker._count` and ``_on_free``, as :meth:`alloc` and :meth:`free`
    would): a Python call per event less, on the tests' tiny transformer about a tenth of
    what recording costs its memory pass (docs/benchmarks.md).
    """

    def __init__(
        self,
        tracker: LiveTensorTracker,
        names: Mapping[nn.Module, str],
        regions: Mapping[nn.Module, int] | None = None,
        *,
        region_roots: Mapping[nn.Module, int] | None = None,
        policy_ops: Mapping[int, Iterable[str]] | None = None,
        param_owners: Mapping[int, tuple[torch.Tensor, str]] | None = None,
        reentrant: bool = False,
    ):
        self.tracker, self.names, self.regions = tracker, dict(names), dict(regions or {})
        self.reentrant = reentrant
        #: id of each parameter -> (it, its module's name): a tensor's hash is a Python call
        self._param_by_id = dict(param_owners or {})
        self.region_roots, self.policy_ops = (
            dict(region_roots or {}),
            {r: frozenset(ops) for r, ops in (policy_ops or {}).items()},
        )
        #: module -> (its name, its region): what the forward wrappers push
        self._owner_of = {m: (name, self.regions.get(m, -1)) for m, name in self.names.items()}
        self.op: Any = None
        #: the modules whose forward is wrapped now, each with the instance ``forward`` it
        #: had before (None: the class's) and the wrapper
        self._wrapped: list[tuple[nn.Module, Any, Any]] = []
        self._hooked_thread = -1  # the thread the hooks are on (a step's, begun there)
        self._saved_hooks: contextlib.ExitStack | None = None
        # the module stack and where each module's forward began and ended in autograd's
        # numbering of nodes, with the module running there; numbers are counted per thread:
        # the step's thread's here, a recomputation's on autograd's device thread (CUDA) in
        # _other, with the ranges of numbers each of its recomputations made. The wrappers
        # hold these: emptied, not replaced, from step to step
        self._stack: list[tuple[str, int]] = []
        self._seqs: list[int] = []
        self._owners: list[tuple[str, int]] = []
        self._other: dict[int, tuple[list[int], list[tuple[str, int]]]] = {}
        self._resident_owners: dict[str, tuple[str, int]] = {}  # (one owner per name, step to step)
        self._reset()

    def _reset(self) -> None:
        self.blocks: list[Any] = []  # (flat: five items a block)
        self._renamed: dict[int, str] = {}
        self.events: list[int] = []
        #: blocks autograd packed -> the region whose forward packed it (-1: none)
        self._saved: dict[int, int] = {}
        #: each region's output block -> the region
        self._outputs: dict[int, int] = {}
        self._phases: list[tuple[int, str]] = []
        self._recompute_spans: list[list[int]] = []
        for marks in (self._stack, self._seqs, self._owners, self._other):
            marks.clear()
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self._range_starts: list[int] = []
        self._thread = threading.get_ident()
        self._phase: str | None = None
        self._backward = False
        self._scope: tuple[str, int] = (BATCH, -1)  # the owner of what is made outside modules
        self.owner: tuple[str, int] | None = self._scope
        self.recomputing = 0
        self._last_seq, self._last_tid = -1, -1  # the node node_owner looked up last
        self._last_owner: tuple[str, int] = (UNKNOWN, -1)
        self._resident = 0

    # -- a step ------------------------------------------------------------------------

    def begin(self, names_by_key: Mapping[int, str] | None = None) -> None:
        """Start recording a step: the blocks alive now are its resident blocks, named by
        their storage's key (``UntypedStorage._cdata``) in ``names_by_key`` (the parameters',
        the optimizer state's), else ``unknown`` until :meth:`name_storages` names them. The step's
        phases are told by :meth:`phase`. Call inside the tracker's mode. The module wrappers
        and the saved-tensor hooks of a step stopped with ``keep_hooks`` serve this one; a
        step begun while another is recorded takes its hooks over.

        Raises:
            RuntimeError: hooks a step left on are another thread's (autograd's saved-tensor
                hooks are per thread: :meth:`release` them there first).
        """
        here = threading.get_ident()
        if (self._wrapped or self._saved_hooks is not None) and self._hooked_thread != here:
            raise RuntimeError("the timeline recorder's hooks are on another thread: release them there first")
        self._reset()  # (the step's thread: this one)
        named, extend, owners = (names_by_key or {}).get, self.blocks.extend, self._resident_owners
        for block, (key, (_ref, info)) in enumerate(self.tracker._live.items()):
            info.block = block
            name = named(key, UNKNOWN)
            owner = owners.get(name)
            if owner is None:
                owner = owners[name] = (name, -1)
            extend((info, info.nbytes, owner, None, 0))
        self._resident = len(self.blocks) // 5
        self._hooked_thread = here
        if not self._wrapped:
            self._wrap_forwards()
        if self._saved_hooks is None:
            self._saved_hooks = contextlib.ExitStack()
            self._saved_hooks.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _same))
        self.tracker.recorder = self

    def end(self) -> dict[str, Any]:
        """Stop recording; the step's columns (:meth:`RecordedStep.columns`)."""
        return self.stop().columns()

    def stop(self, keep_hooks: bool = False) -> RecordedStep:
        """Stop recording; the step as recorded, its columns made only when asked for (a
        step not kept costs no more). ``keep_hooks``: leave the module wrappers and the
        saved-tensor hooks on for a next step recorded right after this one (their setting up
        and taking off, on the tests' tiny transformer about a sixth of what recording costs
        a step); :meth:`release` takes them off. Until then every module call and every
        tensor autograd saves pays the hooks (nothing is recorded: the next step empties the
        module stack)."""
        self.tracker.recorder = None
        if not keep_hooks:
            self._stop_hooks()
        step = RecordedStep(self, self.policy_ops)
        self._reset()
        return step

    def release(self) -> None:
        """Take off the module wrappers and the saved-tensor hooks a step left on
        (:meth:`stop` with ``keep_hooks``), and the tracker's recorder if a step never
        stopped; nothing when none are on."""
        if self.tracker.recorder is self:
            self.tracker.recorder = None
        self._stop_hooks()

    def abort(self) -> None:
        """Stop recording without a result (the step raised)."""
        self.tracker.recorder = None
        self._stop_hooks()
        self._reset()

    def _wrap_forwards(self) -> None:
        """Each named module's ``forward`` through :meth:`_followed` as an instance
        attribute: ``nn.Module.__call__`` keeps its fast path (no hooks), where global
        module hooks sent every module call of the process down the slow one (a closure, a
        set and the hook loops per call). The wrappers hold the module stack and the node
        marks, emptied (not replaced) for each step they serve."""
        for module, owner in self._owner_of.items():
            own = module.__dict__.get("forward")
            followed = self._followed(module.forward, owner, self.region_roots.get(module))
            module.__dict__["forward"] = followed
            self._wrapped.append((module, own, followed))

    def _followed(self, forward: Any, owner: tuple[str, int], region: int | None) -> Any:
        """``forward`` (a module's, bound; ``owner``: its name and region; ``region``: the
        region it is the root of, or None) with the module pushed on the module stack
        before it and popped after it, also when it raises (a non-reentrant checkpoint
        stops its recomputation early by raising inside a block); each push and pop notes
        autograd's node number (see :meth:`node_owner`)."""
        stack, seqs, owners, step_thread, other = self._stack, self._seqs, self._owners, self._thread, self._other

        def followed(*args: Any, **kwargs: Any) -> Any:
            stack.append(owner)
            self.owner = owner
            tid = _thread_id()  # (the numbering is per thread: the step's, or another's)
            seq_marks, owner_marks = (seqs, owners) if tid == step_thread else other.setdefault(tid, ([], []))
            seq_marks.append(_sequence_nr())
            owner_marks.append(owner)
            output = None
            try:
                output = forward(*args, **kwargs)
                return output
            finally:
                if region is not None:
                    self._region_output(region, output)
                if stack:
                    stack.pop()
                if not stack and not self.recomputing:
                    self._scope = _LOSS  # the model returned: what follows is the loss
                top = stack[-1] if stack else self._scope
                self.owner = top if stack or not self._backward else None
                seq_marks.append(_sequence_nr())
                owner_marks.append(top)

        followed.__wrapped__ = forward  # type: ignore[attr-defined] - inspect.signature reads it
        return followed

    def _stop_hooks(self) -> None:
        # last wrapped first; a forward someone else put in place during the step stays
        for module, own, followed in reversed(self._wrapped):
            if module.__dict__.get("forward") is not followed:
                continue
            if own is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = own
        self._wrapped.clear()
        if self._saved_hooks is not None:
            self._saved_hooks.close()
            self._saved_hooks = None

    # -- naming ------------------------------------------------------------------------

    def name_storages(self, modules: Mapping[int, str]) -> None:
        """Name the live block of each storage of ``modules`` (``UntypedStorage._cdata`` ->
        module name) after its module (a parameter's owner: the parameter, its gradient, its
        optimizer state)."""
        live, n, renamed = self.tracker._live, len(self.blocks) // 5, self._renamed
        for key, module in modules.items():
            entry = live.get(key)
            if entry is not None and 0 <= entry[1].block < n:
                renamed[entry[1].block] = module

    def recompute(self, starting: bool) -> None:
        """A checkpoint's recomputation starts (True) or ends (False) now."""
        if starting:
            self.recomputing += 1
            self._recompute_spans.append([len(self.events), len(self.events)])
            self._range_starts.append(torch._C._autograd._get_sequence_nr())
        else:
            self.recomputing = max(self.recomputing - 1, 0)
            if self._recompute_spans:
                self._recompute_spans[-1][1] = len(self.events)
            if self._range_starts:
                span = (self._range_starts.pop(), torch._C._autograd._get_sequence_nr())
                self._ranges.setdefault(threading.get_ident(), []).append(span)

    def node_owner(self) -> tuple[str, int]:
        """The module whose forward made the autograd node running now (backward): looked up
        in the numbering of the thread that made it: the step's thread, but for the nodes a
        recomputation made on the thread running backward (a reentrant checkpoint's inner
        backward, on autograd's device thread on CUDA), by the numbers that recomputation
        made there."""
        node = _current_node()
        if node is None:
            return LOSS, -1  # the engine's seed gradient, before any node runs
        seq = node._sequence_nr()
        if seq >= _NO_SEQUENCE:  # AccumulateGrad: a parameter's gradient, named after its owner
            variable = getattr(node, "variable", None)
            entry = self._param_by_id.get(id(variable))
            return (entry[1], -1) if entry is not None and entry[0] is variable else (UNKNOWN, -1)
        tid = self._thread
        # (a non-reentrant checkpoint's recomputed graph is never run: every node is the step's)
        if self.reentrant:
            here = _thread_id()
            if here != tid and any(a <= seq < b for a, b in self._ranges.get(here, ())):
                tid = here
        if seq != self._last_seq or tid != self._last_tid:
            seqs, owners = (self._seqs, self._owners) if tid == self._thread else self._other[tid]
            i = bisect.bisect_right(seqs, seq) - 1
            self._last_seq, self._last_tid = seq, tid
            self._last_owner = owners[i] if 0 <= i else (UNKNOWN, -1)
        return self._last_owner

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Marks ``t``'s block saved for backward; keeps a detached alias (same storage, no
        new bytes): the tensor itself, an op's own output (sigmoid, relu, softmax), would tie
        the output to its graph node in a cycle that outlives the step when backward never
        reaches that node (an output the loss ignores), as BlockRecorder._pack says."""
        plain = type(t) is torch.Tensor
        if plain or (type(t) is FakeTensor and not isinstance(t, nn.Parameter)):  # (as _counted but
            # the meta check: a plain meta tensor's storage is never among the tracker's live ones)
            entry = self.tracker._live.get(t.untyped_storage()._cdata)
            if entry is not None and entry[1].block >= 0:
                self._saved.setdefault(entry[1].block, self._stack[-1][1] if self._stack else -1)
        if plain or type(t) is nn.Parameter:  # (a fake tensor's detach needs its mode: it stays fake)
            with _no_python_dispatch():  # the alias needs no count: no trip through the tracker's mode
                return t.detach()
        return t.detach()

    def _region_output(self, region: int, output: Any) -> None:
        first = output[0] if isinstance(output, tuple) and output else output
        if _counted(first):
            entry = self.tracker._live.get(first.untyped_storage()._cdata)
            if entry is not None and entry[1].block >= 0:
                self._outputs[entry[1].block] = region

    # -- the step's phases and the tracker's calls ----------------------------------------

    def phase(self, name: str) -> None:
        """The step enters phase ``name`` (``forward``, ``backward``, ``optimizer``) at its
        next event; what is made outside every module from now on is the batch's (forward),
        the autograd node's module's (backward) or the optimizer's. A phase left before any
        event is dropped (one phase per event index). Call between the model's calls."""
        if name == self._phase:
            return
        at = len(self.events)
        if self._phases and self._phases[-1][0] == at:
            self._phases.pop()
        self._phase = name
        if not self._phases or self._phases[-1][1] != name:
            self._phases.append((at, name))
        self._backward = name == "backward"
        if name == "forward":
            self._scope = (BATCH, -1)
        elif name == "optimizer":
            self._scope = (OPTIMIZER, -1)
        self.owner = self._stack[-1] if self._stack else None if self._backward else self._scope

    def alloc(self, info: Any, nbytes: int) -> None:
        """The tracker counted a new storage of ``nbytes`` bytes (``info``: its entry). (The
        tracker's own allocations append to :attr:`blocks` and :attr:`events` inline, as here.)"""
        owner = self.owner
        info.block = block = len(self.blocks) // 5
        self.blocks.extend((info, nbytes, owner if owner is not None else self.node_owner(), self.op, self.recomputing))
        self.events.append(block)

    def free(self, info: Any) -> None:
        """The tracker saw a counted storage freed (``info``: its entry)."""
        # every counted storage has a block of this step: begin numbered those alive then,
        # alloc the rest (a -1 would be one the tracker counted while nothing recorded)
        if info.block >= 0:
            self.events.append(~info.block)
