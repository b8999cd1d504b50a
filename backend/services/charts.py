"""Plotly figures of a sweep, built on the server (``plotly.graph_objects``).

- ``memory_vs_segments``: activation and peak bytes against ``checkpoint.segments``, one
  line per combination of the other axes, with the expected activation bytes per segment
  count computed from each baseline's own blocks (its ``block_profile``: what each block
  keeps and passes on; :func:`ckptlab.planning.chain.kept_after_forward`), after Chen et al.
  2016's segment law but without its uniform-block assumption (issue 23: for the
  transformer that law predicted no saving at 8 segments); no curve for a baseline without
  a profile, and the title says so.
- ``time_vs_segments``: step-time overhead against the matching ``none`` baseline, % (paired
  with an un-checkpointed copy in the run's own process where timed so; bars: 95% CI).
- ``pareto``: peak against that overhead for every succeeded experiment (a baseline at 0%),
  never raw step times of separate runs (issue 32); the frontier (nothing earlier in the
  recommendation's order has a lower peak) is drawn as a line.

Points of ``time_vs_segments`` and ``pareto`` carry their experiment ids (Plotly's ``ids``):
the page marks the recommendation's picks on them.
- ``correctness``: the largest gradient difference against the un-checkpointed run, per run.
- ``memory_per_rank``: a sharded sweep's peak and activations per rank (the worst rank's)
  against ``distributed.world_size`` (issue 30); empty for a sweep without that axis.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ckptlab.backend.services.recommend import order_by_overhead, rank_rows, row_overhead
from ckptlab.backend.services.sweeps import SweepRow, sweep_rows
from ckptlab.db.models import Sweep
from ckptlab.domain import Status
from ckptlab.planning.chain import BlockProfile, kept_after_forward, sequential_segments
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.sweeps import axis_label
from ckptlab.strategies import STRATEGIES
from ckptlab.summary import RunSummary

__all__ = ["CHARTS", "build_chart", "pareto_frontier"]

SEGMENTS = "checkpoint.segments"
WORLD_SIZE = "distributed.world_size"
#: The runs' validated specs by experiment id; None for a stored spec that no longer
#: validates (that run is left out of the charts that read its spec).
_Specs = Mapping[int, ExperimentSpec | None]


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better),
    ordered by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    frontier, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            frontier.append(i)
            best = points[i][1]
    return frontier


def _done(r: SweepRow) -> bool:
    return r.status == Status.SUCCEEDED


def _by_segments(name: Any) -> bool:
    """The strategy is set by its segment count (its table entry reads ``segments``)."""
    entry = STRATEGIES.get(str(name))
    return entry is not None and "segments" in entry.fields


def _block_profile(summary: Any) -> list[BlockProfile] | None:
    """The baseline's block profile (``block_profile`` of its summary), or None."""
    records = RunSummary.load(summary).block_profile
    if not records:
        return None
    return [BlockProfile(r["retained_bytes"], r["input_bytes"], 0.0, output_bytes=r["output_bytes"]) for r in records]


def _curves(rows: Sequence[SweepRow], specs: _Specs, paths: Sequence[str]) -> dict[str, list[SweepRow]]:
    """Succeeded runs of a strategy set by segments (``sequential``), grouped by the values of
    every axis but segments, each group by segment count; runs without a valid spec are left
    out."""
    other = [p for p in paths if p != SEGMENTS]
    groups: dict[str, list[SweepRow]] = defaultdict(list)
    for r in rows:
        spec = specs.get(r.experiment_id)
        if spec is not None and r.role == "run" and _done(r) and _by_segments(spec.checkpoint.strategy):
            groups[axis_label(r.values, other)].append(r)
    for members in groups.values():
        members.sort(key=lambda r: _segments(specs, r))
    return dict(groups)


def _segments(specs: _Specs, row: SweepRow) -> int:
    """The segment count of ``row``'s run (1, the field's default, without a valid spec)."""
    spec = specs.get(row.experiment_id)
    return spec.checkpoint.segments if spec is not None else 1


def _name(prefix: str, label: str) -> str:
    return f"{prefix} {label}".strip()


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "legend": {"orientation": "h", "y": -0.2},
        **extra,
    }


def _memory_vs_segments(sweep: Sweep, rows: Sequence[SweepRow], specs: _Specs) -> go.Figure:
    # Activations (with the expected curve) get their own axis above the peak: a 0.3-MiB
    # activation line on a 17-MiB peak axis would lie flat.
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    curves = _curves(rows, specs, list(sweep.axes))
    seg = {r.experiment_id: _segments(specs, r) for g in curves.values() for r in g}
    for label, members in curves.items():
        _add_measured(fig, label, members, [seg[r.experiment_id] for r in members])
    missing = _add_expected(fig, sweep, rows, curves, seg)
    _memory_layout(fig, missing)
    return fig


def _add_measured(fig: go.Figure, label: str, members: Sequence[SweepRow], x: list[int]) -> None:
    """One curve's measured lines: activation bytes (top panel) and peak bytes (bottom)
    against segment counts ``x``."""
    for prefix, metric, dash, row in (
        ("activation", "activation_bytes", "solid", 1),
        ("peak", "peak_allocated_bytes", "dot", 2),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[r.metrics[metric] for r in members],
                mode="lines+markers",
                name=_name(prefix, label),
                legendgroup=label,
                line={"dash": dash},
            ),
            row=row,
            col=1,
        )


def _add_expected(
    fig: go.Figure,
    sweep: Sweep,
    rows: Sequence[SweepRow],
    curves: Mapping[str, list[SweepRow]],
    seg: Mapping[int, int],
) -> int:
    """The expected activation curve of each succeeded baseline of the curves (top panel);
    returns how many such baselines had no block profile (no curve)."""
    summaries = {e.id: e.summary for e in sweep.experiments}
    usable = _usable_baselines(rows, curves)
    missing = 0
    for base in usable:
        profile = _block_profile(summaries.get(base.experiment_id))
        if profile is None:
            missing += 1
            continue
        top = max(seg[r.experiment_id] for g in curves.values() for r in g if r.baseline_id == base.experiment_id)
        group = axis_label(base.group)
        name = "expected" if len(usable) == 1 or not group else f"expected {group}"
        fig.add_trace(_expected_trace(base, profile, top, name), row=1, col=1)
    return missing


def _usable_baselines(rows: Sequence[SweepRow], curves: Mapping[str, list[SweepRow]]) -> list[SweepRow]:
    """The curves' baselines (by id) that succeeded and recorded activation bytes."""
    by_id = {r.experiment_id: r for r in rows}
    baselines = sorted({r.baseline_id for g in curves.values() for r in g if r.baseline_id is not None})
    return [by_id[b] for b in baselines if _done(by_id[b]) and by_id[b].metrics["activation_bytes"]]


def _expected_trace(base: SweepRow, profile: list[BlockProfile], top: int, name: str) -> go.Scatter:
    """The activation bytes expected of 1 to ``top`` segments (at most one per block) from
    the baseline's blocks: what the baseline kept beyond its blocks (stem, head, loss) stays;
    the blocks keep what the split leaves them (:func:`ckptlab.planning.chain.kept_after_forward`)."""
    ns = list(range(1, min(len(profile), max(top, 1)) + 1))
    outside = base.metrics["activation_bytes"] - sum(b.retained_bytes for b in profile)
    return go.Scatter(
        x=ns,
        y=[outside + kept_after_forward(profile, sequential_segments(len(profile), n)) for n in ns],
        mode="lines",
        name=name,
        line={"dash": "dash", "color": "grey"},
        hovertemplate="N=%{x}: %{y:.3s}B<extra>from the baseline's blocks: what each keeps and "
        "passes on (RNG states, a few KiB per checkpoint, not counted)</extra>",
    )


def _memory_layout(fig: go.Figure, missing: int) -> None:
    """Title and axes of the memory chart; the title says when a baseline had no profile."""
    caption = "" if not missing else " (no expected curve: the baseline recorded no block profile)"
    fig.update_layout(
        _layout(
            f"Activations (expected: dashed) and peak against segments{caption}",
            "checkpoint.segments",
            "activations (bytes)",
            hovermode="x unified",
        )
    )
    fig.update_yaxes(title_text="activations (bytes)", row=1, col=1)
    fig.update_yaxes(title_text="peak (bytes)", row=2, col=1)
    fig.update_xaxes(title_text="checkpoint.segments", row=2, col=1)


def _time_vs_segments(sweep: Sweep, rows: Sequence[SweepRow], specs: _Specs) -> go.Figure:
    fig = go.Figure()
    for label, members in _curves(rows, specs, list(sweep.axes)).items():
        est = [r.metrics["overhead_pct"] for r in members]
        low = [r.metrics.get("overhead_low_pct") for r in members]
        high = [r.metrics.get("overhead_high_pct") for r in members]
        has_ci = all(v is not None for v in (*est, *low, *high))
        fig.add_trace(
            go.Scatter(
                x=[_segments(specs, r) for r in members],
                y=est,
                mode="lines+markers",
                name=_name("overhead", label),
                ids=[str(r.experiment_id) for r in members],
                customdata=[r.overhead_text or "no interval" for r in members],
                hovertemplate="%{customdata}",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [h - e for h, e in zip(high, est, strict=True)],
                    "arrayminus": [e - lo for e, lo in zip(est, low, strict=True)],
                }
                if has_ci
                else None,
            )
        )
    fig.add_hline(y=0, line={"color": "grey", "width": 1})
    fig.update_layout(
        _layout(
            "Step-time overhead against the baseline (bars: 95% CI)",
            "checkpoint.segments",
            "overhead (%)",
        )
    )
    return fig


def _pareto(sweep: Sweep, rows: Sequence[SweepRow], specs: _Specs) -> go.Figure:
    """Peak against the overhead each run's table row shows (paired with an un-checkpointed
    copy where timed so; bars: 95% CI; a baseline at 0), never raw step times of separate
    runs (issue 32). The frontier is the recommendation's candidates (``rank`` set by
    :func:`ckptlab.backend.services.recommend.rank_rows`) in its order
    (:func:`ckptlab.backend.services.recommend.order_by_overhead`): a point is on it when
    nothing before it in that order has a lower peak, so the budget's pick is on it. Points
    carry their experiment ids (``ids``) for the page to mark its picks. Runs whose overhead
    is unknown or not comparable (separate runs on a busy host) are left out, and the title
    says how many."""
    metric = "peak_allocated_bytes"
    by_id = {r.experiment_id: r for r in rows}
    done = [r for r in rows if _done(r) and r.repeat_of is None and r.metrics[metric] is not None]
    overhead = {r.experiment_id: row_overhead(r, by_id) for r in done}
    pts = [r for r in done if _comparable(overhead[r.experiment_id])]
    fig = go.Figure()
    for role, name in (("baseline", "baseline"), ("run", "runs")):
        sel = [r for r in pts if r.role == role]
        if sel:
            fig.add_trace(_overhead_points(sel, overhead, name, metric))
    # The recommendation's candidates only (rank_rows: succeeded, gradients not differing),
    # in its order; drawn as markers: ranked by the CI's high end, a line through the
    # estimates could run backwards.
    front = _ranked_front(order_by_overhead([r for r in pts if r.rank is not None], rows), metric)
    fig.add_trace(
        go.Scatter(
            x=[overhead[r.experiment_id].estimate_pct for r in front],
            y=[r.metrics[metric] for r in front],
            ids=[str(r.experiment_id) for r in front],
            mode="markers",
            name="pareto frontier",
            text=[r.label for r in front],
            line={"shape": "hv"},
            marker={"symbol": "star", "size": 12},
            hovertemplate="%{text}<extra>frontier</extra>",
        )
    )
    left_out = len(done) - len(pts)
    note = f" ({left_out} left out: overhead unknown or not comparable)" if left_out else ""
    fig.update_layout(
        _layout(
            f"Peak against overhead (lower left is better){note}",
            "overhead against its baseline (%, paired; bars: 95% CI)",
            "peak allocated (bytes)",
        )
    )
    return fig


def _comparable(interval: Any) -> bool:
    """An overhead that can be drawn beside others: known, and not separate runs the host's
    load made not comparable."""
    return interval is not None and not interval.not_comparable


def _ranked_front(ordered: Sequence[SweepRow], metric: str) -> list[SweepRow]:
    """The rows of ``ordered`` (fastest first) whose ``metric`` is lower than every earlier
    row's: no row before them in the order is also smaller."""
    front, lowest = [], float("inf")
    for r in ordered:
        if r.metrics[metric] < lowest:
            front.append(r)
            lowest = r.metrics[metric]
    return front


def _overhead_points(sel: Sequence[SweepRow], overhead: Mapping[int, Any], name: str, metric: str) -> go.Scatter:
    """The runs ``sel`` at (overhead estimate %, ``metric``) with their 95% CI as bars."""
    est = [overhead[r.experiment_id].estimate_pct for r in sel]
    return go.Scatter(
        x=est,
        y=[r.metrics[metric] for r in sel],
        ids=[str(r.experiment_id) for r in sel],
        mode="markers",
        name=name,
        text=[r.label for r in sel],
        customdata=[r.overhead_text or "the baseline: no overhead" for r in sel],
        hovertemplate="%{text}<br>%{customdata}<br>peak %{y:.3s}B<extra></extra>",
        error_x={
            "type": "data",
            "symmetric": False,
            "array": [overhead[r.experiment_id].high_pct - e for r, e in zip(sel, est, strict=True)],
            "arrayminus": [e - overhead[r.experiment_id].low_pct for r, e in zip(sel, est, strict=True)],
        },
    )


def _correctness(sweep: Sweep, rows: Sequence[SweepRow], specs: _Specs) -> go.Figure:
    runs = [r for r in rows if r.role == "run" and _done(r)]
    colors = {True: "seagreen", False: "crimson", None: "grey"}
    fig = go.Figure(
        go.Bar(
            x=[r.label for r in runs],
            y=[r.metrics["grad_max_abs_diff"] for r in runs],
            name="grad_max_abs_diff",
            marker={"color": [colors[r.gradients_match] for r in runs]},
            text=[
                "not verified"
                if r.metrics["grad_max_abs_diff"] is None
                else ("match" if r.gradients_match else "differs" if r.gradients_match is False else "")
                for r in runs
            ],
            hovertemplate="%{x}: %{y:.3g}<extra>%{text}</extra>",
        )
    )
    fig.update_layout(
        _layout(
            "Gradient difference against the run without checkpointing",
            "configuration",
            "max |grad - grad without checkpointing|",
        )
    )
    return fig


def _memory_per_rank(sweep: Sweep, rows: Sequence[SweepRow], specs: _Specs) -> go.Figure:
    """Each succeeded run's peak per rank (its worst rank's) and activations against its
    world size, one pair of lines per strategy and combination of the other axes. Without a world-size
    axis the figure is empty and says so (``layout.meta.empty``: the page hides it)."""
    fig = go.Figure()
    if WORLD_SIZE not in sweep.axes:
        fig.update_layout(meta={"empty": True}, title={"text": "This sweep does not vary distributed.world_size"})
        return fig
    other = [p for p in sweep.axes if p != WORLD_SIZE]
    curves: dict[str, list[tuple[int, SweepRow]]] = defaultdict(list)
    for r in rows:
        spec = specs.get(r.experiment_id)
        if spec is not None and _done(r) and r.repeat_of is None:  # a baseline's second run: drift only
            label = f"{r.strategy} {axis_label(r.values, other)}".strip()
            curves[label].append((spec.distributed.world_size, r))
    for label, members in curves.items():
        members.sort(key=lambda m: m[0])
        for prefix, metric, dash in (
            ("peak", "peak_allocated_bytes", "solid"),
            ("activation", "activation_bytes", "dot"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=[w for w, _ in members],
                    y=[r.metrics[metric] for _, r in members],
                    mode="lines+markers",
                    name=_name(prefix, label),
                    legendgroup=label,
                    line={"dash": dash},
                    hovertemplate=f"{prefix} per rank at %{{x}} ranks: %{{y:.3s}}B<extra>{label}</extra>",
                )
            )
    fig.update_layout(
        _layout("Memory per rank against world size (the worst rank's)", "ranks (world size)", "per rank (bytes)")
    )
    fig.update_xaxes(type="log", dtick=0.30103)  # 1, 2, 4, 8, ...
    return fig


CHARTS: dict[str, Callable[[Sweep, Sequence[SweepRow], _Specs], go.Figure]] = {
    "memory_vs_segments": _memory_vs_segments,
    "time_vs_segments": _time_vs_segments,
    "pareto": _pareto,
    "correctness": _correctness,
    "memory_per_rank": _memory_per_rank,
}


def build_chart(sweep: Sweep, *, name: str) -> dict[str, Any]:
    """The figure ``name`` of ``sweep`` as a JSON-able dict with ``data`` and ``layout``.

    Only succeeded experiments are drawn; missing summary keys leave gaps, never errors.

    Args:
        sweep: the sweep, its experiments loaded.
        name: one of :data:`CHARTS`.

    Raises:
        KeyError: ``name`` is not a chart.
    """
    rows = sweep_rows(sweep)
    rank_rows(rows)  # the recommendation's candidates and order (the pareto frontier reads it)
    specs = {e.id: e.experiment_spec for e in sweep.experiments}
    fig = CHARTS[name](sweep, rows, specs)
    out = json.loads(fig.to_json(validate=False))
    return {"data": out.get("data", []), "layout": out.get("layout", {})}
