"""Sweep reads for the API: progress counts, listing, and one row per experiment with its
baseline and the summary metrics the charts, exports and the recommendation use."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ckptlab.analysis.progress import SweepEta, format_duration, sweep_eta
from ckptlab.analysis.stats import (
    MIN_ROUNDS,
    NOISE_THRESHOLD_PCT,
    RatioInterval,
    between_separate_runs,
    paired_overhead_of,
    paired_ratio_ci,
    ratio_ci,
)
from ckptlab.backend.services.progress import first_started, now_of
from ckptlab.db.models import Experiment, Sweep
from ckptlab.domain import FINISHED_STATUSES, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.sweeps import axis_label, axis_value, is_checkpoint_axis, reads
from ckptlab.strategies import BASELINE, STRATEGIES
from ckptlab.summary import HostLoad

__all__ = [
    "Progress",
    "sweep_progress",
    "list_sweeps",
    "ROW_METRICS",
    "SweepRow",
    "sweep_rows",
    "overhead_words",
    "step_samples",
]


@dataclass(frozen=True)
class Progress:
    """How far a sweep has got.

    Attributes:
        total: experiments in the sweep.
        finished: those in a finished status (succeeded, failed, oom, timed_out, cancelled).
        counts: experiments per status (every status present, zeros included).
        elapsed_s: wall seconds since its first run started (None before one did).
        eta_s: about how many seconds remain (:func:`ckptlab.analysis.progress.sweep_eta`; 0 when
            done, None before a run finished).
    """

    total: int
    finished: int
    counts: dict[str, int]
    elapsed_s: float | None = None
    eta_s: float | None = None

    @property
    def done(self) -> bool:
        """Every experiment has finished."""
        return self.finished >= self.total

    @property
    def eta_text(self) -> str:
        """``about 3 min left`` (:func:`ckptlab.analysis.progress.sweep_eta`); before a run finished,
        that the estimate follows it; empty when done or before a run started."""
        if self.done or self.elapsed_s is None:
            return ""
        if self.eta_s is None:
            return "time left: estimated once a run finishes"
        return f"about {format_duration(self.eta_s)} left"


def sweep_progress(
    session: Session, *, sweep_ids: Sequence[int], statuses: Mapping[int, Sequence[str]] | None = None
) -> dict[int, Progress]:
    """Progress of each sweep in ``sweep_ids``: its runs' statuses counted (a grouped query, or
    ``statuses``: sweep id -> its runs' statuses as the caller read them, so that what it lists
    or sends and what it counts agree: each statement reads the latest commit, and a second
    count would see runs that finished in between) and, for unfinished sweeps, when their
    first run started (a query: the ETA).

    Returns:
        sweep id -> :class:`Progress` (sweeps without experiments get a zero total).
    """
    counts: dict[int, dict[str, int]] = {sid: dict.fromkeys(Status, 0) for sid in sweep_ids}
    rows: Sequence[Any] = []
    if statuses is not None:
        rows = [(sid, status, 1) for sid in sweep_ids for status in statuses.get(sid, ())]
    elif sweep_ids:
        rows = session.execute(
            select(Experiment.sweep_id, Experiment.status, func.count())
            .where(Experiment.sweep_id.in_(sweep_ids))
            .group_by(Experiment.sweep_id, Experiment.status)
        ).all()
    for sid, status, n in rows:
        counts[sid][status] = counts[sid].get(status, 0) + n
    started = first_started(session, [sid for sid, c in counts.items() if not _all_finished(c)])
    now = now_of(session) if started else None
    return {sid: _progress(c, started.get(sid), now) for sid, c in counts.items()}


def _all_finished(counts: Mapping[str, int]) -> bool:
    return all(s in FINISHED_STATUSES for s, n in counts.items() if n)


def _progress(counts: dict[str, int], started: datetime | None, now: datetime | None) -> Progress:
    """A sweep's :class:`Progress` from its counts per status and when its first run started."""
    total = sum(counts.values())
    done = sum(n for s, n in counts.items() if s in FINISHED_STATUSES)
    eta = SweepEta(None, 0.0 if done >= total else None)
    if started is not None and now is not None:
        eta = sweep_eta(total=total, finished=done, elapsed_s=(now - started).total_seconds())
    return Progress(total=total, finished=done, counts=counts, elapsed_s=eta.elapsed_s, eta_s=eta.eta_s)


def list_sweeps(session: Session, *, offset: int = 0, limit: int = 100) -> tuple[list[Sweep], int]:
    """Sweeps, newest first, and the total count.

    Args:
        offset: sweeps to skip (default 0).
        limit: most sweeps to return (default 100).
    """
    rows = session.scalars(select(Sweep).order_by(Sweep.id.desc()).offset(offset).limit(limit)).all()
    return list(rows), session.scalar(select(func.count()).select_from(Sweep)) or 0


#: :class:`ckptlab.summary.RunSummary` fields copied into :class:`SweepRow` metrics.
ROW_METRICS = (
    "activation_bytes",
    "peak_allocated_bytes",
    "recompute_peak_bytes",
    "step_time_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "grad_max_abs_diff",
    "loss_diff",
    "final_loss",
    "activation_bytes_at_peak",
    "reference_activation_bytes",
)


@dataclass
class SweepRow:
    """One experiment of a sweep, as the charts and exports see it.

    Attributes:
        experiment_id: the experiment.
        status: its status.
        role: ``baseline`` (``checkpoint.strategy`` is ``none``) or ``run``.
        values: axis path -> value (None for a checkpoint axis the run's strategy does not
            read: segments of a baseline or of per_block; :func:`ckptlab.spec.sweeps.reads`).
        group: the values of the non-checkpoint axes (which baseline applies).
        baseline_id: the experiment id of the matching baseline (its first run), or None.
        repeat_of: for a baseline's second run (queued after the sweep's runs), the first
            run's experiment id; None otherwise.
        metrics: numbers from the summary (:data:`ROW_METRICS`; missing keys are None) plus
            ``overhead_pct`` (step time over the baseline's, %) and
            ``activation_saving_pct`` (activation bytes saved against the baseline, %).
        gradients_match: the summary's ``gradients_match`` (None when not verified).
        error: the error text's first line, or None.
        label: ``axis_label`` of the values (e.g. ``segments=2 rng=on amp=off``).
        strategy: the spec's ``checkpoint.strategy``; ``simplicity``: a sort key, simplest
            first (none, then sequential with fewer segments, per_block, selective, offload).
        overhead: the step-time overhead against the baseline with its bootstrap 95% CI
            (:class:`ckptlab.analysis.stats.RatioInterval` as a dict), from the timed steps of both
            (the summary's ``step_times_ms``; the baseline's from all its succeeded runs, so a
            drift between its first and second run widens the interval); None without
            samples. For a baseline's second run: its drift against the first run.
        overhead_text: it in words: ``"+18% (95% CI +12% to +25%)"`` or ``"no measurable
            difference (95% CI -3% to +4%)"``.
        findings: the summary's finding codes; ``peak_phase`` and ``peak_explanation``
            from the summary.
        step_times_ms: the timed step times (ms), for comparing two rows; for a baseline's
            first run, those of all its succeeded runs.
        noise_threshold_pct: the noise threshold its comparisons use.
        loads: the host's load as the timing pass ended, for every run in its
            ``step_times_ms`` (a baseline's first run pools its repeats'). A comparison
            of separate runs whose loads say so is not comparable
            (:func:`ckptlab.analysis.stats.between_separate_runs`).
        paired: ``(baseline, run, clock)`` times of its paired rounds with an un-checkpointed copy
            in its own process (:meth:`ckptlab.summary.RunSummary.paired_rounds`; issue
            19), or None. With them the overhead is :func:`ckptlab.analysis.stats.paired_ratio_ci`
            of the rounds, not a comparison of separate runs.
        rank: its place (1 = fastest) in the order of the sweep's candidates by overhead
            (:func:`ckptlab.backend.services.recommend.rank_rows` sets it); None for a
            row that is not a candidate, and before ranking.
    """

    experiment_id: int
    status: str
    role: str
    values: dict[str, Any]
    group: dict[str, Any]
    baseline_id: int | None
    metrics: dict[str, float | None]
    gradients_match: bool | None
    error: str | None
    label: str
    strategy: str = BASELINE
    repeat_of: int | None = None
    noise_threshold_pct: float = NOISE_THRESHOLD_PCT
    simplicity: tuple = ()
    overhead: dict[str, Any] | None = None
    overhead_text: str | None = None
    findings: list[str] = field(default_factory=list)
    peak_phase: str | None = None
    peak_explanation: str | None = None
    step_times_ms: list[float] = field(default_factory=list)
    paired: tuple[list[float], list[float], str] | None = None
    paired_interval: RatioInterval | None = None
    loads: list[HostLoad | None] = field(default_factory=list)
    rank: int | None = None

    def paired_overhead(self) -> RatioInterval | None:
        """Its overhead from its paired rounds (None when it has none): the figures its
        worker stored (:func:`ckptlab.analysis.stats.paired_overhead_of`)."""
        return self.paired_interval


def compare_rows(a: SweepRow, b: SweepRow) -> RatioInterval | None:
    """How much slower ``b`` is than ``a`` (% with its 95% CI), as steadily as the two were
    measured: two runs with paired rounds compare their per-round ratios to their own
    un-checkpointed copies (a load that differed between the runs cancels); a paired run
    and a baseline compare through the run's rounds; otherwise the step times of separate
    runs (:func:`ckptlab.analysis.stats.ratio_ci`)."""
    threshold = a.noise_threshold_pct
    if a.paired is not None and b.paired is not None:
        ratios = [[s / t for t, s in zip(r.paired[0], r.paired[1], strict=False) if t > 0] for r in (a, b)]
        return ratio_ci(ratios[0], ratios[1], threshold_pct=threshold)
    if a.role == "baseline" and b.paired is not None:
        return paired_ratio_ci(b.paired[0], b.paired[1], threshold_pct=threshold)
    if b.role == "baseline" and a.paired is not None:
        return paired_ratio_ci(a.paired[1], a.paired[0], threshold_pct=threshold)
    return between_separate_runs(ratio_ci(a.step_times_ms, b.step_times_ms, threshold_pct=threshold), b.loads, a.loads)


def _simplicity(spec: ExperimentSpec | None) -> tuple:
    """Sort key, simplest first (the strategy table's rank and order); a spec that no longer
    validates, or a strategy the table no longer knows, sorts last."""
    entry = STRATEGIES.get(spec.checkpoint.strategy) if spec is not None else None
    return entry.simplicity(spec.checkpoint.model_dump()) if entry is not None else (float("inf"),)


def step_samples(experiment: Experiment) -> list[float]:
    """The timed step times (ms) of an experiment's summary (``step_times_ms``); [] when
    there are none (:attr:`ckptlab.db.models.Experiment.run_summary`)."""
    return experiment.run_summary.step_times_ms


#: How an overhead was measured, in its words: separate runs (paired rounds name their clock).
UNPAIRED_WORDS = "separate runs, not paired"


def overhead_words(
    interval: RatioInterval | None, *, drift: bool = False, paired: str | bool | None = None
) -> str | None:
    """An overhead in words; "no measurable difference" when it is not measurable (its 95% CI
    contains 0 or its estimate is below the noise threshold,
    :attr:`ckptlab.analysis.stats.RatioInterval.measurable`), with the reason; over too few
    rounds the estimate and "not called: too few rounds (3; at least 5)".

    With ``drift``: the same for a baseline's second run against its first ("drift: ...").
    ``paired``: say how it was measured (the clock of paired rounds, e.g. ``"CPU time"``:
    "CPU time of rounds paired with none in one process"; False: :data:`UNPAIRED_WORDS`;
    None: nothing).
    """
    if interval is None:
        return None
    ci = f"95% CI {interval.low_pct:+.0f}% to {interval.high_pct:+.0f}%"
    if interval.not_comparable is not None:  # "separate runs on a busy host: not comparable (loads...)"
        text = f"{interval.not_comparable[:-1]}; {ci})"
        return f"drift since the first baseline run: {text}" if drift else text
    if paired is not None:
        ci += f"; {paired} of rounds paired with none in one process" if paired else f"; {UNPAIRED_WORDS}"
    if interval.measurable:
        text = f"{interval.estimate_pct:+.0f}% ({ci})"
    elif interval.rounds is not None and interval.rounds < MIN_ROUNDS:  # an estimate, not a verdict
        text = f"{interval.estimate_pct:+.0f}% ({ci}), not called: {interval.unmeasured_why}"
    else:
        text = f"no measurable difference ({ci}; {interval.unmeasured_why})"
    return f"drift since the first baseline run: {text}" if drift else text


def _group_key(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def sweep_rows(sweep: Sweep, *, noise_threshold_pct: float = NOISE_THRESHOLD_PCT) -> list[SweepRow]:
    """One :class:`SweepRow` per experiment of ``sweep`` (in id order), baselines matched.

    ``noise_threshold_pct``: the least overhead estimate that counts as a difference
    (:attr:`ckptlab.analysis.stats.RatioInterval.measurable`; the server's ``noise_threshold_pct``).

    Specs and summaries are read through the store's typed records
    (:attr:`ckptlab.db.models.Experiment.experiment_spec` and ``run_summary``): a summary
    key that is missing or holds another type is None; a spec that no longer validates
    gives a row without axis values.
    """
    paths = list(sweep.axes or {})
    experiments = sorted(sweep.experiments, key=lambda e: e.id)
    specs = {exp.id: exp.experiment_spec for exp in experiments}  # each stored spec validated once
    rows = [_row(exp, specs[exp.id], paths, noise_threshold_pct) for exp in experiments]
    baselines = _match_baselines(rows, noise_threshold_pct)
    for r in rows:
        _compare_with_baseline(r, baselines.get(_group_key(r.group)), noise_threshold_pct)
    compiled = {
        i: spec.checkpoint.activation_memory_budget
        for i, spec in specs.items()
        if spec is not None and STRATEGIES[spec.checkpoint.strategy].compiles
    }
    _against_compiled_baseline(rows, compiled, noise_threshold_pct)
    return rows


def _row(exp: Experiment, spec: ExperimentSpec | None, paths: list[str], noise_threshold_pct: float) -> SweepRow:
    """An experiment's row before its baseline is matched: its axis values, role, label and
    the figures of its summary (``spec``: its stored spec, validated; None if it no longer is)."""
    summary = exp.run_summary
    strategy = spec.checkpoint.strategy if spec is not None else exp.strategy
    # An axis the run's strategy does not read (segments of per_block) has no value here.
    values = {p: (axis_value(spec, p) if spec is not None and reads(strategy, p) else None) for p in paths}
    return SweepRow(
        experiment_id=exp.id,
        status=exp.status,
        role="baseline" if strategy == BASELINE else "run",
        values=values,
        group={p: values[p] for p in paths if not is_checkpoint_axis(p)},
        baseline_id=None,
        metrics={k: getattr(summary, k) for k in ROW_METRICS},
        gradients_match=summary.gradients_match,
        error=exp.error.splitlines()[0] if exp.error else None,
        label=axis_label(values, [p for p in paths if reads(strategy, p)]) or "base",
        strategy=strategy,
        simplicity=_simplicity(spec),
        findings=[f.code for f in summary.findings],
        peak_phase=summary.peak_phase,
        peak_explanation=summary.peak_explanation,
        step_times_ms=summary.step_times_ms,
        paired=summary.paired_rounds(),
        paired_interval=paired_overhead_of(summary, threshold_pct=noise_threshold_pct),
        loads=[summary.compared_load()],
        noise_threshold_pct=noise_threshold_pct,
    )


def _match_baselines(rows: list[SweepRow], noise_threshold_pct: float) -> dict[str, SweepRow]:
    """Each group's baseline: its first succeeded run (else its first). Later runs of it
    repeat it: their step times join the first's, and their drift against it is their
    overhead. Returns group key -> the baseline's first row."""
    groups: dict[str, list[SweepRow]] = {}
    for r in rows:
        if r.role == "baseline":
            groups.setdefault(_group_key(r.group), []).append(r)
    baselines: dict[str, SweepRow] = {}
    for key, runs in groups.items():
        first = next((b for b in runs if b.status == Status.SUCCEEDED), runs[0])
        baselines[key] = first
        own = first.step_times_ms
        for b in runs:
            if b is first:
                continue
            b.repeat_of = first.experiment_id
            b.label = f"{b.label} (again)"
            if b.status == Status.SUCCEEDED:
                first.step_times_ms = first.step_times_ms + b.step_times_ms
                first.loads = first.loads + b.loads
                drift = ratio_ci(own, b.step_times_ms, threshold_pct=noise_threshold_pct)
                drift = between_separate_runs(drift, b.loads, first.loads[:1])
                b.overhead = drift.as_dict() if drift else None
                b.overhead_text = overhead_words(drift, drift=True)
    return baselines


def _saving_pct(value: float | None, baseline: float | None) -> float | None:
    """How much lower ``value`` is than ``baseline``, %; None without both."""
    return 100.0 * (1.0 - value / baseline) if value is not None and baseline else None


def _compare_with_baseline(r: SweepRow, b: SweepRow | None, noise_threshold_pct: float) -> None:
    """Set ``r``'s baseline, its savings against it (%) and its step-time overhead with its
    95% CI: from its own paired rounds when it has them (no other run needed), else against
    all the baseline's runs (separate runs, said so). A baseline's first run has none; its
    second run's is its drift (:func:`_match_baselines`)."""
    m, bm = r.metrics, (b.metrics if b else {})
    r.baseline_id = b.experiment_id if b else None
    t, bt = m["step_time_ms"], bm.get("step_time_ms")
    m["overhead_pct"] = 100.0 * (t / bt - 1.0) if t is not None and bt else None
    m["activation_saving_pct"] = _saving_pct(m["activation_bytes"], bm.get("activation_bytes"))
    m["peak_saving_pct"] = _saving_pct(m["peak_allocated_bytes"], bm.get("peak_allocated_bytes"))
    interval = None
    paired = r.paired_overhead() if r.role == "run" else None
    if paired is not None:
        interval = paired
        r.overhead, r.overhead_text = interval.as_dict(), overhead_words(interval, paired=r.paired[2])
        m["overhead_pct"] = interval.estimate_pct
    elif r.role == "run" and b is not None:
        interval = ratio_ci(b.step_times_ms, r.step_times_ms, threshold_pct=noise_threshold_pct)
        interval = between_separate_runs(interval, r.loads, b.loads)
        r.overhead = interval.as_dict() if interval else None
        r.overhead_text = overhead_words(interval, paired=False)
        if interval:
            m["overhead_pct"] = interval.estimate_pct  # against all the baseline's runs
    m["overhead_low_pct"] = interval.low_pct if interval else None
    m["overhead_high_pct"] = interval.high_pct if interval else None


def _against_compiled_baseline(rows: list[SweepRow], compiled: Mapping[int, Any], noise_threshold_pct: float) -> None:
    """Compiled runs stored unpaired (before compiled runs were paired with the eager
    un-checkpointed copy, issue 31) have their step-time overhead taken against the same
    compiled model at ``activation_memory_budget`` 1.0 in their group (issue 21: the
    compiler's own speed-up is not the budget's cost), when the sweep has that run and it
    is unpaired too; the text says so. The 1.0 run itself keeps its comparison with the
    eager baseline; a paired compiled run keeps its paired overhead (against the eager
    step, as every plan's), and one unpaired beside a paired 1.0 (its copy did not fit) is
    compared with the eager baseline, as any unpaired run."""
    refs = {
        _group_key(r.group): r
        for r in rows
        if compiled.get(r.experiment_id) == 1.0 and r.status == Status.SUCCEEDED and r.step_times_ms
    }
    for r in rows:
        ref = refs.get(_group_key(r.group))
        if r.experiment_id not in compiled or ref is None or ref is r:
            continue
        if r.paired_overhead() is not None or ref.paired_overhead() is not None:
            continue  # a paired run keeps its paired overhead; one alone unpaired, the eager baseline
        interval = ratio_ci(ref.step_times_ms, r.step_times_ms, threshold_pct=noise_threshold_pct)
        interval = between_separate_runs(interval, r.loads, ref.loads)
        words = overhead_words(interval, paired=False)
        r.overhead = interval.as_dict() if interval else None
        r.overhead_text = f"{words} against {ref.label}" if words else None
        r.metrics["overhead_pct"] = interval.estimate_pct if interval else None
        r.metrics["overhead_low_pct"] = interval.low_pct if interval else None
        r.metrics["overhead_high_pct"] = interval.high_pct if interval else None
