"""The memory pass's timelines (issue 34): steps of a run measured by the exact
live-tensor tracker (on CPU the run's own, on CUDA one of the recorded steps' own) are
recorded (:class:`ckptlab.worker.measure.timeline.TimelineRecorder`), and two are kept:
the first step and a step that reaches the run's peak (the summary's
``peak_allocated_bytes``: the highest step after the warm-up).

Not every step is recorded (recording costs a step about a tenth to a quarter more time on
small models, a fixed Python cost per allocation and per module call): the first step, the
first step after the warm-up, and each step after one whose peak went above every step
before it (:meth:`TimelineKeeper.wants`). Steps repeat once the optimizer state exists, so
a flat memory records two steps and stops (``memory_early_stop``), and a memory that moves
records the step after each move, which reaches the new peak when the steps then repeat.

Modules are named by their fully-qualified names in the model as built, before
checkpointing regrouped it: a checkpointed group's members (``blocks.0.group.1``) keep the
names of the blocks they were (``blocks.1``), so runs of every strategy name the same
modules alike. Each checkpointed (or offloaded) group is a checkpoint region, named by the
blocks it holds (``blocks.2`` or ``blocks.2-3``). Parameters and buffers, their gradients
and their optimizer state are named after the module that owns the parameter.

Nothing here runs in the timing pass: the hooks (the modules' forward wrappers and the
saved-tensor hooks) are put on for a recorded step and stay on only while the next step is
recorded too (:meth:`TimelineKeeper.release` takes them off before a step that is not, and
at the pass's end).

On CUDA (not compiled) a recorded step runs under a live-tensor tracker of its own
(:attr:`TimelineKeeper.shadow`: the CUDA storages, rounded to the allocator's 512-byte
blocks, tagged as the CPU tracker tags them): what the allocator holds that is no tensor's
as the step begins (cuBLAS workspaces) is one resident block, ``<not a tensor>``. The
run's own readings stay the allocator's; the timeline's maximum reads them to within what
the allocator makes inside the step that is no tensor's (a workspace's first use) and the
rounding of blocks it splits.

A CUDA run with ``memory_snapshot`` (and somewhere to write it) also records the
allocator's own history (``torch.cuda.memory._record_memory_history``) through each recorded
step, and snapshots it only when the step becomes the one its timeline keeps as the peak step
(:meth:`TimelineKeeper.peak_snapshot`): the pickle pytorch.org/memory_viz opens shows the same
step as the timeline. Starting a step's history clears any the caller had recorded.

A prediction (:mod:`ckptlab.worker.predict`) records its memory pass on fake tensors the
same way: on target ``cpu`` its timelines are the real run's, event for event.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ckptlab.analysis.timeline import RECOMPUTED, RESIDENT, SAVED, StepTimeline
from ckptlab.domain import MemoryCategory, Unattributed
from ckptlab.prediction.targets import CUDA_BLOCK_BYTES
from ckptlab.settings import get_settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import Strategy
from ckptlab.worker.engine.strategies import CheckpointedGroup, OffloadedGroup, policy_saved_ops
from ckptlab.worker.measure.memory import UNTRACKED_KEY, LiveTensorTracker
from ckptlab.worker.measure.meter import Meter, optimizer_tensors
from ckptlab.worker.measure.recorded_step import RecordedStep
from ckptlab.worker.measure.timeline import TimelineRecorder
from ckptlab.worker.models.base import Built, WrappedModel

__all__ = ["AllocatorHistory", "StepSnapshots", "TimelineContext", "TimelineKeeper", "module_names"]

#: Allocator events kept per recorded step (``max_entries`` of ``_record_memory_history``)
SNAPSHOT_MAX_ENTRIES = 200_000


class TimelineContext(Protocol):
    """What the keeper reads of a run (:class:`ckptlab.worker.engine.context.RunContext`)."""

    spec: ExperimentSpec
    strategy: Strategy
    meter: Meter
    built: Built
    params: list[nn.Parameter]
    opt: torch.optim.Optimizer
    where: dict[str, Any]


class StepSnapshots(Protocol):
    """What records one step's allocator history (:class:`AllocatorHistory` on CUDA)."""

    def start(self) -> None:
        """Begin a step's history, forgetting what came before."""

    def take(self) -> bytes:
        """Stop recording; the step's snapshot, pickled."""

    def stop(self) -> None:
        """Stop recording; nothing kept."""


class AllocatorHistory:
    """One step's CUDA allocator history for pytorch.org/memory_viz:
    ``torch.cuda.memory._record_memory_history(clear_history=True)`` before the step, then
    ``torch.cuda.memory._snapshot()`` (what ``_dump_snapshot`` pickles: the segments alive
    and the step's allocation and free events, with their stack traces), recording then
    switched off (PyTorch docs, "Understanding CUDA Memory Usage").

    Args:
        max_entries: allocator events kept (the step's last ones past that).
    """

    def __init__(self, max_entries: int = SNAPSHOT_MAX_ENTRIES):
        self.max_entries = max_entries

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(enabled="all", max_entries=self.max_entries, clear_history=True)

    def take(self) -> bytes:
        try:
            return pickle.dumps(torch.cuda.memory._snapshot())
        finally:
            self.stop()

    def stop(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)


def step_snapshots(run: TimelineContext, wanted: bool) -> StepSnapshots | None:
    """The allocator history to record with each recorded step: on CUDA when ``wanted`` (the
    spec asks for ``memory_snapshot`` and the caller has a path to write it to), else None."""
    return AllocatorHistory() if wanted and run.meter.cuda else None


def module_names(root: nn.Module) -> tuple[dict[nn.Module, str], dict[nn.Module, int], list[str]]:
    """``(names, regions, region_names)`` of ``root``'s modules: each module's
    fully-qualified name as built (a checkpointed group's member ``<c>.<i>.group.<j>`` is
    ``<c>.<i+j>``; inside a :class:`~ckptlab.worker.models.base.WrappedModel`, as its
    author named it), the index of the checkpoint region each module of a checkpointed or
    offloaded group runs in, and the regions' names (``<c>.<i>``, or ``<c>.<i>-<k>`` for
    blocks ``i`` to ``k``)."""
    renames: list[tuple[str, str]] = []
    regions: dict[nn.Module, int] = {}
    region_names: list[str] = []
    named = list(root.named_modules())
    for fqn, module in named:
        if isinstance(module, CheckpointedGroup | OffloadedGroup) and hasattr(module, "blocks_range"):
            start, end = module.blocks_range
            container = fqn.rpartition(".")[0]
            prefix = f"{container}." if container else ""
            renames += [(f"{fqn}.group.{j}", f"{prefix}{start + j}") for j in range(end - start)]
            region_names.append(f"{prefix}{start}" + (f"-{end - 1}" if end - start > 1 else ""))
            for sub in module.modules():
                regions[sub] = len(region_names) - 1

    def renamed(fqn: str) -> str:
        for old, new in renames:
            if fqn == old or fqn.startswith(old + "."):
                return new + fqn[len(old) :]
        return fqn

    names = {m: renamed(fqn) for fqn, m in named} if renames else {m: fqn for fqn, m in named}
    if isinstance(root, WrappedModel):  # the model's own names: ``layers.0``, not ``model.layers.0``
        names = {m: _unwrapped(name) for m, name in names.items()}
        region_names = [_unwrapped(name) for name in region_names]
    return names, regions, region_names


def _unwrapped(name: str) -> str:
    """``name`` without the adapter's ``model.`` (:class:`WrappedModel`)."""
    return "" if name == "model" else name.removeprefix("model.")


def _timeline(step: int, columns: dict[str, Any], regions: list[str]) -> StepTimeline:
    """A recorder's columns as the stored contract, its ``flags`` made from its bits and its
    regions named."""
    for keep in columns["region_keeps"]:
        keep["region"] = regions[keep["region"]]
    saved, recomputed = columns.pop("saved"), columns.pop("recomputed")
    flags = np.where(saved, SAVED, 0) | np.where(recomputed, RECOMPUTED, 0)
    flags[: columns["n_resident"]] |= RESIDENT
    return StepTimeline(step=step, flags=flags.astype(np.uint8), regions=regions, **columns)


class TimelineKeeper:
    """Records memory-pass steps of ``run`` and keeps the first and a peak step.

    Use :meth:`for_run` (None where no timeline is recorded) as a context around the pass (its
    hooks off at the end), then, per step, :meth:`step` around it (:meth:`recording` when it
    :meth:`wants` it) and :meth:`keep` with its record (every step, recorded or not);
    :meth:`kept` gives what to store.

    Known limitations:
        - The kept peak step may be a later step than the summary's peak step (the first
          step reaching the peak) when that one was not recorded; it reaches the same bytes.
        - A peak reached only by the pass's last step, after flat steps, is not recorded:
          the kept step below it is then not marked the peak (:meth:`kept`). A memory that
          rises, falls and rises again records every step until one reaching its highest
          peak is recorded.
    """

    def __init__(self, run: TimelineContext, snapshots: bool = False):
        self.run = run
        names, regions, self.region_names = module_names(run.built.module)
        roots = {m: i for m, i in regions.items() if isinstance(m, CheckpointedGroup)}  # each recomputing group
        # each region's selective policy: the strategy's, or (auto) the one its plan chose
        policies = {i: policy_saved_ops(m.policy) for m, i in roots.items() if m.policy is not None}
        #: id of each parameter and buffer -> (it, the name of the module owning it)
        self.owner: dict[int, tuple[torch.Tensor, str]] = {}
        for module, fqn in names.items():  # (the module's own dicts: its generators cost more)
            for t in (*module._parameters.values(), *module._buffers.values()):
                if t is not None:
                    self.owner.setdefault(id(t), (t, fqn))
        #: On CUDA, the live-tensor tracker a recorded step runs under (the CPU's is the run's own)
        self.shadow = (
            None
            if run.meter.exact
            else LiveTensorTracker(block_bytes=CUDA_BLOCK_BYTES, count_rng_states=False, device_type="cuda")
        )
        self.recorder = TimelineRecorder(
            self.shadow or run.meter.probe,  # type: ignore[arg-type]
            names,
            regions,
            region_roots=roots,
            policy_ops=policies,
            param_owners=self.owner,
            reentrant=run.spec.checkpoint.use_reentrant,
        )
        #: storage key -> module name of the parameters, buffers and (once made) optimizer state
        self.by_key = {t.untyped_storage()._cdata: fqn for t, fqn in self.owner.values()}
        self.by_key[UNTRACKED_KEY] = Unattributed.NOT_A_TENSOR.value
        self._state_named = False
        #: the step just recorded: (step, what the recorder left), made a timeline if kept
        self.last: tuple[int, RecordedStep] | None = None
        self._first: StepTimeline | None = None
        self._best: dict[bool, tuple[int, StepTimeline]] = {}
        #: the highest peak of any step so far, of the steps after the warm-up (bytes)
        self._highest: dict[bool, int] = {}
        #: the last step's peak went above every step before it: record the next one
        self._moved = False
        #: CUDA, ``memory_snapshot``: the allocator history of each recorded step, open from
        #: the step's start until :meth:`keep` takes it (the step became the peak candidate) or
        #: drops it; the one taken: (step, pickled snapshot)
        self.snapshots = step_snapshots(run, snapshots)
        self._history_open = False
        self._peak_snapshot: tuple[int, bytes] | None = None

    @staticmethod
    def records(run: TimelineContext, *, one_process: bool) -> bool:
        """Whether :meth:`for_run` gives ``run`` a keeper (see there)."""
        cuda = run.meter.cuda and not run.strategy.compiles  # compiled kernels allocate unseen
        return one_process and (run.meter.exact or cuda) and get_settings().record_timeline

    @classmethod
    def for_run(cls, run: TimelineContext, *, one_process: bool, snapshots: bool = False) -> TimelineKeeper | None:
        """A keeper for ``run``, or None: off (``record_timeline``), a compiled run (its
        kernels allocate where no tracker sees; on CPU the allocator probe measures it), or
        not ``one_process`` (a rank of a sharded run, real or a prediction's rank 0). A CUDA
        run's steps are recorded under a tracker of their own (:attr:`shadow`). A
        prediction's run on fake tensors is recorded as a real one is: the same tracker
        counts its tensors' bytes (on a CUDA target rounded as the allocator rounds them;
        the prediction's modelled terms, such as the cuBLAS workspaces, are not events)."""
        return cls(run, snapshots) if cls.records(run, one_process=one_process) else None

    def wants(self, step: int) -> bool:
        """Whether to record step ``step`` (1-based): the first step, the first after the
        warm-up (``spec.warmup_steps``), and a step after one whose peak allocated bytes went
        above every step's before it (in its class: warm-up, or after it)."""
        return step in (1, self.run.spec.warmup_steps + 1) or self._moved

    @contextlib.contextmanager
    def recording(self, step: int) -> Iterator[None]:
        """Record step ``step`` (:attr:`last` afterwards, for :meth:`keep`)."""
        rec, meter, shadow, snapshots = self.recorder, self.run.meter, self.shadow, self.snapshots
        self.last = None
        if shadow is not None:
            self._track_resident(shadow)
            shadow.__enter__()
            meter.shadow = shadow
        rec.begin(self.by_key)
        meter.timeline = rec
        try:
            if snapshots is not None:
                snapshots.start()
                self._history_open = True
            yield
        except BaseException:
            rec.abort()
            self._close_history()
            raise
        finally:
            meter.timeline = None
            if shadow is not None:
                meter.shadow = None
                shadow.__exit__(None, None, None)
        if not self._state_named:  # the optimizer makes its state in its first step
            self._name_optimizer_state()
        self.last = (step, rec.stop(keep_hooks=True))

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Around memory step ``step``: :meth:`recording` it when :meth:`wants` it, else with
        the recorder's hooks off (:meth:`release`)."""
        if self.wants(step):
            with self.recording(step):
                yield
        else:
            self.release()
            yield

    def release(self) -> None:
        """Take the recorder's hooks off (before a step not recorded, and at the pass's end):
        what the steps recorded one after another shared (:meth:`TimelineRecorder.stop`)."""
        self.recorder.release()

    def __enter__(self) -> TimelineKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _track_resident(self, shadow: LiveTensorTracker) -> None:
        """On CUDA, before a recorded step: count what is alive on the device by what it is
        (parameters and buffers, gradients, optimizer state), and the allocator's allocated
        bytes beyond them as one block that is no tensor's (cuBLAS workspaces)."""
        run = self.run
        for category, tensors in (
            (MemoryCategory.PARAMETERS, [*run.params, *run.built.module.buffers()]),
            (MemoryCategory.GRADIENTS, [p.grad for p in run.params if p.grad is not None]),
            (MemoryCategory.OPTIMIZER_STATE, list(optimizer_tensors(run.opt))),
        ):
            shadow.category = category.value
            for t in tensors:
                shadow.track(t)
        shadow.set_untracked(0, MemoryCategory.OTHER.value)
        allocated = torch.cuda.memory_allocated(run.meter.dev)
        shadow.set_untracked(max(allocated - shadow.live_bytes, 0), MemoryCategory.OTHER.value)
        shadow.category = MemoryCategory.OTHER.value
        shadow.reset_peak()

    def _name_optimizer_state(self) -> None:
        """Name the optimizer state after its parameters' modules, and remember its storages
        (kept from step to step: Adam's moments are updated in place)."""
        named: dict[int, str] = {}
        owner, tensor = self.owner.get, torch.Tensor
        for p, state in self.run.opt.state.items():
            entry = owner(id(p))
            if entry is not None and entry[0] is p:
                for v in state.values():
                    if isinstance(v, tensor) and not v.is_meta:
                        named[v.untyped_storage()._cdata] = entry[1]
        self.recorder.name_storages(named)
        self.by_key.update(named)
        self._state_named = len(self.run.opt.state) > 0

    def keep(self, record: dict[str, Any], *, measured: bool) -> None:
        """Note a step's peak (``record``: its step record, recorded or not; ``measured``:
        past the warm-up, where the summary's peak is taken) and keep :attr:`last` if it is
        the first step or the highest recorded so far; a step not kept is dropped without
        making its columns."""
        peak = record["peak_allocated_bytes"]
        # a step moved when it went above the steps before it of its own kind (warm-up or
        # after): the first step after the warm-up rises over it by the optimizer state, and
        # is recorded anyway
        self._moved = measured in self._highest and peak > self._highest[measured]
        for c in (False, True) if measured else (False,):
            self._highest[c] = max(peak, self._highest.get(c, peak))
        self._keep_recorded(peak, measured)
        # and while no recorded step reaches the highest peak seen (a memory that rose, fell
        # and comes back: the steps that reach it again are recorded)
        best = self._best.get(measured)
        self._moved = self._moved or (best is not None and best[0] < self._highest[measured])

    def _keep_recorded(self, peak: int, measured: bool) -> None:
        """Keep :attr:`last` (a step peaking at ``peak`` bytes) if it is the first step or
        the highest recorded so far."""
        if self.last is None:
            return
        step, recorded = self.last
        self.last = None
        classes = [
            c for c in ((False, True) if measured else (False,)) if c not in self._best or peak > self._best[c][0]
        ]
        # the snapshot kept is the peak candidate's (:meth:`peak_snapshot`): the highest step
        # after the warm-up once any is recorded, else the highest of the warm-up
        self._close_history(step if True in classes or (classes and True not in self._best) else None)
        if step != 1 and not classes:
            return
        tl = _timeline(step, recorded.columns(), self.region_names)
        if step == 1:
            self._first = tl
        for cls in classes:
            self._best[cls] = (peak, tl)

    def _close_history(self, step: int | None = None) -> None:
        """Stop the open allocator history, keeping its snapshot as step ``step``'s (None:
        dropped)."""
        if not self._history_open or self.snapshots is None:
            return
        self._history_open = False
        if step is None:
            self.snapshots.stop()
        else:
            self._peak_snapshot = (step, self.snapshots.take())

    def peak_snapshot(self) -> bytes | None:
        """The allocator snapshot (pickled, pytorch.org/memory_viz) of the step :meth:`kept`
        gives as the peak step, or of the highest kept when none is marked; None when no
        snapshot was recorded (not CUDA, no ``memory_snapshot``, no path to write it)."""
        self._close_history()  # (a step recorded but never kept)
        kept = self.kept()
        chosen = next((tl for tl, is_peak in kept if is_peak), kept[-1][0] if kept else None)
        taken = self._peak_snapshot
        return taken[1] if chosen is not None and taken is not None and taken[0] == chosen.step else None

    def kept(self) -> list[tuple[StepTimeline, bool]]:
        """``(timeline, is_peak)`` of the first step and of the highest recorded step (once
        when the same); ``is_peak`` when it reaches the run's peak as the summary takes it
        (the highest step after the warm-up when any step is)."""
        cls = True if True in self._best else False
        best = self._best.get(cls)
        peak = best[1] if best else None
        reaches = best is not None and best[0] == self._highest.get(cls)
        out = [(self._first, reaches and self._first is peak)] if self._first is not None else []
        if peak is not None and peak is not self._first:
            out.append((peak, reaches))
        return out
