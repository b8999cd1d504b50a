"""Fixtures of the engine's tests: model plugins whose memory grows every step, or jumps at chosen steps."""

from __future__ import annotations

import sys

import pytest

from tests.support import install_model_plugin

#: A model that keeps every forward's output in a list: live memory grows by one output per
#: step (a running ``total_loss += loss`` does not: backward frees what its graph saved).
LEAKY = """
import torch
from torch import nn


class Leaky(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.blocks = blocks
        self.out = nn.Linear(32, 1)
        self.kept = []

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        self.kept.append(x)
        return self.out(x)


def factory(depth=2):
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(depth))

    def make_batch(batch_size, gen):
        return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 1, generator=gen)

    return Leaky(blocks), blocks, make_batch
"""


@pytest.fixture
def leaky_model(tmp_path, monkeypatch):
    yield install_model_plugin(tmp_path, monkeypatch, name="leaky", module="ckptlab_leaky_plugin", source=LEAKY)
    sys.modules.pop("ckptlab_leaky_plugin", None)


#: A model whose forwards numbered in ``high`` ("3,5"; default: the fifth) hold 4 MiB more for a
#: moment: a peak only late steps reach.
LATE_PEAK = """
import torch
from torch import nn


class LatePeak(nn.Module):
    def __init__(self, blocks, high):
        super().__init__()
        self.blocks, self.calls, self.high = blocks, 0, {int(c) for c in high.split(",")}

    def forward(self, x):
        self.calls += 1
        if self.calls in self.high:
            x = x + torch.ones(1024, 1024).sum() * 0
        for b in self.blocks:
            x = b(x)
        return x


def factory(depth=2, high="5"):
    blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(depth))
    batch = lambda n, gen: (torch.randn(n, 16, generator=gen), torch.randn(n, 16, generator=gen))  # noqa: E731
    return LatePeak(blocks, high), blocks, batch
"""


@pytest.fixture
def late_peak_model(tmp_path, monkeypatch):
    yield install_model_plugin(tmp_path, monkeypatch, name="late-peak", module="ckptlab_late_peak", source=LATE_PEAK)
    sys.modules.pop("ckptlab_late_peak", None)
