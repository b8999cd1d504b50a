"""``python -m ckptlab.worker.predict``: predictions for a JSON request on stdin, one JSON
line per target on stdout (the entry ``POST /api/predictions`` runs in a child process).

Request (one JSON object)::

    {"spec": {...an ExperimentSpec...}, "target": "h100-80gb", "capacity_bytes": null}
    {"spec": {...}, "targets": ["cpu", "h100-80gb"]}

Answer, one line per target, in the request's order: ``{"target": NAME, "status": S,
"summary": {...RunSummary.dump()...}, "timelines": [...]}`` with S
:attr:`ckptlab.domain.Status.SUCCEEDED`'s value, or ``{"target": NAME, "status": S,
"error": "one sentence"}`` with S :attr:`ckptlab.domain.Status.FAILED`'s. ``timelines``: the
memory timelines the prediction's fake memory pass kept (its first and peak steps), each a
row as :func:`ckptlab.analysis.timeline_rows.row_to_json` writes it (the blob base64); empty
for a sharded spec, with ``record_timeline`` off, or when together they are over
:data:`TIMELINE_ANSWER_BYTES` (the backend refuses longer lines).

A spec with strategy ``auto`` and no ``checkpoint.budget_bytes`` gets each target's
default budget (:func:`ckptlab.prediction.budget.default_budget_bytes`); on ``cpu``
without ``capacity_bytes`` that target fails, saying so. An unknown target fails on its
line. Exit status 0, or 2 with one line on stderr when the request itself is malformed
(not JSON, not an object, no spec or target, a spec that does not validate, a capacity
that is not a positive integer or null).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from pydantic import ValidationError

from ckptlab.analysis.timeline_rows import row_to_json, timeline_row
from ckptlab.domain import Status
from ckptlab.prediction.budget import default_budget_bytes, needs_budget
from ckptlab.prediction.targets import get_target
from ckptlab.spec.experiment import ExperimentSpec

__all__ = ["main", "parse_request", "answer", "validate_spec", "RequestError", "TIMELINE_ANSWER_BYTES"]

#: Most characters of base64 timelines one answer line carries (half the backend's line limit).
TIMELINE_ANSWER_BYTES = 8 * 2**20


class RequestError(ValueError):
    """The request is malformed (its message: one line saying what is wrong)."""


def parse_request(body: Any) -> tuple[dict[str, Any], list[str], int | None]:
    """The spec (as JSON), the target names and the capacity of a request, the spec checked.

    Raises:
        RequestError: what is malformed, in one line.
    """
    if not isinstance(body, dict):
        raise RequestError("the request must be a JSON object with 'spec' and 'target' or 'targets'")
    unknown = set(body) - {"spec", "target", "targets", "capacity_bytes"}
    if unknown:
        raise RequestError(f"unknown request fields: {', '.join(sorted(unknown))}")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise RequestError("'spec' must be a JSON object (an experiment spec)")
    targets = body.get("targets", [body["target"]] if "target" in body else None)
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise RequestError("give 'target' (a target's name) or 'targets' (a non-empty list of names)")
    capacity = body.get("capacity_bytes")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0):
        raise RequestError("'capacity_bytes' must be a positive integer or null")
    try:
        validate_spec(spec, budget_bytes=1)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        raise RequestError(f"invalid spec at {where}: {first['msg']}") from exc
    return spec, targets, capacity


def validate_spec(spec: dict[str, Any], *, budget_bytes: int | None) -> ExperimentSpec:
    """``spec`` validated, with ``budget_bytes`` as its budget when it needs one and has none.

    Raises:
        pydantic.ValidationError: it does not validate.
    """
    if needs_budget(spec) and budget_bytes is not None:
        spec = {**spec, "checkpoint": {**spec["checkpoint"], "budget_bytes": budget_bytes}}
    return ExperimentSpec.model_validate(spec)


def answer(spec: dict[str, Any], name: str, capacity_bytes: int | None) -> dict[str, Any]:
    """One target's answer line (see the module docstring); never raises."""
    from ckptlab.worker.predict.run import predict_run

    try:
        target = get_target(name)
        budget = default_budget_bytes(target, capacity_bytes)
        if needs_budget(spec) and budget is None:
            raise ValueError(
                f"strategy auto on {name} needs checkpoint.budget_bytes or capacity_bytes (the target has no capacity)"
            )
        rows: list[dict[str, Any]] = []
        summary = predict_run(
            validate_spec(spec, budget_bytes=budget),
            target,
            capacity_bytes=capacity_bytes,
            on_timeline=lambda tl, is_peak: rows.append(row_to_json(timeline_row(tl, is_peak))),
        )
    except Exception as exc:  # noqa: BLE001 - every failure is this target's answer
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {"target": name, "status": Status.FAILED.value, "error": text}
    if sum(len(r["data"]) for r in rows) > TIMELINE_ANSWER_BYTES:
        rows = []  # the prediction stands without its timelines
    return {"target": name, "status": Status.SUCCEEDED.value, "summary": summary.dump(), "timelines": rows}


def main(stdin: TextIO | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Read the request, write one line per target; returns the exit status (0, or 2 for a
    malformed request)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    try:
        spec, targets, capacity = parse_request(json.loads(stdin.read()))
    except json.JSONDecodeError as exc:
        print(f"the request is not JSON: {exc}", file=stderr)
        return 2
    except RequestError as exc:
        print(str(exc), file=stderr)
        return 2
    for name in targets:
        stdout.write(json.dumps(answer(spec, name, capacity)) + "\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
