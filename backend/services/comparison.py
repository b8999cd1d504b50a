"""An experiment against its ``none`` baseline: which baseline runs, and the step-time
overhead with its 95% confidence interval, computed once on the server so that the
experiment page, the sweep table and the recommendation use the same rule
(:attr:`ckptlab.analysis.stats.RatioInterval.measurable`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from ckptlab.analysis.stats import NOISE_THRESHOLD_PCT, between_separate_runs, paired_overhead_of, ratio_ci
from ckptlab.backend.services.sweeps import overhead_words, step_samples, sweep_rows
from ckptlab.db import store
from ckptlab.db.models import Experiment
from ckptlab.domain import Status
from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.limits import limit_errors
from ckptlab.strategies import BASELINE

__all__ = ["Comparison", "baseline_refusal", "compare_with_baseline", "MAX_BASELINE_RUNS"]

#: Most recent matching baseline runs pooled for an experiment outside a sweep.
MAX_BASELINE_RUNS = 10
#: Candidate ``none`` runs of the same model kind scanned for a matching spec.
_SCAN = 500


@dataclass
class Comparison:
    """An experiment against its baseline.

    Attributes:
        experiment_id: the experiment.
        is_baseline: it is itself a ``none`` run (nothing to compare).
        baseline_ids: the succeeded baseline runs it is compared with (a run whose timed
            steps were paired with an un-checkpointed copy in its own process takes its
            overhead from those rounds, and these runs only for memory) (in a
            sweep: the sweep's baseline of its group, both runs; else up to
            :data:`MAX_BASELINE_RUNS` succeeded ``none`` runs whose spec equals its own
            but for ``checkpoint``, ``timeout_s``, ``memory_snapshot`` and
            ``verify_gradients``), oldest first; empty when there is none.
        overhead: :class:`ckptlab.analysis.stats.RatioInterval` as a dict (``estimate_pct``,
            ``low_pct``, ``high_pct``, ``measurable``), or None without timed steps.
        overhead_text: it in words (``"+18% (95% CI +12% to +25%)"`` or ``"no measurable
            difference (...)"``), or None.
        baseline_refused: why this server would refuse the run's baseline (its spec with
            strategy ``none``, what "Run the baseline" submits), in one sentence saying what
            to do instead; None when it would queue it (:func:`baseline_refusal`).
    """

    experiment_id: int
    is_baseline: bool
    baseline_ids: list[int] = field(default_factory=list)
    overhead: dict[str, Any] | None = None
    overhead_text: str | None = None
    paired: bool = False
    baseline_refused: str | None = None


#: Spec fields that do not change the timed work: a baseline may differ in them.
_NOT_WORKLOAD = ("checkpoint", "timeout_s", "memory_snapshot", "verify_gradients")


def _workload(spec: ExperimentSpec | None) -> dict[str, Any] | None:
    """What a run trains, less how it checkpoints and how long it may take: two runs with
    the same workload are each other's baseline. None for a spec that no longer validates."""
    return spec.model_dump(mode="json", exclude=set(_NOT_WORKLOAD)) if spec is not None else None


def compare_with_baseline(
    session: Session, *, experiment: Experiment, noise_threshold_pct: float = NOISE_THRESHOLD_PCT
) -> Comparison:
    """The comparison of ``experiment`` with its baseline (see :class:`Comparison`): its own
    paired rounds when it has them; in a sweep, its row's (:func:`sweep_rows`); otherwise
    against the timed steps of the latest succeeded baselines of the same workload.

    The baseline's timed steps of all its runs are pooled, so that a drift between them
    widens the interval instead of biasing it. ``noise_threshold_pct``: the least estimate
    that counts as a difference (:attr:`ckptlab.analysis.stats.RatioInterval.measurable`).
    """
    if experiment.strategy == BASELINE:  # the row's column, stored from the spec
        return Comparison(experiment_id=experiment.id, is_baseline=True)
    if experiment.sweep_id is not None:
        in_sweep = _in_sweep(session, experiment, noise_threshold_pct)
        if in_sweep is not None:
            return in_sweep
    matches = _same_workload_baselines(session, experiment)
    summary = experiment.run_summary
    rounds = summary.paired_rounds()
    if rounds is not None:  # its own paired rounds (issue 19): the runs are for memory only
        interval = paired_overhead_of(summary, threshold_pct=noise_threshold_pct)  # stored at its finish
        words = overhead_words(interval, paired=rounds[2])
    elif matches:
        pooled = [t for e in matches for t in step_samples(e)]
        interval = ratio_ci(pooled, summary.step_times_ms, threshold_pct=noise_threshold_pct)
        interval = between_separate_runs(
            interval, [summary.compared_load()], [e.run_summary.compared_load() for e in matches]
        )
        words = overhead_words(interval, paired=False)
    else:
        return Comparison(experiment_id=experiment.id, is_baseline=False)
    return Comparison(
        experiment_id=experiment.id,
        is_baseline=False,
        baseline_ids=[e.id for e in matches],
        overhead=interval.as_dict() if interval else None,
        overhead_text=words,
        paired=rounds is not None,
    )


#: What a run ``ckptlab.profile`` stored says instead of a baseline button: the server names
#: the model by its class and never imports it, so its baseline is profiled where it lives.
PROFILED_BASELINE = (
    "this run was profiled in your own process, whose model this server does not build: run "
    '`ckptlab.profile(model, sample, strategy="none")` there for its baseline'
)


def baseline_refusal(experiment: Experiment, settings: Settings) -> str | None:
    """Why this server would refuse ``experiment``'s baseline, or None when it would queue it.

    The baseline is what "Run the baseline" submits: the stored spec with
    ``checkpoint.strategy`` set to ``none``, checked as ``POST /api/experiments`` checks a
    spec (:func:`ckptlab.spec.limits.limit_errors`: the server's limits and the model kind's
    admission check, e.g. a ``python`` target outside ``allowed_model_targets``). A run
    ``ckptlab.profile`` stored (its summary names the profiled ``model``) gets
    :data:`PROFILED_BASELINE`; any other refusal reads "this server would refuse its
    baseline: ..." with the checks' messages. A spec that no longer validates says so.
    """
    spec = experiment.experiment_spec
    if spec is None:
        return "its stored spec no longer validates, so no baseline can be made from it"
    body = spec.model_dump(mode="json")
    try:
        baseline = ExperimentSpec.model_validate({**body, "checkpoint": {**body["checkpoint"], "strategy": BASELINE}})
    except ValueError as exc:  # pydantic's ValidationError
        return f"this server would refuse its baseline: {exc}"
    errors = limit_errors(baseline, settings)
    if not errors:
        return None
    if experiment.run_summary.model is not None:
        return PROFILED_BASELINE
    return "this server would refuse its baseline: " + "; ".join(e["msg"] for e in errors)


def _in_sweep(session: Session, experiment: Experiment, noise_threshold_pct: float) -> Comparison | None:
    """The comparison its sweep's row makes (with every run of the row's baseline), or None
    when the row has no baseline."""
    sweep = store.get_sweep(session, sweep_id=experiment.sweep_id)
    rows = sweep_rows(sweep, noise_threshold_pct=noise_threshold_pct) if sweep is not None else []
    row = next((r for r in rows if r.experiment_id == experiment.id), None)
    if row is None or row.baseline_id is None:
        return None
    ids = [
        r.experiment_id
        for r in rows
        if r.role == "baseline"
        and r.status == Status.SUCCEEDED
        and (r.experiment_id == row.baseline_id or r.repeat_of == row.baseline_id)
    ]
    return Comparison(experiment.id, False, ids, row.overhead, row.overhead_text, row.paired is not None)


def _same_workload_baselines(session: Session, experiment: Experiment) -> list[Experiment]:
    """The latest succeeded baselines (at most :data:`MAX_BASELINE_RUNS`, oldest first) whose
    workload is ``experiment``'s, among the last :data:`_SCAN` of its model kind."""
    want = _workload(experiment.experiment_spec)
    if want is None:
        return []
    candidates = session.scalars(
        select(Experiment)
        .options(defer(Experiment.summary))  # a match's is read when its step times are needed
        .where(
            Experiment.strategy == BASELINE,
            Experiment.status == Status.SUCCEEDED,
            Experiment.model_kind == experiment.model_kind,
            Experiment.id != experiment.id,
        )
        .order_by(Experiment.id.desc())
        .limit(_SCAN)
    ).all()
    matches = [e for e in candidates if _workload(e.experiment_spec) == want]
    return sorted(matches[:MAX_BASELINE_RUNS], key=lambda e: e.id)
