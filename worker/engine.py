"""The experiment engine: train a model for a few steps under a checkpointing setting,
measure time and memory per step and phase, and check that the gradients are still right.

Measurement, per optimizer step (each may span ``grad_accum_steps`` micro-batches):

- ``forward_ms``, ``backward_ms``, ``optimizer_ms``, ``step_ms``: wall time in ms from
  ``time.perf_counter``; on CUDA every phase ends with ``torch.cuda.synchronize``.
- ``allocated_bytes``: live tensor bytes at the end of the first micro-batch's forward.
- ``peak_allocated_bytes``: the highest live tensor bytes during the step; per phase in
  ``extra`` (``forward_peak_bytes`` ...).
- Memory by category (``parameters`` incl. buffers, ``gradients``, ``optimizer_state``,
  ``activations``, ``other``) at the end of forward and at the step's peak. On CPU exact,
  from :class:`worker.memory.LiveTensorTracker`; on CUDA estimated from the tensors the
  engine knows (parameters, ``.grad``, optimizer state) with the rest split into
  activations (forward end: the activation bytes) and other.
- ``recompute_peak_bytes``: the most bytes a checkpointed group's recomputation added
  during backward (CPU: peak inside the recomputation minus live bytes at its start;
  CUDA: live bytes at its end minus at its start).
- On CUDA: ``reserved_bytes`` (``torch.cuda.memory_reserved``) and ``nvml_used_bytes``
  (device-wide used memory from NVML, like nvidia-smi: includes the CUDA context and other
  processes).

``activation_bytes`` (summary) is the median over measured steps of live bytes at the end of
forward minus live bytes just before it: the bytes autograd keeps for backward.
"""

from __future__ import annotations

import contextlib
import math
import platform
import socket
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ckptlab.spec import ExperimentSpec
from worker.errors import RunError, RunOutOfMemory
from worker.memory import CATEGORIES, CudaProbe, LiveTensorTracker, SimulatedOutOfMemoryError
from worker.models import Built, build_model
from worker.strategies import apply_strategy

__all__ = ["resolve_device", "run_experiment", "verify_gradients", "environment", "StepCallback"]

StepCallback = Callable[[dict[str, Any]], None]


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


def _check_supported(spec: ExperimentSpec, dev: torch.device) -> None:
    """Refuse combinations the device cannot run, saying why."""
    if spec.amp == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RunError(f"amp 'bf16' is not supported on {torch.cuda.get_device_name(dev)}; use 'fp16' or 'off'")
    if spec.amp != "off" and not torch.amp.is_autocast_available(dev.type):
        raise RunError(f"autocast is not available for device type {dev.type!r}; use amp 'off'")


def environment(dev: torch.device) -> dict[str, Any]:
    """Torch version, device name, CUDA version and capability, host and Python version."""
    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "device": str(dev),
        "device_name": platform.processor() or platform.machine(),
        "cuda_version": torch.version.cuda,
        "capability": None,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(dev)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        env["total_memory_bytes"] = torch.cuda.get_device_properties(dev).total_memory
    return env


def _autocast(spec: ExperimentSpec, dev: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    if spec.amp == "off":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if spec.amp == "bf16" else torch.float16
    return lambda: torch.autocast(dev.type, dtype=dtype)


def _make_optimizer(spec: ExperimentSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    return torch.optim.SGD(params, lr=1e-3)


def _build(spec: ExperimentSpec, dev: torch.device, on_recompute=None) -> Built:
    torch.manual_seed(spec.seed)
    built = build_model(spec.model)
    built.module.to(dev).train()
    apply_strategy(built.blocks, spec.checkpoint, device=dev, on_recompute=on_recompute)
    return built


def _storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr() or id(st)] = st.nbytes()
    return sum(seen.values())


def _optimizer_tensors(opt: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                yield v


def verify_gradients(spec: ExperimentSpec, dev: torch.device) -> dict[str, Any]:
    """Compare one step's gradients with and without the spec's checkpointing.

    Both models start from the same weights (the reference's ``state_dict``), see the same
    first batch and the same RNG seed before forward (so dropout draws the same masks in
    the first forward). A missing ``.grad`` counts as zeros.

    Returns:
        ``grad_max_abs_diff`` (max over parameters of ``|g_ckpt - g_ref|``),
        ``grad_max_abs`` (max ``|g_ref|``), ``loss_diff`` (``|loss_ckpt - loss_ref|``) and
        ``gradients_match`` (``grad_max_abs_diff <= rtol * grad_max_abs + 1e-7`` with rtol
        1e-4 in float32 and 1e-2 under autocast). All None for strategy ``none``.
    """
    if spec.checkpoint.strategy == "none":
        return {"grad_max_abs_diff": None, "grad_max_abs": None, "loss_diff": None, "gradients_match": None}
    autocast = _autocast(spec, dev)
    torch.manual_seed(spec.seed)
    ref = build_model(spec.model)
    ref.module.to(dev).train()
    ck = build_model(spec.model)
    ck.module.load_state_dict(ref.module.state_dict())
    ck.module.to(dev).train()
    ck_params = list(ck.module.parameters())  # identities survive regrouping
    apply_strategy(ck.blocks, spec.checkpoint, device=dev)
    x, y = ref.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
    x, y = x.to(dev), y.to(dev)

    def one_step(built: Built) -> float:
        torch.manual_seed(spec.seed + 1)
        with autocast():
            out = built.module(x)
        loss = built.loss_fn(out, y)
        loss.backward()
        return float(loss.detach().float())

    loss_ref, loss_ck = one_step(ref), one_step(ck)
    diff, scale = 0.0, 0.0
    for pr, pc in zip(ref.module.parameters(), ck_params, strict=True):
        gr = pr.grad if pr.grad is not None else torch.zeros_like(pr)
        gc = pc.grad if pc.grad is not None else torch.zeros_like(pc)
        diff = max(diff, float((gc.float() - gr.float()).abs().max()))
        scale = max(scale, float(gr.float().abs().max()))
    rtol = 1e-4 if spec.amp == "off" else 1e-2
    return {
        "grad_max_abs_diff": diff,
        "grad_max_abs": scale,
        "loss_diff": abs(loss_ck - loss_ref),
        "gradients_match": diff <= rtol * scale + 1e-7,
    }


class _Meter:
    """Reads memory for the engine from the CPU tracker or the CUDA allocator."""

    def __init__(self, dev: torch.device, limit_bytes: int | None):
        self.dev = dev
        self.cuda = dev.type == "cuda"
        self.probe: CudaProbe | LiveTensorTracker = (
            CudaProbe(dev) if self.cuda else LiveTensorTracker(limit_bytes=limit_bytes)
        )
        self.recompute_peak = 0
        self.optimizer_states_tagged = 0
        self._recompute_start = 0
        self._saved_category = "other"
        self._nvml = None
        if self.cuda:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)
            except Exception:  # noqa: BLE001 - NVML is optional (no driver library, containers)
                self._nvml = None

    def mode(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.cuda else self.probe

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def set_category(self, category: str) -> None:
        if not self.cuda:
            self.probe.category = category

    def retag(self, tensors, category: str) -> None:
        if not self.cuda:
            for t in tensors:
                self.probe.retag(t, category)

    def on_recompute(self, starting: bool) -> None:
        """Hook for :class:`worker.strategies.CheckpointedGroup` around a recomputation."""
        if starting:
            self._recompute_start = self.probe.live_bytes
            if not self.cuda:
                self.probe.reset_window()
                self._saved_category = self.probe.category
                self.probe.category = "activations"
            return
        top = self.probe.live_bytes if self.cuda else self.probe.window_peak_bytes
        self.recompute_peak = max(self.recompute_peak, top - self._recompute_start)
        if not self.cuda:
            self.probe.category = self._saved_category

    def nvml_used(self) -> int | None:
        if self._nvml is None:
            return None
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)

    def breakdown(self, params, opt, live: int, activations: int, peak: bool) -> dict[str, int]:
        """Bytes per category now (CPU) or estimated from known tensors (CUDA)."""
        if not self.cuda:
            return dict(self.probe.peak_by_category if peak else self.probe.by_category)
        p = _storage_bytes(iter(params))
        g = _storage_bytes(q.grad for q in params if q.grad is not None)
        o = _storage_bytes(_optimizer_tensors(opt))
        act = max(min(activations, live - p - g - o), 0)
        return {
            "parameters": p,
            "gradients": g,
            "optimizer_state": o,
            "activations": act,
            "other": max(live - p - g - o - act, 0),
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_experiment(
    spec: ExperimentSpec,
    *,
    on_step: StepCallback | None = None,
    device: str | None = None,
    snapshot_path: str | None = None,
) -> dict[str, Any]:
    """Run ``spec`` and return its summary; ``on_step(record)`` gets each step as it ends.

    Args:
        spec: a validated experiment spec.
        on_step: called with a dict per optimizer step: ``step`` (1-based), the ``*_ms``
            timings, ``allocated_bytes``, ``peak_allocated_bytes``, ``reserved_bytes``
            (CUDA, else None), ``loss`` (sum of the scaled micro-batch losses; may be
            non-finite) and ``extra`` (phase peaks, categories, recompute and NVML bytes).
            Default: None.
        device: overrides ``spec.device`` (e.g. the worker slot's ``cuda:1``). Default: None.
        snapshot_path: where to write the CUDA memory snapshot when ``spec.memory_snapshot``
            is set (a pickle that pytorch.org/memory_viz opens). Default: None.

    Returns:
        The summary: ``device``, ``device_name``, ``activation_bytes``,
        ``peak_allocated_bytes`` (max over measured steps), ``recompute_peak_bytes``,
        ``step_time_ms`` and phase medians (warm-up excluded), ``memory_at_peak`` and
        ``memory_at_forward_end`` (bytes by category), ``params_without_grad`` (parameters
        whose ``.grad`` is None after backward, max over steps), ``param_count``,
        ``final_loss``, the gradient check (see :func:`verify_gradients`), ``warnings``,
        ``environment``, ``torch_version`` and, on CUDA, ``reserved_bytes`` and
        ``nvml_used_bytes`` (max over steps) and ``snapshot_path``.

    Raises:
        RunOutOfMemory: CUDA out of memory or the CPU tracker's ``memory_limit_bytes``
            passed; ``details`` has ``phase``, ``step``, ``live_bytes``, ``limit_bytes``.
        RunError: anything else (bad device, unsupported AMP, ``CheckpointError``, a model
            error); ``warnings`` holds what was raised before.
    """
    caught: list[str] = []
    where = {"phase": "setup", "step": 0}
    meter: _Meter | None = None
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")

        def warnings_so_far() -> list[str]:
            return list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in wlist))

        try:
            dev = resolve_device(device or spec.device)
            _check_supported(spec, dev)
            check = verify_gradients(spec, dev) if spec.verify_gradients else {}
            meter = _Meter(dev, spec.memory_limit_bytes)
            summary = _measure(spec, dev, meter, where, on_step, snapshot_path)
        except RunError as exc:
            exc.warnings = warnings_so_far()
            raise
        except (SimulatedOutOfMemoryError, torch.OutOfMemoryError) as exc:
            # the simulated error carries the live bytes at the failing allocation; after
            # unwinding, the tracker already shows the frames' tensors freed
            live = getattr(exc, "live_bytes", None)
            if live is None and meter is not None:
                live = meter.probe.live_bytes
            limit = spec.memory_limit_bytes
            raise RunOutOfMemory(
                f"out of memory in {where['phase']} of step {where['step']}: {exc}",
                warnings=warnings_so_far(),
                details={**where, "live_bytes": live, "limit_bytes": limit},
            ) from exc
        except Exception as exc:  # noqa: BLE001 - every failure of the model is the run's outcome
            raise RunError(f"{type(exc).__name__}: {exc}", warnings=warnings_so_far()) from exc
        caught = warnings_so_far()
    summary.update(check)
    summary["warnings"] = caught
    return _finite_or_none(summary)


def _finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so the summary is valid JSON
    (a diverged run has a NaN loss and gradient difference)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def _measure(
    spec: ExperimentSpec,
    dev: torch.device,
    meter: _Meter,
    where: dict[str, Any],
    on_step: StepCallback | None,
    snapshot_path: str | None,
) -> dict[str, Any]:
    cuda = meter.cuda
    if cuda:
        if spec.memory_limit_bytes is not None:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec.memory_limit_bytes / total), dev)
        torch.cuda.reset_peak_memory_stats(dev)
        if spec.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
    elif spec.memory_snapshot:
        warnings.warn("memory_snapshot needs CUDA; no snapshot recorded on CPU", stacklevel=2)

    autocast = _autocast(spec, dev)
    scaler = torch.amp.GradScaler(dev.type) if spec.amp == "fp16" else None
    gen = torch.Generator().manual_seed(spec.seed)
    records: list[dict[str, Any]] = []
    try:
        with meter.mode():
            meter.set_category("parameters")
            built = _build(spec, dev, on_recompute=meter.on_recompute)
            params = list(built.module.parameters())
            meter.retag(list(params) + list(built.module.buffers()), "parameters")
            meter.set_category("other")
            opt = _make_optimizer(spec, params)
            for p in params:
                p.register_post_accumulate_grad_hook(lambda q: meter.retag([q.grad], "gradients"))
            for step in range(1, spec.steps + 1):
                where["step"] = step
                records.append(_one_step(spec, dev, meter, built, params, opt, scaler, autocast, gen, where))
                if on_step is not None:
                    on_step(records[-1])
    finally:
        if cuda:
            if spec.memory_snapshot and snapshot_path:
                torch.cuda.memory._dump_snapshot(snapshot_path)
            if spec.memory_snapshot:
                torch.cuda.memory._record_memory_history(enabled=None)
            if spec.memory_limit_bytes is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, dev)

    measured = records[spec.warmup_steps :] or records
    peak_rec = max(measured, key=lambda r: r["peak_allocated_bytes"])
    final_loss = records[-1]["loss"]
    env = environment(dev)
    summary: dict[str, Any] = {
        "device": str(dev),
        "device_name": env["device_name"] if cuda else "cpu",
        "activation_bytes": int(_median([r["extra"]["activation_bytes"] for r in measured])),
        "peak_allocated_bytes": peak_rec["peak_allocated_bytes"],
        "recompute_peak_bytes": max(r["extra"]["recompute_peak_bytes"] for r in measured),
        "step_time_ms": _median([r["step_ms"] for r in measured]),
        "forward_ms": _median([r["forward_ms"] for r in measured]),
        "backward_ms": _median([r["backward_ms"] for r in measured]),
        "optimizer_ms": _median([r["optimizer_ms"] for r in measured]),
        "memory_at_peak": peak_rec["extra"]["memory_at_peak"],
        "memory_at_forward_end": measured[-1]["extra"]["memory_at_forward_end"],
        "params_without_grad": max(r["extra"]["params_without_grad"] for r in records),
        "param_count": sum(p.numel() for p in params),
        "final_loss": final_loss if math.isfinite(final_loss) else None,
        "environment": env,
        "torch_version": torch.__version__,
    }
    if cuda:
        summary["reserved_bytes"] = max(r["reserved_bytes"] for r in records)
        used = [r["extra"]["nvml_used_bytes"] for r in records if r["extra"]["nvml_used_bytes"] is not None]
        summary["nvml_used_bytes"] = max(used) if used else None
        if spec.memory_snapshot and snapshot_path:
            summary["snapshot_path"] = snapshot_path
    return summary


def _one_step(spec, dev, meter: _Meter, built: Built, params, opt, scaler, autocast, gen, where) -> dict[str, Any]:
    """One optimizer step over ``grad_accum_steps`` micro-batches; returns its record."""
    probe = meter.probe
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    peaks = {"forward": 0, "backward": 0, "optimizer": 0}
    peak_cats: dict[str, dict[str, int]] = {}
    meter.recompute_peak = 0
    loss_total = 0.0
    first: dict[str, Any] = {}

    def phase_end(name: str, t_start: float) -> None:
        meter.sync()
        times[name] += (time.perf_counter() - t_start) * 1e3
        if probe.peak_bytes >= peaks[name]:
            peaks[name] = probe.peak_bytes
            if not meter.cuda:
                peak_cats[name] = dict(probe.peak_by_category)

    for micro in range(spec.grad_accum_steps):
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(dev), y.to(dev)
        meter.sync()
        probe.reset_peak()
        before = probe.live_bytes
        where["phase"] = "forward"
        meter.set_category("activations")
        t0 = time.perf_counter()
        with autocast():
            out = built.module(x)
        loss = built.loss_fn(out, y) / spec.grad_accum_steps
        phase_end("forward", t0)
        meter.set_category("other")
        if micro == 0:
            live = probe.live_bytes
            first = {
                "allocated": live,
                "activation_bytes": live - before,
                "at_forward_end": meter.breakdown(params, opt, live, live - before, peak=False),
            }
        where["phase"] = "backward"
        probe.reset_peak()
        t1 = time.perf_counter()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        phase_end("backward", t1)
        loss_total += float(loss.detach().float())
        del out, loss, x, y

    missing = sum(p.grad is None for p in params)
    where["phase"] = "optimizer"
    probe.reset_peak()
    t2 = time.perf_counter()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    if len(opt.state) != meter.optimizer_states_tagged:  # state appears at the first step(s)
        meter.retag(list(_optimizer_tensors(opt)), "optimizer_state")
        meter.optimizer_states_tagged = len(opt.state)
    opt.zero_grad(set_to_none=True)
    phase_end("optimizer", t2)

    peak_phase = max(peaks, key=lambda k: peaks[k])
    step_peak = peaks[peak_phase]
    if meter.cuda:
        at_peak = meter.breakdown(params, opt, step_peak, step_peak if peak_phase != "optimizer" else 0, peak=True)
    else:
        at_peak = peak_cats.get(peak_phase, dict.fromkeys(CATEGORIES, 0))
    return {
        "step": where["step"],
        "forward_ms": times["forward"],
        "backward_ms": times["backward"],
        "optimizer_ms": times["optimizer"],
        "step_ms": sum(times.values()),
        "allocated_bytes": first["allocated"],
        "peak_allocated_bytes": step_peak,
        "reserved_bytes": probe.reserved_bytes if meter.cuda else None,
        "loss": loss_total,
        "extra": {
            "activation_bytes": first["activation_bytes"],
            "forward_peak_bytes": peaks["forward"],
            "backward_peak_bytes": peaks["backward"],
            "optimizer_peak_bytes": peaks["optimizer"],
            "recompute_peak_bytes": meter.recompute_peak,
            "memory_at_forward_end": first["at_forward_end"],
            "memory_at_peak": at_peak,
            "params_without_grad": missing,
            "nvml_used_bytes": meter.nvml_used(),
        },
    }
