"""CSV and JSON exports: flat rows from experiments, steps and sweep results."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from fastapi.responses import StreamingResponse

from ckptlab.analysis.stats import SEPARATE_RUNS
from ckptlab.backend.encoding import utf8_safe
from ckptlab.backend.services.queries import STEP_COLUMNS, StepRow
from ckptlab.backend.services.sweeps import ROW_METRICS, SweepRow
from ckptlab.db.models import Experiment

__all__ = [
    "CSV_MEDIA_TYPE",
    "EXPERIMENT_COLUMNS",
    "flatten",
    "experiment_record",
    "csv_response",
    "step_csv_rows",
    "sweep_result_record",
    "RAW_MS_METRICS",
    "raw_ms_column",
]

CSV_MEDIA_TYPE = "text/csv; charset=utf-8"
#: Leading columns of an experiment export; flattened ``spec.*`` and ``summary.*`` follow.
EXPERIMENT_COLUMNS = (
    "id",
    "status",
    "sweep_id",
    "model_kind",
    "strategy",
    "attempt",
    "created_at",
    "started_at",
    "finished_at",
    "worker_id",
    "error",
    "corrupt",
)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, (list, dict)):
        value = json.dumps(value, separators=(",", ":"), default=str)
    if isinstance(value, str):
        value = utf8_safe(value)  # a stored lone surrogate is written escaped, not a 500
        if value[:1] in _FORMULA_START:
            return "'" + value  # a spreadsheet would run it as a formula (OWASP CSV injection)
    return value


def flatten(data: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Nested dicts as one level with dotted keys (``spec.model.depth``); lists stay values.

    Args:
        data: the nested mapping.
        prefix: put before every key (``spec`` -> ``spec.model.depth``).
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def experiment_record(exp: Experiment) -> dict[str, Any]:
    """One experiment as a flat record: :data:`EXPERIMENT_COLUMNS`, then ``spec.*`` and
    ``summary.*`` (the error reduced to its first line; ``corrupt``: what of the stored row
    failed to read, empty when nothing did)."""
    rec = {c: getattr(exp, c) for c in EXPERIMENT_COLUMNS}
    rec["error"] = exp.error.splitlines()[0] if exp.error else None
    rec["corrupt"] = exp.corrupt.reason if exp.corrupt else None
    rec.update(flatten(exp.spec or {}, "spec"))
    rec.update(flatten(exp.run_summary.dump(), "summary"))
    return rec


#: Metrics in milliseconds that are one run's own (its medians): exported under a name
#: that says so (:func:`raw_ms_column`), never as a bare figure beside a comparison.
RAW_MS_METRICS = ("step_time_ms", "forward_ms", "backward_ms", "optimizer_ms")


def raw_ms_column(metric: str) -> str:
    """The export column of a run's own millisecond figure ``metric``:
    ``"step_time_ms (separate runs, not comparable on a busy host)"``
    (:data:`ckptlab.analysis.stats.SEPARATE_RUNS`)."""
    return f"{metric} ({SEPARATE_RUNS})"


def sweep_result_record(row: SweepRow) -> dict[str, Any]:
    """One sweep result row as a flat record: ids, role, axis values, its ``rank`` by
    overhead (:func:`ckptlab.backend.services.recommend.rank_rows`; empty for a row that is
    no candidate), metrics, the overhead against its baseline (%, with its 95% CI, and in
    words: paired where it was). The run's own millisecond medians (:data:`RAW_MS_METRICS`)
    are in columns labelled as separate runs (:func:`raw_ms_column`)."""
    return {
        "experiment_id": row.experiment_id,
        "status": row.status,
        "role": row.role,
        "label": row.label,
        "baseline_id": row.baseline_id,
        **row.values,
        "rank": row.rank,
        **{
            (raw_ms_column(k) if k in RAW_MS_METRICS else k): row.metrics.get(k)
            for k in (
                *ROW_METRICS,
                "overhead_pct",
                "overhead_low_pct",
                "overhead_high_pct",
                "activation_saving_pct",
                "peak_saving_pct",
            )
        },
        "overhead": row.overhead_text,
        "findings": " ".join(row.findings),
        "gradients_match": row.gradients_match,
        "error": row.error,
    }


def step_csv_rows(rows: Iterable[StepRow]) -> Iterator[dict[str, Any]]:
    """Step rows as records with the columns of :data:`ckptlab.backend.services.queries.STEP_COLUMNS`."""
    for r in rows:
        yield {"attempt": r.attempt, **r.data}


def _columns(records: Sequence[Mapping[str, Any]], leading: Sequence[str]) -> list[str]:
    cols = list(leading)
    seen = set(cols)
    for rec in records:
        for k in rec:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return cols


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:100] or "export"


def csv_response(
    records: Iterable[Mapping[str, Any]], *, filename: str, columns: Sequence[str] | None = None
) -> StreamingResponse:
    """A ``text/csv`` download (``Content-Disposition: attachment``) of ``records``.

    Args:
        records: flat mappings; with ``columns`` given they are streamed (a million steps
            never sit in memory), else gathered to find the union of their keys.
        filename: the suggested file name (unsafe characters replaced).
        columns: the header, in order (default: every key in order of first appearance).
    """
    if columns is None:
        records = list(records)
        columns = _columns(records, ())

    def generate() -> Iterator[str]:
        buf = io.StringIO()
        # CRLF rows (RFC 4180): with both characters in the line terminator, the csv module
        # quotes every cell that holds a CR or an LF, so no value can split a row.
        writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\r\n")
        writer.writeheader()
        for n, rec in enumerate(records, 1):
            writer.writerow({k: _cell(v) for k, v in rec.items()})
            if n % 2000 == 0:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        yield buf.getvalue()

    return StreamingResponse(
        generate(),
        media_type=CSV_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{_safe_filename(filename)}"'},
    )


STEP_EXPORT_COLUMNS = ("attempt", *STEP_COLUMNS)
