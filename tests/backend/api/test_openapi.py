"""The OpenAPI document says what validation does (issue 33, item 7): every bound as JSON
Schema keywords, the sweep axes' names from the spec's fields, the live streams as
``text/event-stream``, and every 503 with its ``Retry-After``. Each body here is checked
against the document itself (``jsonschema_rs``) and, where the document refuses it, sent
to the API, which refuses it too."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from ckptlab.spec.experiment import MAX_MEMORY_LIMIT_BYTES
from ckptlab.spec.sweeps import AXIS_NAMES, axis_paths, unknown_axis_error
from tests.factories import spec_dict

BOUND_KEYS = {"ge", "gt", "le", "lt"}


def _objects(node: Any, where: str = "") -> list[tuple[str, dict]]:
    """Every JSON object of ``node`` with where it is."""
    if isinstance(node, dict):
        return [(where, node)] + [o for k, v in node.items() for o in _objects(v, f"{where}/{k}")]
    if isinstance(node, list):
        return [o for i, v in enumerate(node) for o in _objects(v, f"{where}/{i}")]
    return []


def _valid(doc: dict, component: str, body: Any) -> bool:
    """Whether the document's schema ``component`` admits ``body``."""
    return jsonschema_rs.is_valid({"$ref": f"#/components/schemas/{component}", "components": doc["components"]}, body)


def test_no_bound_is_published_as_a_key_json_schema_does_not_know(client):
    # pydantic wrote Field(None, ge=1) on an optional strict int as "ge": 1 inside the anyOf:
    # JSON Schema ignores it, so memory_limit_bytes 0 was schema-valid and answered 422.
    doc = client.get("/openapi.json").json()
    raw = [
        f"{where}: {sorted(BOUND_KEYS & set(o))}" for where, o in _objects(doc) if "type" in o and BOUND_KEYS & set(o)
    ]
    assert not raw, raw


HF = {"kind": "hf", "architecture": "gpt2"}
VISION = {"kind": "hf", "architecture": "vit"}


@pytest.mark.parametrize(
    ("route", "component", "body", "field"),
    [
        ("/api/experiments", "ExperimentCreate", spec_dict(memory_limit_bytes=0), "memory_limit_bytes"),
        ("/api/experiments", "ExperimentCreate", spec_dict(**{"checkpoint.budget_bytes": 0}), "budget_bytes"),
        ("/api/experiments", "ExperimentCreate", spec_dict(model={**HF, "seq_len": 1}), "seq_len"),
        ("/api/experiments", "ExperimentCreate", spec_dict(model={**VISION, "image_size": 8}), "image_size"),
        ("/api/experiments", "ExperimentCreate", spec_dict(memory_limit_bytes=MAX_MEMORY_LIMIT_BYTES + 1), "memory"),
        ("/api/plans", "PlanCreate", {"base": spec_dict(), "budget": 0}, "budget"),
        (
            "/api/predictions",
            "PredictionCreate",
            {"spec": spec_dict(), "target": "cpu", "capacity_bytes": 0},
            "capacity",
        ),
        (
            "/api/predictions/batch",
            "PredictionBatchCreate",
            {"spec": spec_dict(), "targets": ["cpu", "cpu"]},
            "targets",
        ),
    ],
)
def test_what_the_schema_refuses_the_api_refuses(client, route, component, body, field):
    doc = client.get("/openapi.json").json()
    assert not _valid(doc, component, body), f"the schema admits {body}"
    r = client.post(route, json=body)
    assert r.status_code == 422 and field in r.text, r.text


def test_the_bounds_themselves_are_admitted(client):
    doc = client.get("/openapi.json").json()
    assert _valid(doc, "ExperimentCreate", spec_dict(memory_limit_bytes=1, **{"checkpoint.budget_bytes": 1}))
    assert _valid(doc, "ExperimentCreate", spec_dict(model={**HF, "seq_len": 2}))
    assert _valid(doc, "PlanCreate", {"base": spec_dict(), "budget": 1})
    assert _valid(doc, "PredictionCreate", {"spec": spec_dict(), "target": "cpu", "capacity_bytes": 1})


def test_the_sweep_axes_are_named_from_the_spec(client):
    # The axes accepted any identifier in the schema; now their names are the spec's field
    # paths (ckptlab.spec.sweeps.axis_paths), or a key below a free-form field.
    doc = client.get("/openapi.json").json()
    names = doc["components"]["schemas"]["SweepCreate"]["properties"]["axes"]["propertyNames"]
    assert names["anyOf"][0]["enum"] == axis_paths()[0]
    samples = [*AXIS_NAMES, "model.depth", "model.hidden_size", "model.options.alpha", "model.kwargs.a.b"]
    samples += ["foo", "checkpoint.segmnts", "amp.level", "model.nope", "model.options", "model.depth.x"]
    wrong = [n for n in samples if jsonschema_rs.is_valid(names, n) != (unknown_axis_error(n) is None)]
    assert not wrong, wrong
    body = {"name": "s", "base": spec_dict(), "axes": {"foo": [1, 2]}}
    assert not _valid(doc, "SweepCreate", body)
    assert client.post("/api/sweeps", json=body).status_code == 422


def test_every_503_and_every_stream_is_documented(client):
    # The database-busy 503 (any route) and the stream cap's 503 were undocumented.
    doc = client.get("/openapi.json").json()
    ops = [(p, m, op) for p, item in doc["paths"].items() for m, op in item.items() if p.startswith("/api/")]
    missing = [f"{m} {p}" for p, m, op in ops if "Retry-After" not in op["responses"].get("503", {}).get("headers", {})]
    assert not missing, missing
    streams = [(p, op) for p, m, op in ops if p.endswith("/events")]
    assert len(streams) == 2
    for path, op in streams:
        assert list(op["responses"]["200"]["content"]) == ["text/event-stream"], path
        assert "max_streams" in op["responses"]["503"]["description"]
