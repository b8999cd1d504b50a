"""Users' own models through the ``ckptlab.models`` entry-point group."""

import sys

import pytest

from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.errors import RunError
from tests.factories import make_spec
from tests.support import install_model_plugin, install_python_target

PLUGIN = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = blocks
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:  # a ModuleList applied in order
            x = b(x)
        return self.out(x)


def factory(depth=3, hidden=16):
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(depth))
    net = Net(blocks)

    def make_batch(batch_size, gen):
        return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 1, generator=gen)

    return net, blocks, make_batch
"""


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A distribution on sys.path whose entry point registers ``tiny_plugin``."""
    yield install_model_plugin(tmp_path, monkeypatch, name="tiny_plugin", module="ckptlab_tiny_plugin", source=PLUGIN)
    sys.modules.pop("ckptlab_tiny_plugin", None)


def test_registered_model_runs_with_checkpointing(installed_plugin):
    base = {"model": {"kind": "custom", "name": installed_plugin, "depth": 4, "options": {"depth": 4}}}
    none = run_experiment(make_spec(**base)).dump()
    seq = run_experiment(make_spec(**base, **{"checkpoint.strategy": "per_block"})).dump()
    assert none["params_without_grad"] == seq["params_without_grad"] == 0
    assert seq["gradients_match"] is True
    assert seq["recompute_peak_bytes"] > 0
    assert none["param_count"] == seq["param_count"] == (8 * 16 + 16) + 4 * (16 * 16 + 16) + (16 + 1)


def test_unknown_entry_point_is_a_clear_failure(installed_plugin):
    with pytest.raises(RunError, match="no model 'nope' in entry-point group 'ckptlab.models'.*tiny_plugin"):
        run_experiment(make_spec(model={"kind": "custom", "name": "nope", "depth": 1})).dump()


def test_block_count_is_checked(installed_plugin):
    spec = make_spec(model={"kind": "custom", "name": installed_plugin, "depth": 5, "options": {"depth": 4}})
    with pytest.raises(RunError, match="returned 4 blocks but model.depth is 5"):
        run_experiment(spec).dump()


def test_the_factory_gets_depth_unless_options_set_it(installed_plugin):
    spec = make_spec(model={"kind": "custom", "name": installed_plugin, "depth": 5})
    assert run_experiment(spec).dump()["param_count"] == (8 * 16 + 16) + 5 * (16 * 16 + 16) + (16 + 1)


def test_a_package_installed_while_the_worker_runs_is_found_without_a_restart(
    tmp_path, monkeypatch, database_url, data_dir, db_session
):
    from ckptlab.db.store import create_experiment, get_experiment
    from ckptlab.domain import FINISHED_STATUSES
    from ckptlab.settings import Settings
    from tests.support import in_process_worker, wait_for

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))  # on the path when the worker starts, still empty
    settings = Settings(database_url=database_url, data_dir=data_dir)

    def finished(exp_id):
        db_session.expire_all()
        row = get_experiment(db_session, experiment_id=exp_id)
        return row if row.status in FINISHED_STATUSES else None

    with in_process_worker(settings):
        first = create_experiment(db_session, spec=make_spec()).id
        assert wait_for(lambda: finished(first), timeout=60).status == "succeeded"  # the worker is warm
        name = install_model_plugin(site, monkeypatch, name="late_plugin", module="ckptlab_late_plugin", source=PLUGIN)
        late = create_experiment(db_session, spec=make_spec(model={"kind": "custom", "name": name, "depth": 2})).id
        row = wait_for(lambda: finished(late), timeout=60)
    sys.modules.pop("ckptlab_late_plugin", None)
    assert row.status == "succeeded", row.error


@pytest.fixture
def python_target(tmp_path, monkeypatch):
    """``ckptlab_target_model:factory``, a module on sys.path (not a distribution)."""
    yield install_python_target(tmp_path, monkeypatch, module="ckptlab_target_model", source=PLUGIN)
    sys.modules.pop("ckptlab_target_model", None)


def test_a_python_target_runs_in_ones_own_process(python_target):
    spec = make_spec(model={"kind": "python", "target": python_target, "depth": 3, "kwargs": {"hidden": 16}})
    summary = run_experiment(spec).dump()
    assert summary["param_count"] == (8 * 16 + 16) + 3 * (16 * 16 + 16) + (16 + 1)
    with pytest.raises(RunError, match="cannot be loaded"):
        run_experiment(make_spec(model={"kind": "python", "target": "ckptlab_target_model:nope", "depth": 3})).dump()


def test_a_worker_runs_only_the_python_targets_its_operator_allowed(python_target, database_url, data_dir, db_session):
    from ckptlab.db.store import create_experiment, get_experiment
    from ckptlab.settings import Settings
    from ckptlab.worker.service.slots import run_worker

    spec = make_spec(model={"kind": "python", "target": python_target, "depth": 2})
    for allowed, status in (([], "failed"), ([python_target], "succeeded")):
        exp_id = create_experiment(db_session, spec=spec).id
        settings = Settings(database_url=database_url, data_dir=data_dir, allowed_model_targets=allowed)
        assert run_worker(database_url=database_url, exit_when_idle=True, devices=["cpu"], settings=settings) == 1
        db_session.expire_all()
        row = get_experiment(db_session, experiment_id=exp_id)
        assert row.status == status, row.error
        if status == "failed":
            assert "is not allowed on this worker" in row.error
