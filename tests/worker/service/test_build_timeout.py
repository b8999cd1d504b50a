"""A run's time limit covers building its model (issue 33: an hf ViT spun 100 s in "building
the model"): the slot's deadline starts when the child gets the job, so a model whose
construction hangs is killed and recorded ``timed_out`` like a slow step."""

from __future__ import annotations

import sys
import time

import pytest

from ckptlab.settings import Settings
from tests.factories import make_spec
from tests.support import install_python_target

SLOW_MODEL = """
import time

from torch import nn


class Slow(nn.Module):
    def __init__(self, depth):
        super().__init__()
        time.sleep(120)  # building never ends within the run's time limit
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(depth))


def factory(depth=2):
    raise AssertionError(f"never reached: {Slow(depth)}")
"""


@pytest.fixture
def slow_target(tmp_path, monkeypatch):
    """``ckptlab_slow_model:factory``, a module on sys.path whose model sleeps in ``__init__``."""
    yield install_python_target(tmp_path, monkeypatch, module="ckptlab_slow_model", source=SLOW_MODEL)
    sys.modules.pop("ckptlab_slow_model", None)


def test_a_model_that_builds_past_the_time_limit_is_timed_out(slow_target, database_url, data_dir, db_session):
    from ckptlab.db.store import create_experiment, get_experiment
    from ckptlab.worker.service.slots import run_worker

    spec = make_spec(model={"kind": "python", "target": slow_target, "depth": 2}, timeout_s=2.0)
    exp_id = create_experiment(db_session, spec=spec).id
    settings = Settings(database_url=database_url, data_dir=data_dir, allowed_model_targets=[slow_target])
    started = time.monotonic()
    assert run_worker(database_url=database_url, exit_when_idle=True, devices=["cpu"], settings=settings) == 1
    assert time.monotonic() - started < 60  # killed at its limit, not after the 120 s build
    db_session.expire_all()
    row = get_experiment(db_session, experiment_id=exp_id)
    assert row.status == "timed_out", row.error
    assert "killed after 2 s" in row.error
