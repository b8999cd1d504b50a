"""The gradient check: one step with and one without the spec's checkpointing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from ckptlab.spec import ExperimentSpec
from ckptlab.strategies import BASELINE
from worker.memory import LiveTensorTracker
from worker.models import Built, build_model
from worker.strategies import CheckpointedGroup, apply_strategy
from worker.training import autocast_for

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
    the model (default: :func:`worker.models.build_model` of ``spec.model``; a model in
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
    torch.manual_seed(spec.seed)
    ref = build()
    ref.module.to(dev).train()
    x, y = ref.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
    x, y = x.to(dev), y.to(dev)

    def forward(built: Built):
        # (output, loss), both alive when the bytes are counted: the engine's count keeps
        # the output too (one counting rule, so a finding comparing them cannot fire on
        # identical settings).
        torch.manual_seed(spec.seed + 1)
        with autocast():
            out = built.module(x)
        return out, built.loss_fn(out, y)

    if spec.checkpoint.strategy == BASELINE:
        _kept, ref_bytes = _forward_bytes(
            dev, lambda: forward(ref), [*ref.module.parameters(), *ref.module.buffers(), x, y]
        )
        return {
            "grad_max_abs_diff": None,
            "grad_max_abs": None,
            "loss_diff": None,
            "gradients_match": None,
            "reference_activation_bytes": ref_bytes,
        }
    ck = build()
    ck.module.load_state_dict(ref.module.state_dict())
    ck.module.to(dev).train()
    ck_params = list(ck.module.parameters())  # identities survive regrouping
    apply_strategy(ck.blocks, spec.checkpoint, device=dev, ranges=ranges)

    (out_ref, loss_ref), ref_bytes = _forward_bytes(
        dev, lambda: forward(ref), [*ref.module.parameters(), *ref.module.buffers(), x, y]
    )
    loss_ref.backward()
    del out_ref
    groups = [g for g in ck.blocks if isinstance(g, CheckpointedGroup)]
    for g in groups:
        g.check_recompute = True
    with set_checkpoint_early_stop(False):  # (read at forward) recompute each group whole: its output exists
        out_ck, loss_ck = forward(ck)
        loss_ck.backward()
    del out_ck
    differing = [g for g in groups if (g.recompute_rel_diff or 0.0) > RECOMPUTE_RTOL]
    first_differing = min(differing, key=lambda g: g.blocks_range) if differing else None
    rtol = 1e-4 if spec.amp == "off" else 1e-2
    diff, scale, mismatches, worst, worst_rel, missing = 0.0, 0.0, 0, None, 0.0, []
    for (name, pr), pc in zip(ref.module.named_parameters(), ck_params, strict=True):
        gr = pr.grad.float() if pr.grad is not None else torch.zeros_like(pr, dtype=torch.float32)
        gc = pc.grad.float() if pc.grad is not None else torch.zeros_like(pc, dtype=torch.float32)
        d = float((gc - gr).abs().max())
        ref_scale = float(gr.abs().max())
        diff, scale = max(diff, d), max(scale, ref_scale)
        lost = pc.grad is None and pr.grad is not None and ref_scale > 0
        if lost:
            missing.append(name)
        rel = d / ref_scale if ref_scale > 0 else (0.0 if d == 0 else float("inf"))
        if lost or d > (rtol + _EPS32) * ref_scale:
            mismatches += 1
            if worst is None or rel > worst_rel:
                worst, worst_rel = name, rel
    vanished = scale < VANISHING_GRADIENT
    if first_differing is not None:  # the recomputation itself differs: no gradient scale hides that
        verdict = "differ"
    else:
        verdict = "undetermined: vanishing gradients" if vanished else ("match" if not mismatches else "differ")
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
    return {
        **recompute,
        "grad_max_abs_diff": diff,
        "grad_max_abs": scale,
        "loss_diff": abs(float(loss_ck.detach().float()) - float(loss_ref.detach().float())),
        "gradients_match": False if first_differing is not None else (None if vanished else mismatches == 0),
        "gradient_verdict": verdict,
        "grad_mismatch_count": mismatches,
        "grad_worst_param": worst,
        "grad_worst_rel_error": worst_rel if worst is not None else None,
        "params_missing_grad": missing[:_MAX_NAMES],
        "reference_activation_bytes": ref_bytes,
    }
