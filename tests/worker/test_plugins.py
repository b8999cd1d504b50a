"""Users' own models through the ``ckptlab.models`` entry-point group."""

import sys

import pytest

from tests.factories import make_spec
from tests.support import install_model_plugin
from worker.engine import run_experiment
from worker.errors import RunError

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
    none = run_experiment(make_spec(**base))
    seq = run_experiment(make_spec(**base, **{"checkpoint.strategy": "per_block"}))
    assert none["params_without_grad"] == seq["params_without_grad"] == 0
    assert seq["gradients_match"] is True
    assert seq["recompute_peak_bytes"] > 0
    assert none["param_count"] == seq["param_count"] == (8 * 16 + 16) + 4 * (16 * 16 + 16) + (16 + 1)


def test_unknown_entry_point_is_a_clear_failure(installed_plugin):
    with pytest.raises(RunError, match="no model 'nope' in entry-point group 'ckptlab.models'.*tiny_plugin"):
        run_experiment(make_spec(model={"kind": "custom", "name": "nope", "depth": 1}))


def test_block_count_is_checked(installed_plugin):
    spec = make_spec(model={"kind": "custom", "name": installed_plugin, "depth": 5, "options": {"depth": 4}})
    with pytest.raises(RunError, match="returned 4 blocks but model.depth is 5"):
        run_experiment(spec)
