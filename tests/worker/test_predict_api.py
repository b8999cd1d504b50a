"""``ckptlab.predict``: a spec, a spec dict or a model in hand predicted for a target, stored,
and returned typed; bad input is a ValueError before anything is stored.

Each test runs on a fake ``predict_run`` (:func:`tests.cli.test_predict.fake_predict_run`)
and, once ``ckptlab.worker.predict.predict_run`` exists, the ones that do not inspect the
fake's calls run on the real one too."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
from torch import nn

import ckptlab
from ckptlab.db import store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.prediction.targets import TARGETS
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary
from ckptlab.worker.predict_api import PredictionResult
from tests.cli.test_predict import FAILING_SEED, _real_predictor, fake_predict_run
from tests.factories import make_spec, spec_dict


class Net(nn.Module):
    """Four linear blocks and a head: what a user's own model looks like."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(4)])
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.blocks(x))


@pytest.fixture
def fake(monkeypatch):
    """The fake ``predict_run`` in place of ``ckptlab.worker.predict``; yields its calls."""
    module = types.ModuleType("ckptlab.worker.predict")
    module.predict_run = fake_predict_run
    fake_predict_run.calls.clear()
    monkeypatch.setitem(sys.modules, "ckptlab.worker.predict", module)
    return fake_predict_run.calls


@pytest.fixture(params=["fake", "real"])
def predictor(request) -> str:
    """The fake, or the real ``predict_run`` when it exists."""
    if request.param == "fake":
        request.getfixturevalue("fake")
    elif not _real_predictor():
        pytest.skip("ckptlab.worker.predict.predict_run is not there yet")
    return request.param


def _stored(url: str):
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session:
            return store.list_predictions(session, limit=None)[0]
    finally:
        engine.dispose()


def test_predict_is_the_lazy_public_api():
    assert "predict" in ckptlab.__all__
    from ckptlab.worker.predict_api import predict

    assert ckptlab.predict is predict
    code = "import sys, ckptlab; assert 'torch' not in sys.modules and 'fastapi' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_spec_dict_is_predicted_stored_and_returned_typed(predictor, database_url):
    result = ckptlab.predict(spec_dict(), target="h100-80gb", database_url=database_url)
    assert isinstance(result, PredictionResult) and isinstance(result, RunSummary)
    assert (result.status, result.error, result.target) == ("succeeded", None, "h100-80gb")
    assert result.prediction.fits is True and result.peak_allocated_bytes > 0
    assert result.database_url == database_url
    (row,) = _stored(database_url)
    assert row.id == result.id and row.status == "succeeded" and row.target == "h100-80gb"
    assert row.run_summary.prediction == result.prediction
    assert row.experiment_spec == make_spec()


def test_spec_fields_are_set_over_the_spec(fake, database_url):
    result = ckptlab.predict(
        make_spec(),
        target="a100-80gb",
        capacity_bytes=2**20,
        database_url=database_url,
        batch_size=4,
        optimizer="sgd",
        strategy="per_block",
        every=2,
    )
    (call,) = fake
    spec = call["spec"]
    assert (spec.batch_size, spec.optimizer, spec.checkpoint.strategy, spec.checkpoint.every) == (
        4,
        "sgd",
        "per_block",
        2,
    )
    assert call["target"] is TARGETS["a100-80gb"] and call["capacity_bytes"] == 2**20 and call["model"] is None
    assert result.prediction.capacity_bytes == 2**20 and result.prediction.fits is False
    assert _stored(database_url)[0].capacity_bytes == 2**20


def test_a_model_in_hand_is_prepared_like_profile_and_handed_over(fake, database_url):
    x, y = torch.randn(6, 32), torch.randint(0, 5, (6,))
    result = ckptlab.predict(Net(), (x, y), target="l4-24gb", database_url=database_url, amp="bf16")
    (call,) = fake
    spec = call["spec"]
    assert spec.model.kind == "python" and spec.model.target == f"{__name__}:Net" and spec.model.depth == 4
    assert (spec.batch_size, spec.device, spec.amp) == (6, "cuda", "bf16")
    assert call["model"] is not None and hasattr(call["model"], "blocks")  # the engine's Built
    assert result.model.startswith("Net") and "blocks" in result.blocks
    assert _stored(database_url)[0].run_summary.blocks == result.blocks


def test_a_model_in_hand_on_the_real_predictor(predictor, database_url):
    x, y = torch.randn(6, 32), torch.randint(0, 5, (6,))
    result = ckptlab.predict(Net(), (x, y), target="cpu", database_url=database_url, strategy="per_block")
    assert result.status == "succeeded", result.error
    assert result.peak_allocated_bytes > 0 and result.prediction.target == "cpu"


def test_a_failed_prediction_is_stored_and_returned(fake, database_url):
    result = ckptlab.predict(spec_dict(seed=FAILING_SEED), database_url=database_url)
    assert (result.status, result.error) == (
        "failed",
        "aten::frobnicate has no fake kernel: the prediction cannot run it",
    )
    assert result.peak_allocated_bytes is None
    (row,) = _stored(database_url)
    assert (row.status, row.error, row.summary) == ("failed", result.error, None)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        ((spec_dict(),), {"target": "tpu-v9"}, ValueError, "unknown target 'tpu-v9'; expected one of cpu"),
        ((spec_dict(),), {"capacity_bytes": 0}, ValueError, "capacity_bytes: must be above 0"),
        ((spec_dict(),), {"capacity_bytes": True}, ValueError, "capacity_bytes: expected a whole number"),
        ((spec_dict(),), {"capacity_bytes": 1.5}, ValueError, "capacity_bytes: expected a whole number"),
        ((spec_dict(**{"model.depth": 0}),), {}, ValueError, "model.depth"),
        ((spec_dict(),), {"bogus": 1}, ValueError, "bogus"),
        ((spec_dict(), torch.zeros(2)), {}, ValueError, "sample, blocks and loss_fn are for an nn.Module"),
        ((Net(),), {}, ValueError, "sample: a module is predicted on one micro-batch"),
        (("spec.json",), {}, TypeError, "expected an ExperimentSpec, a spec dict or an nn.Module, got str"),
    ],
)
def test_bad_input_raises_before_anything_is_stored(fake, database_url, args, kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(".", r"\.")):
        ckptlab.predict(*args, database_url=database_url, **kwargs)
    assert fake == [] and _stored(database_url) == []


def test_the_spec_given_is_not_changed(fake, database_url):
    spec = make_spec()
    ckptlab.predict(spec, database_url=database_url, batch_size=2)
    assert spec == ExperimentSpec.model_validate(spec_dict())
