"""Building blocks of a training step shared by the engine, the gradient check and the
benchmarks: the device and its environment, the checkpointed model (with
:class:`CompiledStep` when the whole step is compiled), its optimizer and its autocast
context; and what a run on fake tensors does otherwise (:class:`FakeRun`)."""

from __future__ import annotations

import contextlib
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import CompileScope, get_strategy
from ckptlab.worker.engine.strategies import apply_strategy
from ckptlab.worker.errors import RunError
from ckptlab.worker.measure.heap import keep_freed_heap
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built
from ckptlab.worker.models.build import build_model

__all__ = [
    "FakeRun",
    "autocast_for",
    "make_optimizer",
    "build_checkpointed",
    "CompiledStep",
    "compile_whole_step",
    "resolve_device",
    "check_supported",
    "environment",
]


@dataclass(frozen=True)
class FakeRun:
    """The switches of a run on fake tensors (``torch._subclasses.fake_tensor.FakeTensorMode``,
    entered by the caller below the meter's tracker): the prediction mode
    (:mod:`ckptlab.worker.predict`). A real run passes None and none of this happens.

    With it the engine runs its own steps, except that the model is not moved to the
    device (it is built on the fake CPU, and ``module.to`` cannot swap fake parameters:
    "_apply(): Couldn't swap Linear.weight"), losses are not read (a fake scalar has no
    value: the records' ``loss`` is None), and strategy ``auto`` profiles with the meter
    and clock given here.

    Attributes:
        new_meter: makes the meter a profile or a pass reads (its tracker set up for the
            predicted device: rounding, RNG states, event log).
        clock: what a block's forward time is read with (seconds, as
            ``time.perf_counter``): fake tensors run no kernels, so a stated proxy.
        foreach: the optimizer's ``foreach`` (True: what PyTorch picks for CUDA tensors,
            whose temporaries span every parameter); None: PyTorch's default.
    """

    new_meter: Callable[[], Meter]
    clock: Callable[[], float] = time.perf_counter
    foreach: bool | None = None


def autocast_for(spec: ExperimentSpec, dev: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the spec's autocast context (``amp`` fp16 / bf16; a null context when
    ``off``), after ``torch.autocast``'s documentation."""
    if spec.amp == "off":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if spec.amp == "bf16" else torch.float16
    return lambda: torch.autocast(dev.type, dtype=dtype)


def make_optimizer(
    spec: ExperimentSpec, params: list[torch.nn.Parameter], foreach: bool | None = None
) -> torch.optim.Optimizer:
    """The spec's optimizer over ``params``: Adam / AdamW (lr 1e-4) or SGD (lr 1e-3);
    ``foreach`` is passed on when given (None: PyTorch's default for the device)."""
    extra = {"foreach": foreach} if foreach is not None else {}
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4, **extra)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **extra)
    return torch.optim.SGD(params, lr=1e-3, **extra)


class CompiledStep:
    """The model's forward and its loss compiled as one function by ``torch.compile``, under
    ``activation_memory_budget`` as ``strategies.CompiledGroup`` (``compile_budget`` with
    ``compile_scope`` ``step``): ``(inputs, targets) -> (output, loss)``, the forward
    under the run's autocast and the loss outside it, as the eager step computes them
    (:meth:`ckptlab.worker.models.base.Built.output_and_loss`). With the loss in the graph
    the partitioner may recompute what an eager cross-entropy keeps (its log-probabilities,
    one logits-sized tensor) and the head's activations: on the built-in transformer 4x128,
    seq 256, batch 4 (CPU) it peaked 2.4-4.3 MiB under ``blocks`` at budgets 1.0, 0.8 and
    0.5 at no measured time, and 0.8 MiB above it at 0.1 (docs/benchmarks.md, "The whole
    step compiled"). The output is returned as eager code holds it (the step keeps it to
    the end of backward, as for every strategy).

    Known limitations: as ``CompiledGroup`` (one compiled function per process); a
    model whose forward breaks dynamo's graph is compiled in pieces, each partitioned apart.
    """

    def __init__(
        self,
        module: nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        autocast: Callable[[], Any],
        *,
        activation_memory_budget: float,
        backend: str = "inductor",
    ):
        torch._dynamo.reset()
        self.module, self.loss_fn, self.autocast = module, loss_fn, autocast
        self.activation_memory_budget = activation_memory_budget
        self.compiled = torch.compile(self._step, backend=backend)

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            out = self.module(x)
        return out, self.loss_fn(out, y)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the compiled step (compiling at the first call)."""
        import torch._functorch.config as functorch_config

        with functorch_config.patch(activation_memory_budget=self.activation_memory_budget):
            return self.compiled(x, y)


def build_checkpointed(
    spec: ExperimentSpec,
    dev: torch.device,
    on_recompute=None,
    build: Callable[[], Built] | None = None,
    ranges: list[tuple[int, int]] | None = None,
    fake: bool = False,
    blocks_as_built: list[torch.nn.Module] | None = None,
) -> Built:
    """The spec's model seeded with ``spec.seed`` (or ``build()``'s, a model in hand), on
    ``dev`` in train mode, with the spec's checkpointing applied to its blocks
    (``on_recompute`` is called around each recomputation, see
    :func:`ckptlab.worker.engine.strategies.apply_strategy`). ``fake``: the model was built
    on the fake CPU and stays there (see :class:`FakeRun`). ``blocks_as_built``: a list to
    fill with the blocks before checkpointing regroups them (a sharded run's units).
    ``compile_budget`` with ``compile_scope`` ``step`` leaves the blocks and compiles the
    forward and loss together (:attr:`Built.step_fn`, :class:`CompiledStep`)."""
    torch.manual_seed(spec.seed)
    built = build() if build is not None else build_model(spec.model)
    (built.module if fake else built.module.to(dev)).train()
    if blocks_as_built is not None:
        blocks_as_built.extend(built.blocks)
    apply_strategy(built.blocks, spec.checkpoint, device=dev, on_recompute=on_recompute, ranges=ranges)
    compile_whole_step(built, spec, dev)
    return built


def compile_whole_step(built: Built, spec: ExperimentSpec, dev: torch.device) -> None:
    """Set ``built.step_fn`` to the forward and loss compiled as one function
    (:class:`CompiledStep`) when the spec's strategy compiles with ``compile_scope``
    ``step``; else leave it."""
    ck = spec.checkpoint
    if get_strategy(ck.strategy).compiles and ck.compile_scope == CompileScope.STEP:
        built.step_fn = CompiledStep(
            built.module, built.loss_fn, autocast_for(spec, dev), activation_memory_budget=ck.activation_memory_budget
        )


def resolve_device(requested: str) -> torch.device:
    """Map a device name (``auto``, ``cpu``, ``cuda``, ``cuda:N``) to a ``torch.device``.

    ``auto`` picks ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

    Raises:
        RunError: CUDA requested but not available.
    """
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RunError(
            f"device {requested!r} was requested but CUDA is not available on this worker; use 'auto' or 'cpu'"
        )
    return dev


def check_supported(spec: ExperimentSpec, dev: torch.device) -> None:
    """Refuse combinations the device cannot run, saying why."""
    if spec.amp == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RunError(f"amp 'bf16' is not supported on {torch.cuda.get_device_name(dev)}; use 'fp16' or 'off'")
    if spec.amp != "off" and not torch.amp.is_autocast_available(dev.type):
        raise RunError(f"autocast is not available for device type {dev.type!r}; use amp 'off'")


def environment(dev: torch.device) -> dict[str, Any]:
    """Torch version, device name, CUDA version and capability, host and Python version,
    torch's CPU threads and ``cpu_heap_kept``: whether this process's heap keeps freed memory
    (:func:`ckptlab.worker.measure.heap.keep_freed_heap`: CPU step times without the page
    faults a fresh heap takes each step)."""
    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "device": str(dev),
        "device_name": platform.processor() or platform.machine(),
        "cuda_version": torch.version.cuda,
        "capability": None,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_heap_kept": keep_freed_heap(),
    }
    if dev.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(dev)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        env["total_memory_bytes"] = torch.cuda.get_device_properties(dev).total_memory
    return env
