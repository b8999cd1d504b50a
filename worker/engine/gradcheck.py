"""The gradient check: one step with and one without the spec's checkpointing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import BASELINE
from ckptlab.worker.engine.strategies import CheckpointedGroup, apply_strategy
from ckptlab.worker.engine.training import autocast_for, compile_whole_step
from ckptlab.worker.measure.memory import LiveTensorTracker
from ckptlab.worker.models.base import Built
from ckptlab.worker.models.build import build_model

__all__ = ["verify_gradients"]


#: Relative difference (to the largest output value) above which a group's recomputed
#: output differs from its first forward's: far above rounding (recomputation runs the same
#: kernels on the same inputs; GPU kernels with atomics may differ in the last bits), far
#: below a redrawn dropout mask (it changes about half the values by their whole size).
RECOMPUTE_RTOL = 1e-3
#: Names of parameters listed in ``params_missing_grad`` at most.
_MAX_NAMES = 20


#: float32's machine epsilon: the relative tolerance's floor (no absolute one).
_EPS32 = float(torch.finfo(torch.float32).eps)
#: Largest reference gradient below which the comparison is undetermined (float32's
#: subnormal range and underflow start near 1e-38: relative errors there mean nothing).
VANISHING_GRADIENT = 1e-20


def _forward_bytes(dev: torch.device, forward, known: list[torch.Tensor]) -> tuple[Any, int]:
    """Run ``forward()`` and count the bytes it leaves alive (the activations autograd keeps,
    the output and the loss): the CPU tracker's exact count, or the CUDA allocator's
    ``memory_allocated`` difference. ``known``: tensors that exist already (parameters,
    buffers, the batch; a dict batch's values), so that views of them are not counted."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        result = forward()
        torch.cuda.synchronize(dev)
        return result, torch.cuda.memory_allocated(dev) - before
    with LiveTensorTracker() as tracker:
        for t in known:  # views of these (a weight's transpose) are not new bytes
            for tensor in t.values() if isinstance(t, dict) else (t,):  # keyword-argument inputs
                tracker.track(tensor)
        before = tracker.live_bytes
        result = forward()
    return result, tracker.live_bytes - before


def verify_gradients(
    spec: ExperimentSpec,
    dev: torch.device,
    build: Callable[[], Built] | None = None,
    ranges: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Compare one step's gradients with and without the spec's checkpointing, parameter by
    parameter, and count the reference's activation bytes. ``build`` makes a fresh copy of
    the model (default: :func:`ckptlab.worker.models.build.build_model` of ``spec.model``; a model in
    hand passes a deep copy). ``ranges``: a planned strategy's groups (``auto``).

    Both models start from the same weights (the reference's ``state_dict``), see the same
    first batch and the same RNG seed before forward (so dropout draws the same masks in
    the first forward, when the RNG state is preserved). Each parameter is judged on its
    own scale, so a large gradient elsewhere cannot hide a wrong one: parameter ``p``
    matches when ``max|g_ckpt - g_ref| <= (rtol + eps) * max|g_ref|`` over ``p``'s entries
    (rtol 1e-4 in float32, 1e-2 under autocast, as ``torch.testing.assert_close`` scales
    its defaults by dtype; eps is float32's): no absolute floor, so a parameter whose
    gradients are all tiny (the early layers of a deep MLP) is judged on its own scale, and
    a different dropout mask there is caught (issue 19). A parameter with a reference
    gradient but none under checkpointing does not match. When every reference gradient is
    below :data:`VANISHING_GRADIENT`, nothing can be compared: ``gradients_match`` is None
    and ``gradient_verdict`` says "undetermined: vanishing gradients".

    Returns:
        ``gradients_match`` (every parameter matches; None when undetermined),
        ``gradient_verdict`` (``match``, ``differ`` or ``undetermined: vanishing
        gradients``), ``grad_mismatch_count``,
        ``grad_worst_param`` (the name with the largest relative error) and
        ``grad_worst_rel_error`` (its ``max|Δ| / max|g_ref|``), ``params_missing_grad``
        (names, at most 20), ``grad_max_abs_diff`` (max over all parameters of
        ``|g_ckpt - g_ref|``), ``grad_max_abs`` (max ``|g_ref|``), ``loss_diff``, and
        ``reference_activation_bytes``: bytes one forward of the same model without
        checkpointing leaves alive (to tell whether a setting saves anything). The
        gradient fields are None for strategy ``none``.
    """
    build = build or (lambda: build_model(spec.model))
    autocast = autocast_for(spec, dev)
    ref, x, y = _reference_model(spec, dev, build)
    forward = _seeded_forward(spec, autocast, x, y)
    if spec.checkpoint.strategy == BASELINE:
        return _baseline_check(dev, forward, ref, x, y)
    ck, ck_params = _checkpointed_copy(spec, dev, build, ref, ranges)
    loss_ref, ref_bytes = _reference_step(dev, forward, ref, x, y)
    loss_ck, groups = _checkpointed_step(forward, ck)
    recompute, first_differing = _recompute_check(groups)
    grads = _compare_gradients(ref, ck_params, rtol=1e-4 if spec.amp == "off" else 1e-2)
    verdict, match = _gradient_verdict(first_differing is not None, grads.scale < VANISHING_GRADIENT, grads.mismatches)
    return {
        **recompute,
        "grad_max_abs_diff": grads.diff,
        "grad_max_abs": grads.scale,
        "loss_diff": abs(float(loss_ck.detach().float()) - float(loss_ref.detach().float())),
        "gradients_match": match,
        "gradient_verdict": verdict,
        "grad_mismatch_count": grads.mismatches,
        "grad_worst_param": grads.worst,
        "grad_worst_rel_error": grads.worst_rel if grads.worst is not None else None,
        "params_missing_grad": grads.missing[:_MAX_NAMES],
        "reference_activation_bytes": ref_bytes,
    }


#: One seeded forward of a model on the check's batch: ``built -> (output, loss)``.
_Forward = Callable[[Built], tuple[torch.Tensor, torch.Tensor]]


def _reference_model(
    spec: ExperimentSpec, dev: torch.device, build: Callable[[], Built]
) -> tuple[Built, torch.Tensor, torch.Tensor]:
    """The reference model (built after seeding ``spec.seed``, in training mode on ``dev``)
    and its first batch ``(inputs, targets)`` on ``dev``, drawn from ``spec.seed``."""
    torch.manual_seed(spec.seed)
    ref = build()
    ref.module.to(dev).train()
    x, y = ref.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
    return ref, x.to(dev), y.to(dev)


def _seeded_forward(spec: ExperimentSpec, autocast: Callable[[], Any], x: torch.Tensor, y: torch.Tensor) -> _Forward:
    """A forward of a model on ``(x, y)`` after seeding ``spec.seed + 1``, under the spec's
    autocast: both models draw the same dropout masks in their first forward."""

    def forward(built: Built) -> tuple[torch.Tensor, torch.Tensor]:
        # (output, loss), both alive when the bytes are counted: the engine's count keeps
        # the output too (one counting rule, so a finding comparing them cannot fire on
        # identical settings).
        torch.manual_seed(spec.seed + 1)
        return built.output_and_loss(x, y, autocast)

    return forward


def _known_tensors(built: Built, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that exist before a forward: parameters, buffers and the batch."""
    return [*built.module.parameters(), *built.module.buffers(), x, y]


def _baseline_check(
    dev: torch.device, forward: _Forward, ref: Built, x: torch.Tensor, y: torch.Tensor
) -> dict[str, Any]:
    """The check of strategy ``none``: nothing to compare, only the reference's bytes."""
    _kept, ref_bytes = _forward_bytes(dev, lambda: forward(ref), _known_tensors(ref, x, y))
    return {
        "grad_max_abs_diff": None,
        "grad_max_abs": None,
        "loss_diff": None,
        "gradients_match": None,
        "reference_activation_bytes": ref_bytes,
    }


def _checkpointed_copy(
    spec: ExperimentSpec,
    dev: torch.device,
    build: Callable[[], Built],
    ref: Built,
    ranges: list[tuple[int, int]] | None,
) -> tuple[Built, list[torch.nn.Parameter]]:
    """A fresh model with the reference's weights and the spec's checkpointing applied, and
    its parameters in the reference's order (listed before regrouping; identities survive)."""
    ck = build()
    ck.module.load_state_dict(ref.module.state_dict())
    ck.module.to(dev).train()
    ck_params = list(ck.module.parameters())
    apply_strategy(ck.blocks, spec.checkpoint, device=dev, ranges=ranges)
    compile_whole_step(ck, spec, dev)
    return ck, ck_params


def _reference_step(
    dev: torch.device, forward: _Forward, ref: Built, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Forward and backward the reference: its loss and the bytes its forward left alive."""
    (out_ref, loss_ref), ref_bytes = _forward_bytes(dev, lambda: forward(ref), _known_tensors(ref, x, y))
    loss_ref.backward()
    del out_ref
    return loss_ref, ref_bytes


def _checkpointed_step(forward: _Forward, ck: Built) -> tuple[torch.Tensor, list[CheckpointedGroup]]:
    """Forward and backward the checkpointed model, each group comparing its recomputed
    output with its first forward's: the loss and the checkpointed groups."""
    groups = [g for g in ck.blocks if isinstance(g, CheckpointedGroup)]
    for g in groups:
        g.check_recompute = True
    with set_checkpoint_early_stop(False):  # (read at forward) recompute each group whole: its output exists
        out_ck, loss_ck = forward(ck)
        loss_ck.backward()
    del out_ck
    return loss_ck, groups


def _recompute_check(groups: list[CheckpointedGroup]) -> tuple[dict[str, Any], CheckpointedGroup | None]:
    """The recomputation's fields (``recompute_verdict``, and
    ``recompute_first_differing_group`` when one differs) and the first differing group."""
    differing = [g for g in groups if (g.recompute_rel_diff or 0.0) > RECOMPUTE_RTOL]
    first_differing = min(differing, key=lambda g: g.blocks_range) if differing else None
    recompute: dict[str, Any] = {"recompute_verdict": None}
    if differing:
        recompute["recompute_verdict"] = "differ"
    elif groups and all(g.recompute_max_abs_diff is not None for g in groups):  # every group compared
        recompute["recompute_verdict"] = "match"
    if first_differing is not None:
        start, end = first_differing.blocks_range
        recompute["recompute_first_differing_group"] = {
            "start": start,
            "end": end,
            "max_abs_diff": first_differing.recompute_max_abs_diff,
        }
    return recompute, first_differing


@dataclass
class _GradComparison:
    """Totals of the parameter-by-parameter comparison.

    Attributes:
        diff: max ``|g_ckpt - g_ref|`` over all parameters.
        scale: max ``|g_ref|`` over all parameters.
        mismatches: parameters that do not match.
        worst: the mismatching parameter with the largest relative error, or None.
        worst_rel: its ``max|Δ| / max|g_ref|``.
        missing: parameters with a reference gradient but none under checkpointing.
    """

    diff: float = 0.0
    scale: float = 0.0
    mismatches: int = 0
    worst: str | None = None
    worst_rel: float = 0.0
    missing: list[str] = field(default_factory=list)

    def add(self, name: str, pr: torch.nn.Parameter, pc: torch.nn.Parameter, rtol: float) -> None:
        """Compare parameter ``name``'s gradients: reference ``pr``, checkpointed ``pc``."""
        gr, gc = _grad32(pr), _grad32(pc)
        d = float((gc - gr).abs().max())
        ref_scale = float(gr.abs().max())
        self.diff, self.scale = max(self.diff, d), max(self.scale, ref_scale)
        lost = pc.grad is None and pr.grad is not None and ref_scale > 0
        if lost:
            self.missing.append(name)
        if lost or d > (rtol + _EPS32) * ref_scale:
            self._mismatch(name, _relative(d, ref_scale))

    def _mismatch(self, name: str, rel: float) -> None:
        self.mismatches += 1
        if self.worst is None or rel > self.worst_rel:
            self.worst, self.worst_rel = name, rel


def _grad32(p: torch.nn.Parameter) -> torch.Tensor:
    """``p``'s gradient in float32 (zeros when it has none)."""
    return p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)


def _relative(d: float, ref_scale: float) -> float:
    """``d / ref_scale``; 0 for 0 / 0, infinite for a difference on a zero scale."""
    return d / ref_scale if ref_scale > 0 else (0.0 if d == 0 else float("inf"))


def _compare_gradients(ref: Built, ck_params: list[torch.nn.Parameter], rtol: float) -> _GradComparison:
    """Compare every parameter's gradients (the reference's named parameters in order)."""
    grads = _GradComparison()
    for (name, pr), pc in zip(ref.module.named_parameters(), ck_params, strict=True):
        grads.add(name, pr, pc, rtol)
    return grads


def _gradient_verdict(recompute_differs: bool, vanished: bool, mismatches: int) -> tuple[str, bool | None]:
    """``(gradient_verdict, gradients_match)``: a differing recomputation differs whatever
    the gradients' scale; vanishing gradients leave it undetermined."""
    if recompute_differs:
        return "differ", False
    if vanished:
        return "undetermined: vanishing gradients", None
    return ("match", True) if not mismatches else ("differ", False)
