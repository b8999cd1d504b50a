"""The engine on fake tensors: one prediction's modes, meters and switches
(:class:`FakeSession`), and what a failure on fake tensors means (:func:`fake_failure`).

Everything runs on the fake CPU (``torch._subclasses.fake_tensor.FakeTensorMode``: tensors
with shapes, dtypes and storages' sizes but no memory): building transformers models on
fake CUDA tensors fails in weight initialisation, and backward on fake CUDA tensors aborts
a CPU-only build (``../shared/docs/domain.md``). The modes, bottom to top:

1. ``FakeTensorMode`` (real tensors met on the way, a model in hand's, are converted);
2. :class:`OpWatch`: FLOPs of the ops that have a formula in ``torch.utils.flop_counter``
   (the proxy for block times: fake tensors run no kernels), and, for a CUDA target, the
   first cuBLAS matmul (where the cuBLAS workspace is allocated);
3. the meter's live-tensor tracker (entered by the engine), configured for the target by
   :meth:`FakeSession.new_meter`: each allocation rounded up to the target's block size, no
   CPU RNG states on a CUDA target (host memory there), every allocation and free logged
   for :mod:`ckptlab.worker.predict.allocator`;

and, in place of ``F.scaled_dot_product_attention``, :class:`ckptlab.worker.predict.sdpa.SdpaRouter`. On a CUDA
target ``torch.autograd.graph.save_on_cpu`` is replaced for the duration by a version whose
host copies are not device memory (see :func:`_save_on_host`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry, sdpa_flop

from ckptlab.prediction.targets import Target
from ckptlab.worker.engine.training import FakeRun
from ckptlab.worker.measure.memory import LiveTensorTracker
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.predict.sdpa import SdpaRouter

__all__ = [
    "FakeSession",
    "FakeGradScaler",
    "OpWatch",
    "fake_failure",
    "NOMINAL_FLOPS_PER_S",
    "WORKSPACE_KEY",
    "BACKWARD_WORKSPACE_KEY",
]

#: The rate block FLOPs are turned into times at, for strategy ``auto``'s plan (a proxy).
NOMINAL_FLOPS_PER_S = 1e14
#: The most elements a tensor keeps its values for (:class:`OpWatch`: values that do not depend on data).
CONSTANT_NUMEL = 1 << 16
#: The event-log key of the cuBLAS workspace of the forward (calling) thread (never freed).
WORKSPACE_KEY = -1
#: The event-log key of the cuBLAS workspace of autograd's device thread (never freed).
BACKWARD_WORKSPACE_KEY = -2
_aten = torch.ops.aten
#: Ops that run on cuBLAS on CUDA (matmul and linear decompose into these).
_CUBLAS = {
    _aten.mm,
    _aten.addmm,
    _aten.bmm,
    _aten.baddbmm,
    _aten.addbmm,
    _aten._addmm_activation,
    _aten.mv,
    _aten.addmv,
}
_FLOPS = {**flop_registry, _aten._scaled_dot_product_flash_attention_for_cpu: sdpa_flop}
_CPU = torch.device("cpu")
#: A custom op (``torch.library.custom_op``) without ``register_fake`` says so in these words.
_NO_FAKE_IMPL = re.compile(r"no fake impl registered for <CustomOpDef\((.+?)\)>")
#: Normalisations whose outputs 1 and 2 are statistics saved for backward (mean, inverse std).
_NORMS = {_aten.native_batch_norm, _aten._native_batch_norm_legit, _aten.native_layer_norm, _aten.native_group_norm}
_LOW = (torch.float16, torch.bfloat16)
_FOLDABLE: dict[Any, bool] = {}  # op -> deterministic and not in place


def _norm_statistics(args: tuple, out: Any, cuda: bool) -> Any:
    """The statistics a normalisation of fp16 / bf16 input saves are fp32 on CUDA (the
    kernels' accumulate type) and on CPU when a parameter or running statistic is fp32
    (what autocast gives: the CPU kernels' mixed type); the fake kernels make them in the
    input's dtype. Returned in fp32 where the real kernels make them so."""
    x = args[0]
    if x.dtype not in _LOW or out[1].dtype == torch.float32:
        return out
    mixed = any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tree_leaves(args[1:]))
    if not (cuda or mixed):
        return out
    return (out[0], out[1].float(), out[2].float(), *out[3:])


def _keep_values(func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Give ``out``'s fake tensors the values ``func`` computes from its inputs' values
    (see :class:`OpWatch`); nothing for a random or in-place op, an input without a value
    or an output over :data:`CONSTANT_NUMEL` elements."""
    foldable = _FOLDABLE.get(func)
    if foldable is None:
        foldable = _FOLDABLE[func] = not (torch.Tag.nondeterministic_seeded in func.tags or func._schema.is_mutable)
    if not foldable:
        return
    leaves = tree_leaves((args, kwargs))
    if any(isinstance(t, FakeTensor) and t.constant is None for t in leaves):
        return
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not outputs or any(not isinstance(t, FakeTensor) or t.numel() > CONSTANT_NUMEL for t in outputs):
        return
    real_args, real_kwargs = tree_map(lambda t: t.constant if isinstance(t, FakeTensor) else t, (args, kwargs))
    with no_dispatch():
        values = [t for t in tree_leaves(func(*real_args, **real_kwargs)) if isinstance(t, torch.Tensor)]
    for fake, value in zip(outputs, values, strict=False):
        if fake.constant is None:
            fake.constant = value


class OpWatch(TorchDispatchMode):
    """Counts the FLOPs of the ops it sees (``torch.utils.flop_counter``'s formulas; the
    CPU flash attention counted as SDPA), calls ``on_matmul`` at each cuBLAS op, and
    corrects the fake kernels where they differ from the real ones (:func:`_norm_statistics`;
    ``cuda``: as CUDA's kernels, else as the CPU's).

    Values that do not depend on data are kept: each small deterministic op whose inputs
    all have values (or that has no tensor input: ``linspace``, ``arange``) also runs on
    those values, which its fake output keeps as its ``constant`` (up to
    :data:`CONSTANT_NUMEL` elements), so code that reads them (``.tolist()``, ``.item()``,
    ``if tensor.all()``) runs as in a real run: ConvNeXt's drop-path rates, Hugging Face's
    check that positions are not packed sequences. A value no tensor has (the data's, a
    random initialisation's) fails, naming the op (:func:`fake_failure`), except while
    :attr:`building` (the model's construction), where it reads as 0 / False and is
    counted in :attr:`guessed_reads` (``nn.init.trunc_normal_``'s rejection loop).

    Attributes:
        flops: FLOPs so far.
        building: the model is being constructed.
        guessed_reads: values read as 0 during construction.
    """

    def __init__(self, on_matmul: Callable[[], None] | None = None, cuda: bool = False):
        super().__init__()
        self.cuda = cuda
        self.flops = 0
        self.on_matmul = on_matmul
        self.building = False
        self.guessed_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.building and func is _aten._local_scalar_dense.default and args[0].constant is None:
            self.guessed_reads += 1
            return False if args[0].dtype == torch.bool else 0
        out = func(*args, **kwargs)
        _keep_values(func, args, kwargs, out)
        packet = func._overloadpacket
        if packet in _NORMS:
            out = _norm_statistics(args, out, self.cuda)
        formula = _FLOPS.get(packet)
        if formula is not None:
            self.flops += int(formula(*args, **kwargs, out_val=out))
        if self.on_matmul is not None and packet in _CUBLAS:
            self.on_matmul()
        return out

    def clock(self) -> float:
        """Seconds, by proxy: the FLOPs so far at :data:`NOMINAL_FLOPS_PER_S`."""
        return self.flops / NOMINAL_FLOPS_PER_S


class FakeGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` that steps without reading whether the gradients are finite
    (``.item()`` has no value on fake tensors): a prediction assumes no step is skipped.
    Its tensors (scale, growth tracker, inf flags) are made as in a real run."""

    def _maybe_opt_step(self, optimizer, optimizer_state, *args: Any, **kwargs: Any):
        return optimizer.step(*args, **kwargs)


class FakeSession:
    """One prediction's fake execution for ``target``.

    Attributes:
        target: the predicted device.
        router: the SDPA router (its ``backends`` say which ran).
        watch: the FLOP counter and cuBLAS watch.
        tracker: the latest meter's tracker (the run's, once it is built).
        events: its allocation log (CUDA targets), else None.
        matmul_ran: a cuBLAS op ran outside backward since the latest meter was made.
        backward_matmul_ran: one ran inside backward (recomputation included): on CUDA
            autograd's device thread, whose cuBLAS handle has a workspace of its own.
    """

    def __init__(self, target: Target):
        self.target = target
        self.cuda = target.device == "cuda"
        self.router = SdpaRouter(target)
        self.watch = OpWatch(self._matmul if self.cuda else None, cuda=self.cuda)
        self.tracker: LiveTensorTracker | None = None
        self.events: list[tuple[int, int]] | None = None
        self.matmul_ran = False
        self.backward_matmul_ran = False
        self._restore = contextlib.ExitStack()

    def _matmul(self) -> None:
        if torch._C._current_graph_task_id() != -1:  # inside backward: autograd's thread on CUDA
            if self.backward_matmul_ran:
                return
            self.backward_matmul_ran, key = True, BACKWARD_WORKSPACE_KEY
        elif self.matmul_ran:
            return
        else:
            self.matmul_ran, key = True, WORKSPACE_KEY
        if self.events is not None:  # the workspace's first use: a block of the allocator
            self.events.append((key, self.target.cublas_workspace_bytes))

    @property
    def workspace_bytes(self) -> int:
        """The cuBLAS workspaces (bytes) the traced step allocated on a CUDA target: one per
        thread that ran a matmul (forward, backward); 0 on ``cpu``."""
        if not self.cuda:
            return 0
        return self.target.cublas_workspace_bytes * (int(self.matmul_ran) + int(self.backward_matmul_ran))

    def new_meter(self) -> Meter:
        """A meter over a fresh tracker set up for the target (see the module docstring)."""
        self.events = [] if self.cuda else None
        self.matmul_ran = self.backward_matmul_ran = False
        self.tracker = LiveTensorTracker(
            block_bytes=self.target.block_bytes, count_rng_states=not self.cuda, events=self.events
        )
        return Meter(_CPU, None, tracker=self.tracker)

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """The model's construction: values it reads are kept or guessed (see :class:`OpWatch`)."""
        self.watch.building = True
        try:
            yield
        finally:
            self.watch.building = False
        self.after_building()

    def fake_run(self) -> FakeRun:
        """The engine's switches: this session's meters, the FLOP clock, and on CUDA the
        optimizers' ``foreach`` form (PyTorch's default for CUDA tensors)."""
        return FakeRun(new_meter=self.new_meter, clock=self.watch.clock, foreach=True if self.cuda else None)

    @contextlib.contextmanager
    def active(self) -> Iterator[FakeTensorMode]:
        """The fake mode, the watch and the router (and on CUDA the host offload), for the
        duration."""
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with contextlib.ExitStack() as stack:
            self._restore = stack
            stack.enter_context(mode)
            stack.enter_context(self.watch)
            stack.enter_context(self.router)
            stack.enter_context(self._host_offload())
            yield mode

    def after_building(self) -> None:
        """Once a model is built (its libraries imported): Hugging Face's mask code reads
        values (is the sequence packed? is there padding?) except on a fake tensor, where it
        makes an explicit mask instead (``masking_utils.is_tracing``), which a real run
        never has and which turns flash attention off. For the session, that test ignores
        fake tensors (still answering for dynamo, jit and stream capture): the values it
        reads are kept ones (:class:`OpWatch`), so the mask is what a real run makes."""
        masking = sys.modules.get("transformers.masking_utils")
        original = getattr(masking, "is_tracing", None)
        if original is None or getattr(original, "ignores_fake_tensors", False):
            return

        def is_tracing(tensor: Any = None) -> bool:
            return original(None)

        is_tracing.ignores_fake_tensors = True  # type: ignore[attr-defined]
        masking.is_tracing = is_tracing
        self._restore.callback(setattr, masking, "is_tracing", original)

    @contextlib.contextmanager
    def _host_offload(self) -> Iterator[None]:
        if not self.cuda:
            yield
            return
        original = torch.autograd.graph.save_on_cpu
        torch.autograd.graph.save_on_cpu = _save_on_host(self)
        try:
            yield
        finally:
            torch.autograd.graph.save_on_cpu = original


def _save_on_host(session: FakeSession) -> type:
    """``torch.autograd.graph.save_on_cpu`` for a CUDA target: each tensor saved for
    backward is copied to the host, a copy the tracker does not count (pinned host memory
    is not the device's), and copied back, counted, when backward unpacks it (PyTorch's
    ``pack_to_cpu`` / ``unpack_from_cpu``)."""

    class save_on_host(torch.autograd.graph.saved_tensors_hooks):  # noqa: N801 - stands in for save_on_cpu
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda"):
            def pack(tensor: torch.Tensor) -> torch.Tensor:
                tracker = session.tracker
                with tracker.untracked() if tracker is not None else contextlib.nullcontext():
                    return tensor.detach().clone()

            super().__init__(pack, lambda host: host.clone())

    return save_on_host


def fake_failure(exc: BaseException) -> str | None:
    """What a failure on fake tensors means, naming the op (one sentence), or None when
    ``exc`` (or what caused it) is not one: an op without a fake (meta) kernel, an op
    whose output is a tensor's value (``.item()``, ``.tolist()``, ``bool(tensor)``), or one
    whose output shape depends on values (``torch.nonzero``, boolean-mask indexing)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        op = getattr(cur, "func", None)
        if isinstance(cur, DataDependentOutputException):
            return (
                f"the model cannot be predicted: it reads a tensor's value ({op}: what .item(), .tolist() and "
                "bool(tensor) call), which fake tensors do not have"
            )
        if isinstance(cur, DynamicOutputShapeException):
            return (
                f"the model cannot be predicted: {op} returns a shape that depends on the tensor's values "
                "(as torch.nonzero and boolean-mask indexing do), which fake tensors do not have"
            )
        custom = _NO_FAKE_IMPL.search(str(cur))
        if isinstance(cur, UnsupportedOperatorException) or custom:
            op = custom.group(1) if custom else op
            return f"the model cannot be predicted: {op} has no fake (meta) kernel, so it cannot run on fake tensors"
        if "is not supported for tensor subclasses" in str(cur):
            return f"the model cannot be predicted: {cur} (fake tensors hold no values)"
        cur = cur.__cause__ or cur.__context__
    return None
