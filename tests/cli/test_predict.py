"""``ckptlab predict SPEC.json --target NAME``: the table, the JSON on the last line, the stored
prediction, and exit code 2 with one line naming the field on bad input.

Each test runs once on a fake ``predict_run`` (:func:`fake_predictor`) and, once
``ckptlab.worker.predict.predict_run`` exists, once on the real one."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest
from sqlalchemy import inspect, select
from typer.testing import CliRunner

from ckptlab.cli.main import app
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Prediction
from ckptlab.prediction.targets import TARGETS, target_names
from ckptlab.settings import get_settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import PredictionInfo, RunSummary
from tests.factories import spec_dict

#: The fake's failure: a spec with this seed fails as an op without a fake kernel would.
FAILING_SEED = 13


def fake_predict_run(
    spec: ExperimentSpec,
    target: Any,
    *,
    capacity_bytes: int | None = None,
    model: Any = None,
    on_timeline: Any = None,
):
    """``predict_run``'s signature and result shape: bytes that grow with the spec, a verdict
    against the target's capacity (or ``capacity_bytes``). Records its calls; keeps no memory
    timeline (``on_timeline`` is never called)."""
    fake_predict_run.calls.append({"spec": spec, "target": target, "capacity_bytes": capacity_bytes, "model": model})
    if spec.seed == FAILING_SEED:
        raise RuntimeError("aten::frobnicate has no fake kernel: the prediction cannot run it\nsecond line")
    peak = spec.batch_size * 2**20
    capacity = capacity_bytes or target.capacity_bytes
    reserved = None if target.device == "cpu" else 2 * peak
    used = None if reserved is None else reserved + target.context_bytes
    info = PredictionInfo(
        target=target.name,
        method="fake",
        error_bound="exact" if target.device == "cpu" else "unverified",
        capacity_bytes=capacity,
        peak_reserved_bytes=reserved,
        device_used_bytes=used,
        fits=None if used is None else used <= capacity,
        margin_bytes=None if used is None else capacity - used,
        notes=["a fake prediction"],
    )
    return RunSummary(
        device=target.device,
        peak_allocated_bytes=peak,
        peak_phase="backward",
        memory_at_peak={"parameters": 1024, "activations": peak - 1024},
        prediction=info,
    )


fake_predict_run.calls = []


def _real_predictor() -> bool:
    try:
        from ckptlab.worker.predict import predict_run  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(params=["fake", "real"])
def predictor(request, monkeypatch) -> str:
    """Which ``predict_run`` the commands call: the fake, or the real one when it exists."""
    if request.param == "fake":
        fake = types.ModuleType("ckptlab.worker.predict")
        fake.predict_run = fake_predict_run
        fake_predict_run.calls.clear()
        monkeypatch.setitem(sys.modules, "ckptlab.worker.predict", fake)
    elif not _real_predictor():
        pytest.skip("ckptlab.worker.predict.predict_run is not there yet")
    return request.param


@pytest.fixture
def cli(monkeypatch, data_dir):
    """Invoke the CLI with its data folder (and SQLite file) under ``data_dir``."""
    monkeypatch.setenv("CKPTLAB_DATA_DIR", str(data_dir))
    monkeypatch.delenv("CKPTLAB_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, list(args))
    get_settings.cache_clear()


def stored(data_dir) -> list[Prediction]:
    db = data_dir / "ckptlab.db"
    if not db.exists():
        return []
    engine = make_engine(f"sqlite:///{db}")
    try:
        if not inspect(engine).has_table("predictions"):
            return []
        with make_sessionmaker(engine)() as session:
            return list(session.scalars(select(Prediction).order_by(Prediction.id)))
    finally:
        engine.dispose()


def write_spec(tmp_path, content: Any = None, **overrides) -> str:
    p = tmp_path / "spec.json"
    p.write_text(content if isinstance(content, str) else json.dumps(spec_dict(**overrides)))
    return str(p)


def test_predict_prints_a_table_and_stores_the_prediction(cli, predictor, tmp_path, data_dir):
    result = cli("predict", write_spec(tmp_path), "--target", "h100-80gb", "--json")
    assert result.exit_code == 0, result.output
    for words in ("peak allocated", "reserved", "device used", "capacity", "fits", "method:"):
        assert words in result.stdout
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == "succeeded" and answer["target"] == "h100-80gb" and answer["error"] is None
    assert answer["prediction"]["fits"] is True
    assert answer["prediction"]["capacity_bytes"] == TARGETS["h100-80gb"].capacity_bytes
    (row,) = stored(data_dir)
    assert (row.id, row.status, row.target, row.capacity_bytes) == (answer["id"], "succeeded", "h100-80gb", None)
    assert row.run_summary.peak_allocated_bytes == answer["peak_allocated_bytes"] > 0
    assert row.experiment_spec == ExperimentSpec.model_validate(spec_dict())
    assert row.elapsed_s is not None and row.finished_at >= row.created_at


def test_predict_on_cpu_has_no_verdict(cli, predictor, tmp_path):
    result = cli("predict", write_spec(tmp_path), "--target", "cpu", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["prediction"]["fits"] is None and answer["prediction"]["target"] == "cpu"


def test_a_capacity_too_small_does_not_fit(cli, predictor, tmp_path, data_dir):
    result = cli("predict", write_spec(tmp_path), "--target", "l4-24gb", "--capacity", "1_000_000", "--json")
    assert result.exit_code == 0, result.output
    assert "does not fit" in result.stdout
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["prediction"]["fits"] is False and answer["prediction"]["margin_bytes"] < 0
    assert answer["prediction"]["capacity_bytes"] == 1_000_000
    assert stored(data_dir)[0].capacity_bytes == 1_000_000


def test_a_failed_prediction_is_stored_and_exits_1(cli, tmp_path, data_dir, monkeypatch):
    fake = types.ModuleType("ckptlab.worker.predict")
    fake.predict_run = fake_predict_run
    monkeypatch.setitem(sys.modules, "ckptlab.worker.predict", fake)
    result = cli("predict", write_spec(tmp_path, seed=FAILING_SEED), "--target", "cpu", "--json")
    assert result.exit_code == 1
    assert "aten::frobnicate has no fake kernel" in result.stdout
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == "failed"
    assert answer["error"] == "aten::frobnicate has no fake kernel: the prediction cannot run it"
    (row,) = stored(data_dir)
    assert (row.status, row.error, row.summary) == ("failed", answer["error"], None)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--target", "tpu-v9"], "--target: unknown target 'tpu-v9'; expected one of cpu, "),
        ([], "--target: missing; expected one of " + ", ".join(target_names())),
        (["--target", "cpu", "--capacity", "0"], "--capacity: expected a whole number of bytes above 0"),
        (["--target", "cpu", "--capacity", "-8"], "--capacity: expected a whole number of bytes above 0"),
        (["--target", "cpu", "--capacity", "80GB"], "--capacity: expected a whole number of bytes above 0"),
        (["--target", "cpu", "--capacity", "1.5"], "--capacity: expected a whole number of bytes above 0"),
    ],
)
def test_bad_target_or_capacity_exits_2_with_one_line(cli, predictor, tmp_path, data_dir, args, words):
    result = cli("predict", write_spec(tmp_path), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert stored(data_dir) == []


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (json.dumps(spec_dict(**{"model.depth": 0})), "invalid spec: model.depth: "),
        (json.dumps({**spec_dict(), "bogus": 1}), "invalid spec: bogus: Extra inputs"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_a_bad_spec_exits_2_with_one_line_naming_the_field(cli, predictor, tmp_path, data_dir, content, words):
    result = cli("predict", write_spec(tmp_path, content), "--target", "cpu")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert stored(data_dir) == []


def test_the_fake_is_called_with_the_target_and_the_capacity(cli, predictor, tmp_path):
    if predictor != "fake":
        pytest.skip("checks the call the fake recorded")
    assert cli("predict", write_spec(tmp_path), "--target", "a100-40gb", "--capacity", "4096").exit_code == 0
    (call,) = fake_predict_run.calls
    assert call["target"] is TARGETS["a100-40gb"] and call["capacity_bytes"] == 4096 and call["model"] is None


def test_auto_without_a_budget_plans_for_the_targets_default(cli, predictor, tmp_path, data_dir):
    from ckptlab.prediction.budget import default_budget_bytes

    spec = write_spec(tmp_path, checkpoint={"strategy": "auto", "use_reentrant": False})
    result = cli("predict", spec, "--target", "l4-24gb", "--json")
    assert result.exit_code == 0, result.output
    (row,) = stored(data_dir)
    assert row.spec["checkpoint"]["budget_bytes"] == default_budget_bytes(TARGETS["l4-24gb"])
    refused = cli("predict", spec, "--target", "cpu")
    assert refused.exit_code == 2 and "budget_bytes" in refused.output
