"""``python -m ckptlab.worker.predict``: a JSON request on stdin, one JSON line per target on
stdout; exit 2 with one line on stderr when the request itself is malformed."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from ckptlab.prediction.targets import get_target
from ckptlab.summary import RunSummary
from ckptlab.worker.predict import default_budget_bytes
from ckptlab.worker.predict.__main__ import main
from tests.factories import spec_dict

SPEC = spec_dict(model={"kind": "mlp", "depth": 2, "width": 16}, batch_size=4, steps=2)


def call(body) -> tuple[int, list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    text = body if isinstance(body, str) else json.dumps(body)
    code = main(io.StringIO(text), out, err)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_one_line_per_target_in_order():
    code, lines, err = call({"spec": SPEC, "targets": ["h100-80gb", "cpu", "no-such-card"], "capacity_bytes": None})
    assert code == 0 and err == ""
    assert [(x["target"], x["status"]) for x in lines] == [
        ("h100-80gb", "succeeded"),
        ("cpu", "succeeded"),
        ("no-such-card", "failed"),
    ]
    summary = RunSummary.load(lines[0]["summary"])
    assert summary.prediction.target == "h100-80gb" and summary.prediction.fits is True
    assert "unknown target 'no-such-card'" in lines[2]["error"] and "\n" not in lines[2]["error"]


def test_capacity_and_a_single_target():
    code, lines, _ = call({"spec": SPEC, "target": "h100-80gb", "capacity_bytes": 1024})
    assert code == 0 and len(lines) == 1
    prediction = lines[0]["summary"]["prediction"]
    assert prediction["capacity_bytes"] == 1024 and prediction["fits"] is False


def test_auto_without_a_budget_gets_the_targets_default_and_fails_on_cpu():
    body = {**SPEC, "checkpoint": {**SPEC["checkpoint"], "strategy": "auto"}}
    code, lines, _ = call({"spec": body, "targets": ["h100-80gb", "cpu"]})
    assert code == 0
    assert lines[0]["summary"]["budget_bytes"] == default_budget_bytes(get_target("h100-80gb"))
    assert lines[1]["status"] == "failed" and "needs checkpoint.budget_bytes or capacity_bytes" in lines[1]["error"]


def test_a_failure_is_one_sentence_on_its_line():
    body = {**SPEC, "checkpoint": {**SPEC["checkpoint"], "strategy": "compile_budget"}}
    code, lines, _ = call({"spec": body, "target": "cpu"})
    assert code == 0 and lines[0]["status"] == "failed" and "torch.compile" in lines[0]["error"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "not JSON"),
        ([1, 2], "must be a JSON object"),
        ({"target": "cpu"}, "'spec' must be a JSON object"),
        ({"spec": SPEC}, "give 'target'"),
        ({"spec": SPEC, "targets": []}, "give 'target'"),
        ({"spec": SPEC, "target": "cpu", "capacity_bytes": -1}, "'capacity_bytes' must be a positive integer"),
        ({"spec": SPEC, "target": "cpu", "extra": 1}, "unknown request fields: extra"),
        ({"spec": {**SPEC, "batch_size": 0}, "target": "cpu"}, "invalid spec at batch_size"),
    ],
)
def test_a_malformed_request_exits_2_with_one_line(body, says):
    code, lines, err = call(body)
    assert code == 2 and lines == [] and says in err and err.count("\n") == 1


def test_the_module_runs_as_a_program():
    done = subprocess.run(
        [sys.executable, "-m", "ckptlab.worker.predict"],
        input=json.dumps({"spec": SPEC, "target": "cpu"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["status"] == "succeeded"
    bad = subprocess.run([sys.executable, "-m", "ckptlab.worker.predict"], input="[]", capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
