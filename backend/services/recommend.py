"""The sweep recommendation: which setting to use, and why, without acting on noise.

Rules (issue: "a recommendation that never acts on noise"; issue 32: "one story per page"):

- Only succeeded runs whose gradients were not found to differ are candidates; a baseline's
  second run is not one (its timed steps join the first run's, see
  :func:`ckptlab.backend.services.sweeps.sweep_rows`).
- A checkpointing setting counts as saving memory only when its peak is lower than its
  baseline's by more than :data:`~ckptlab.analysis.explain.SAVING_THRESHOLD` (1%) and
  :data:`~ckptlab.analysis.explain.SAVING_FLOOR_BYTES` (4 KiB), and its activations are too: a
  setting that leaves activations unchanged (``segments: 1``) never wins on a faster step
  time that is noise.
- Time is the step-time overhead against the run's own baseline with its 95% CI
  (:func:`row_overhead`): for a run timed in rounds paired with an un-checkpointed copy in
  its own process, that pairing (a busy host cancels); raw step times of separate runs are
  never compared. :func:`rank_rows` orders the candidates by it, once: the "fastest"
  pick, the table's sort and the charts' highlighting all read that one order.
- With a memory budget: the first candidate in that order (a baseline or a setting with a
  real saving) whose peak fits; no fitting setting is then measurably faster. Without a
  budget: the setting with the lowest peak among those with a real saving, the order
  breaking ties in peak (within 1% / 4 KiB). When nothing beats the baseline, it says so,
  and why (e.g. the peak is in the optimizer step).
- "Within X%" (:attr:`Recommendation.smallest_within`): the lowest peak among the choices
  whose overhead's estimate against their baseline is at most X%; nothing else is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ckptlab.analysis.explain import SAVING_FLOOR_BYTES, SAVING_THRESHOLD, format_bytes
from ckptlab.analysis.stats import RatioInterval
from ckptlab.backend.services.sweeps import SweepRow, compare_rows
from ckptlab.domain import Status

__all__ = ["Recommendation", "recommend", "rank_rows", "order_by_overhead", "row_overhead"]


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
        smallest_within: with ``within_pct``, ``{experiment_id, label, within_pct,
            overhead_pct, overhead_low_pct, overhead_high_pct, overhead_text}``: the lowest
            peak among the choices (fitting the budget, if any) whose overhead's estimate
            against their own baseline is at most ``within_pct`` % (a baseline: 0%), with
            that overhead and its 95% CI; None when not asked or none qualifies.
        ranking: the candidates' experiment ids in :func:`rank_rows` order (fastest
            first): the order the page's table sorts its overhead column by.
    """

    experiment_id: int | None
    label: str | None
    reason: str
    budget_bytes: int | None = None
    considered: list[int] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)
    fitting: list[int] | None = None
    smallest_within: dict | None = None
    ranking: list[int] = field(default_factory=list)


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


#: A baseline's overhead against itself: none, exactly.
_REFERENCE = RatioInterval(0.0, 0.0, 0.0)


def row_overhead(row: SweepRow, rows: Mapping[int, SweepRow] | None = None) -> RatioInterval | None:
    """The step-time overhead of ``row`` against its baseline, % with its 95% CI: the one
    the sweep's table, charts and exports show beside it (``row.overhead``, from its rounds
    paired with an un-checkpointed copy in its own process when it has them,
    :func:`ckptlab.backend.services.sweeps.sweep_rows`).

    Args:
        row: a row of :func:`ckptlab.backend.services.sweeps.sweep_rows`.
        rows: experiment id -> row of the same sweep, to find ``row``'s baseline for a
            row that carries no overhead yet (built by hand): then
            :func:`ckptlab.backend.services.sweeps.compare_rows` of the two.

    Returns:
        0% (CI 0 to 0) for a baseline's first run (the reference); None for a baseline's
        second run (its figure is a drift, not an overhead) and for a row without one.
    """
    if row.repeat_of is not None:
        return None
    if row.role == "baseline":
        return _REFERENCE
    if row.overhead is not None:
        fields = {k: row.overhead.get(k) for k in ("threshold_pct", "rounds", "not_comparable")}
        fields = {k: v for k, v in fields.items() if v is not None}
        return RatioInterval(row.overhead["estimate_pct"], row.overhead["low_pct"], row.overhead["high_pct"], **fields)
    base = (rows or {}).get(row.baseline_id) if row.baseline_id is not None else None
    return compare_rows(base, row) if base is not None else None


def _usable(interval: RatioInterval | None) -> bool:
    """An overhead that can be compared with another's: there is one, and it is not a
    comparison of separate runs that the host's load ruled out."""
    return interval is not None and interval.not_comparable is None


def order_by_overhead(subset: Sequence[SweepRow], rows: Sequence[SweepRow] = ()) -> list[SweepRow]:
    """``subset`` ordered fastest first by :func:`row_overhead` (``rows``: the whole sweep,
    for baselines of rows built by hand).

    The order, and so what "fastest" means where the intervals overlap: by the **upper end
    of the overhead's 95% CI** (the most the setting plausibly costs), then the lower peak,
    then the simpler setting, then the experiment id. Hence:

    - no row is measurably faster than one before it: a row whose CI lies wholly below
      another's (its high end under the other's low end) has the lower high end, so it
      comes first; the first fitting row has no fitting row measurably faster;
    - noise never wins: a wide interval whose estimate looks fast ranks by its high end,
      behind a steady one it cannot be told from;
    - a baseline (0%, CI 0 to 0) comes before every setting that is not measurably faster
      than no checkpointing (CI reaching 0 or above).

    Rows without a usable overhead (none, or separate runs the host's load made not
    comparable) come last, by peak then simplicity. The same order serves every subset
    (the fitting rows of any budget are in it in their own order).
    """
    by_id = {r.experiment_id: r for r in rows}

    def key(r: SweepRow) -> tuple:
        interval = row_overhead(r, by_id)
        high = interval.high_pct if _usable(interval) else 0.0
        return (not _usable(interval), high, _peak(r), r.simplicity, r.experiment_id)

    return sorted(subset, key=key)


def _why_peak(rows: Sequence[SweepRow]) -> str:
    base = next((r for r in rows if r.role == "baseline" and r.peak_explanation), None)
    return f" ({base.peak_explanation})" if base else ""


def _overhead_words(r: SweepRow, interval: RatioInterval | None) -> str:
    """The overhead the card shows beside a pick: the row's own words (they say how it was
    measured), else the interval's."""
    if r.role == "baseline":
        return "none (the baseline itself)"
    if r.overhead_text:
        return r.overhead_text
    if interval is None:
        return "overhead unknown"
    return f"{interval.estimate_pct:+.0f}% (95% CI {interval.low_pct:+.0f}% to {interval.high_pct:+.0f}%)"


def _smallest_within(ranked: list[SweepRow], rows: Sequence[SweepRow], within_pct: float) -> dict | None:
    """The lowest-peak row of ``ranked`` (in :func:`order_by_overhead` order) whose
    overhead's estimate against its baseline is at most ``within_pct`` %: a row whose
    estimate is above it is never named, however wide its CI; of peaks within 1% of the
    lowest (``SAVING_THRESHOLD``, as the recommendation's lowest peak) the one ranked first.
    None when none qualifies."""
    by_id = {r.experiment_id: r for r in rows}
    close = []
    for r in ranked:
        interval = row_overhead(r, by_id)
        if _usable(interval) and interval.estimate_pct <= within_pct:
            close.append((r, interval))
    if not close:
        return None
    # As the recommendation without a budget: of peaks within 1% of the lowest (the saving
    # threshold), the one ranked first, so the two answers never disagree on a near tie.
    low = min(_peak(r) for r, _ in close)
    margin = max(SAVING_THRESHOLD * low, SAVING_FLOOR_BYTES)
    best, interval = next(pair for pair in close if _peak(pair[0]) - low <= margin)
    return {
        "experiment_id": best.experiment_id,
        "label": best.label,
        "within_pct": within_pct,
        "overhead_pct": interval.estimate_pct,
        "overhead_low_pct": interval.low_pct,
        "overhead_high_pct": interval.high_pct,
        "overhead_text": _overhead_words(best, interval),
    }


def rank_rows(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """The sweep's candidates (succeeded first runs whose gradients do not differ, settings
    without a real saving included) in :func:`order_by_overhead` order, fastest first; sets
    each one's ``rank`` (1 = first) and every other row's to None.

    The one order behind the recommendation's "fastest fitting" pick, the page's table sort
    (by overhead) and the ``rank`` column of the results and their CSV.
    """
    ranked = order_by_overhead([r for r in rows if _exclusion(r) is None], rows)
    for r in rows:
        r.rank = None
    for i, r in enumerate(ranked, 1):
        r.rank = i
    return ranked


def recommend(
    rows: Sequence[SweepRow], *, budget_bytes: int | None = None, within_pct: float | None = None
) -> Recommendation:
    """Recommend a setting from a sweep's rows (see the module docstring for the rules).

    Args:
        rows: :func:`ckptlab.backend.services.sweeps.sweep_rows` of one sweep (their
            ``rank`` is set, :func:`rank_rows`).
        budget_bytes: the memory budget for the peak (bytes), or None.
        within_pct: also name the smallest setting whose overhead against its baseline is
            at most this (%, its estimate; :attr:`Recommendation.smallest_within`), or None.

    Returns:
        The recommendation with its reason and the ranking; the only one the API and the
        page show.
    """
    ranked = rank_rows(rows)
    rec = _recommend(rows, ranked, budget_bytes)
    rec.ranking = [r.experiment_id for r in ranked]
    if within_pct is not None and rec.considered:
        pool = set(rec.fitting if rec.fitting is not None else _eligible_ids(rec))
        rec.smallest_within = _smallest_within([r for r in ranked if r.experiment_id in pool], rows, within_pct)
    return rec


def _eligible_ids(rec: Recommendation) -> list[int]:
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
    runs, in :func:`order_by_overhead` order), of which the baselines and the runs with a
    real saving; what was left out, why."""

    candidates: list[SweepRow]
    baselines: list[SweepRow]
    saving: list[SweepRow]
    excluded: list[dict]


def _pool(rows: Sequence[SweepRow], ranked: list[SweepRow]) -> _Pool:
    by_id = {r.experiment_id: r for r in rows}
    excluded = [
        {"experiment_id": r.experiment_id, "label": r.label, "why": why}
        for r in rows
        if (why := _exclusion(r)) is not None
    ]
    baselines = [r for r in ranked if r.role == "baseline"]
    saving = [r for r in ranked if r.role == "run" and _real_saving(r, by_id.get(r.baseline_id))]
    for r in ranked:
        if r.role == "run" and r not in saving:
            why = "no real memory saving against its baseline (peak or activations within 1% / 4 KiB)"
            excluded.append({"experiment_id": r.experiment_id, "label": r.label, "why": why})
    return _Pool(ranked, baselines, saving, excluded)


def _recommend(rows: Sequence[SweepRow], ranked: list[SweepRow], budget_bytes: int | None) -> Recommendation:
    """The pick and its reason: under a budget, the first fitting choice in the ranking;
    without one, the lowest peak with a real saving."""
    pool = _pool(rows, ranked)
    fits = None
    if budget_bytes is not None:
        fits = [r.experiment_id for r in pool.candidates if _fits(r, pool, budget_bytes)]
    considered = [r.experiment_id for r in sorted(pool.candidates, key=lambda r: r.experiment_id)]

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


def _fits(r: SweepRow, pool: _Pool, budget_bytes: int) -> bool:
    """A choice (a baseline or a real saving) whose peak fits the budget."""
    return (r in pool.baselines or r in pool.saving) and _peak(r) <= budget_bytes


def _under_budget(rows: Sequence[SweepRow], pool: _Pool, budget_bytes: int) -> tuple[SweepRow | None, str]:
    fitting = [r for r in pool.candidates if _fits(r, pool, budget_bytes)]  # ranked: fastest first
    if not fitting:
        low = min(pool.candidates, key=_peak)
        return None, (
            f"nothing fits {format_bytes(budget_bytes)}: the lowest peak is {format_bytes(_peak(low))} "
            f"({low.label}){_why_peak(rows)}"
        )
    r = fitting[0]
    if r.role == "baseline":
        return r, (
            f"no checkpointing needed: the baseline's peak {format_bytes(_peak(r))} fits the budget, "
            "and no fitting setting is measurably faster"
        )
    by_id = {x.experiment_id: x for x in rows}
    return r, (
        f"the fastest setting whose peak fits {format_bytes(budget_bytes)}: peak {format_bytes(_peak(r))}, "
        f"overhead {_overhead_words(r, row_overhead(r, by_id))}; no fitting setting is measurably faster "
        "(settings rank by the high end of their overhead's 95% CI, so a noisy estimate never wins on luck)"
    )


def _lowest_peak(rows: Sequence[SweepRow], pool: _Pool) -> tuple[SweepRow | None, str]:
    if not pool.saving:
        base = pool.baselines[0] if pool.baselines else None
        return base, "nothing beats the baseline: no setting lowers the peak by more than 1%" + _why_peak(rows)
    low = min(_peak(r) for r in pool.saving)
    margin = max(SAVING_THRESHOLD * low, SAVING_FLOOR_BYTES)
    r = next(x for x in pool.saving if _peak(x) - low <= margin)  # ranked: the fastest of the tie in peak
    saved = r.metrics.get("peak_saving_pct")
    by_id = {x.experiment_id: x for x in rows}
    lowest = "" if _peak(r) == low else f" (the lowest is {format_bytes(low)}; within 1% of it, this one is faster)"
    return r, (
        f"the lowest peak with a real saving: {format_bytes(_peak(r))}"
        + (f" ({saved:.0f}% below its baseline)" if saved is not None else "")
        + f", overhead {_overhead_words(r, row_overhead(r, by_id))}{lowest}; of peaks within 1% of the lowest, "
        "the fastest"
    )
