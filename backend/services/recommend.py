"""The sweep recommendation: which setting to use, and why, without acting on noise.

Rules (issue: "a recommendation that never acts on noise"):

- Only succeeded runs whose gradients were not found to differ are candidates; a baseline's
  second run is not one (its timed steps join the first run's, see
  :func:`ckptlab.backend.services.sweeps.sweep_rows`).
- A checkpointing setting counts as saving memory only when its peak is lower than its
  baseline's by more than :data:`~ckptlab.analysis.explain.SAVING_THRESHOLD` (1%) and
  :data:`~ckptlab.analysis.explain.SAVING_FLOOR_BYTES` (4 KiB), and its activations are too: a
  setting that leaves activations unchanged (``segments: 1``) never wins on a faster step
  time that is noise.
- Two candidates' step times differ only when the bootstrap 95% CI of their ratio excludes
  0 and their estimate reaches the noise threshold (:func:`ckptlab.analysis.stats.ratio_ci`,
  :data:`ckptlab.analysis.stats.NOISE_THRESHOLD_PCT`); otherwise they tie, and a tie goes to the simpler
  setting (none, then sequential with fewer segments, per_block, selective, offload).
- With a memory budget: the baseline when it fits; else the fastest fitting setting with a
  real saving. Without a budget: the setting with the lowest peak among those with a real
  saving, its time breaking ties that are within the threshold. When nothing beats the
  baseline, it says so, and why (e.g. the peak is in the optimizer step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ckptlab.analysis.explain import SAVING_FLOOR_BYTES, SAVING_THRESHOLD, format_bytes
from ckptlab.backend.services.sweeps import SweepRow, compare_rows
from ckptlab.domain import Status

__all__ = ["Recommendation", "recommend"]


@dataclass
class Recommendation:
    """What to use and why.

    Attributes:
        experiment_id: the recommended experiment (a baseline when nothing beats it), or
            None when no candidate exists or nothing fits the budget.
        label: its label.
        reason: the decision in plain words.
        budget_bytes: the budget it was made for, or None.
        considered: candidate experiment ids.
        excluded: ``{experiment_id, label, why}`` for rows left out (failed, wrong
            gradients, no real saving).
        fitting: with a budget, every candidate (baselines and settings with a real
            saving) whose peak fits it; None without a budget.
        smallest_within: with ``within_pct``, ``{experiment_id, label, within_pct}``: the
            lowest peak among the candidates (fitting the budget, if any) whose step time
            is not measurably more than ``within_pct`` % above the fastest of them; None
            when not asked or none qualifies.
    """

    experiment_id: int | None
    label: str | None
    reason: str
    budget_bytes: int | None = None
    considered: list[int] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)
    fitting: list[int] | None = None
    smallest_within: dict | None = None


def _peak(r: SweepRow) -> float:
    return r.metrics.get("peak_allocated_bytes") or 0.0


def _real_saving(r: SweepRow, base: SweepRow | None) -> bool:
    """Whether ``r`` lowers both the peak and the activations of its baseline by more than
    the threshold."""
    if base is None or r is base:
        return False
    for key in ("peak_allocated_bytes", "activation_bytes"):
        mine, theirs = r.metrics.get(key), base.metrics.get(key)
        if mine is None or not theirs or theirs - mine <= max(SAVING_THRESHOLD * theirs, SAVING_FLOOR_BYTES):
            return False
    return True


def _faster(a: SweepRow, b: SweepRow) -> bool:
    """Whether ``a`` is measurably faster than ``b`` (the 95% CI of ``b`` over ``a`` is
    above 0 and the estimate at least the noise threshold, :attr:`ckptlab.analysis.stats.RatioInterval.measurable`)."""
    interval = compare_rows(a, b)
    return interval is not None and interval.measurable and interval.low_pct > 0


def _best(rows: list[SweepRow], *, by_peak: bool) -> SweepRow:
    """The simplest row that nothing else beats: by time (measurably faster), or by peak
    first (lower by more than the threshold) and then time."""
    ordered = sorted(rows, key=lambda r: r.simplicity)
    best = ordered[0]
    for r in ordered[1:]:
        if by_peak:
            margin = max(SAVING_THRESHOLD * _peak(best), SAVING_FLOOR_BYTES)
            if _peak(best) - _peak(r) > margin or (abs(_peak(best) - _peak(r)) <= margin and _faster(r, best)):
                best = r
        elif _faster(r, best):
            best = r
    return best


def _why_peak(rows: Sequence[SweepRow]) -> str:
    base = next((r for r in rows if r.role == "baseline" and r.peak_explanation), None)
    return f" ({base.peak_explanation})" if base else ""


def _smallest_within(pool: list[SweepRow], within_pct: float) -> dict | None:
    """The lowest-peak row of ``pool`` whose step time is within ``within_pct`` % of the
    fastest row's: its ratio's 95% CI reaches down to ``within_pct`` or below (so noise
    never rules a row out); ties on peak go to the simpler setting."""
    if not pool:
        return None
    fastest = _best(pool, by_peak=False)
    close = []
    for r in pool:
        interval = compare_rows(fastest, r)
        if r is fastest or (interval is not None and interval.low_pct <= within_pct):
            close.append(r)
    best = min(close, key=lambda r: (_peak(r), r.simplicity))
    return {"experiment_id": best.experiment_id, "label": best.label, "within_pct": within_pct}


def recommend(
    rows: Sequence[SweepRow], *, budget_bytes: int | None = None, within_pct: float | None = None
) -> Recommendation:
    """Recommend a setting from a sweep's rows (see the module docstring for the rules).

    Args:
        rows: :func:`ckptlab.backend.services.sweeps.sweep_rows` of one sweep.
        budget_bytes: the memory budget for the peak (bytes), or None.
        within_pct: also name the smallest setting within this step-time overhead (%) of
            the fastest (:attr:`Recommendation.smallest_within`), or None.

    Returns:
        The recommendation with its reason; the only one the API and the page show.
    """
    rec = _recommend(rows, budget_bytes)
    if within_pct is not None and rec.considered:
        by_id = {r.experiment_id: r for r in rows}
        pool_ids = rec.fitting if rec.fitting is not None else _eligible_ids(rows, rec)
        rec.smallest_within = _smallest_within([by_id[i] for i in pool_ids], within_pct)
    return rec


def _eligible_ids(rows: Sequence[SweepRow], rec: Recommendation) -> list[int]:
    """Candidates that are a choice: baselines, and settings with a real saving."""
    out = {e["experiment_id"] for e in rec.excluded}
    return [i for i in rec.considered if i not in out]


def _exclusion(r: SweepRow) -> str | None:
    """Why a run cannot be recommended at all, or None when it is a candidate."""
    if r.status != Status.SUCCEEDED or r.metrics.get("peak_allocated_bytes") is None:
        return f"status {r.status}"
    if r.gradients_match is False:
        return "its gradients differ"
    if r.repeat_of is not None:
        return f"second run of baseline {r.repeat_of}: its step times join the baseline's, and show drift"
    return None


@dataclass
class _Pool:
    """The runs a recommendation chooses from: candidates (succeeded, gradients right, first
    runs), of which the baselines and the runs with a real saving; what was left out, why."""

    candidates: list[SweepRow]
    baselines: list[SweepRow]
    saving: list[SweepRow]
    excluded: list[dict]


def _pool(rows: Sequence[SweepRow]) -> _Pool:
    by_id = {r.experiment_id: r for r in rows}
    excluded: list[dict] = []
    candidates: list[SweepRow] = []
    for r in rows:
        why = _exclusion(r)
        if why is None:
            candidates.append(r)
        else:
            excluded.append({"experiment_id": r.experiment_id, "label": r.label, "why": why})
    baselines = [r for r in candidates if r.role == "baseline"]
    saving = [r for r in candidates if r.role == "run" and _real_saving(r, by_id.get(r.baseline_id))]
    for r in candidates:
        if r.role == "run" and r not in saving:
            why = "no real memory saving against its baseline (peak or activations within 1% / 4 KiB)"
            excluded.append({"experiment_id": r.experiment_id, "label": r.label, "why": why})
    return _Pool(candidates, baselines, saving, excluded)


def _recommend(rows: Sequence[SweepRow], budget_bytes: int | None) -> Recommendation:
    """The pick and its reason: under a budget, the fastest setting whose peak fits (the
    baseline first, if it fits); without one, the lowest peak with a real saving."""
    pool = _pool(rows)
    fits = None
    if budget_bytes is not None:
        fits = [r.experiment_id for r in [*pool.baselines, *pool.saving] if _peak(r) <= budget_bytes]
    considered = [r.experiment_id for r in pool.candidates]

    def answer(r: SweepRow | None, reason: str) -> Recommendation:
        return Recommendation(
            r.experiment_id if r else None,
            r.label if r else None,
            reason,
            budget_bytes,
            considered,
            pool.excluded,
            fits,
        )

    if not pool.candidates:
        return answer(None, "no succeeded run with matching gradients to recommend")
    if budget_bytes is not None:
        return answer(*_under_budget(rows, pool, budget_bytes))
    return answer(*_lowest_peak(rows, pool))


def _under_budget(rows: Sequence[SweepRow], pool: _Pool, budget_bytes: int) -> tuple[SweepRow | None, str]:
    fitting_base = [r for r in pool.baselines if _peak(r) <= budget_bytes]
    if fitting_base:
        r = _best(fitting_base, by_peak=False)
        return r, f"no checkpointing needed: the baseline's peak {format_bytes(_peak(r))} fits the budget"
    fitting = [r for r in pool.saving if _peak(r) <= budget_bytes]
    if not fitting:
        low = min(pool.candidates, key=_peak)
        return None, (
            f"nothing fits {format_bytes(budget_bytes)}: the lowest peak is {format_bytes(_peak(low))} "
            f"({low.label}){_why_peak(rows)}"
        )
    r = _best(fitting, by_peak=False)
    return r, (
        f"the fastest setting whose peak fits {format_bytes(budget_bytes)}: peak {format_bytes(_peak(r))}, "
        f"step time {r.overhead_text or 'overhead unknown'}; simpler settings win ties within the noise"
    )


def _lowest_peak(rows: Sequence[SweepRow], pool: _Pool) -> tuple[SweepRow | None, str]:
    if not pool.saving:
        base = _best(pool.baselines, by_peak=False) if pool.baselines else None
        return base, "nothing beats the baseline: no setting lowers the peak by more than 1%" + _why_peak(rows)
    r = _best(pool.saving, by_peak=True)
    saved = r.metrics.get("peak_saving_pct")
    return r, (
        f"the lowest peak with a real saving: {format_bytes(_peak(r))}"
        + (f" ({saved:.0f}% below its baseline)" if saved is not None else "")
        + f", step time {r.overhead_text or 'overhead unknown'}; simpler settings win ties within the noise"
    )
