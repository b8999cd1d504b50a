"""Model factories for the prediction tests (the ``python`` kind's contract: ``factory(depth,
...) -> (module, blocks, make_batch)``): one that runs on fake tensors, and ones whose forward
needs what fake tensors do not have (a value, a value-dependent shape)."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """``out(blocks(inp(x)))``, each block ``Linear -> Tanh``; ``probe`` runs on the hidden
    states after the stem (what the model does that a fake tensor cannot)."""

    def __init__(self, depth: int, hidden: int, probe=None):
        super().__init__()
        self.inp = nn.Linear(8, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(depth))
        self.out = nn.Linear(hidden, 1)
        self.probe = probe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        if self.probe is not None:
            x = self.probe(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _make_batch(batch_size: int, gen: torch.Generator):
    return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 1, generator=gen)


def _factory(depth: int, hidden: int, probe=None):
    net = Net(depth, hidden, probe)
    return net, net.blocks, _make_batch


def factory(depth: int = 3, hidden: int = 16):
    """A model that runs on fake tensors."""
    return _factory(depth, hidden)


def _scaled_by_item(x: torch.Tensor) -> torch.Tensor:
    return x * x.abs().max().item()  # a Python float from the data


def _listed(x: torch.Tensor) -> torch.Tensor:
    return x + len([v for v in x[0].tolist() if v > 0])


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    return x[:, : torch.nonzero(x[0] > 0).shape[0] + 1].sum(dim=1, keepdim=True).expand_as(x)


def with_item(depth: int = 3, hidden: int = 16):
    """Its forward calls ``.item()`` on the data."""
    return _factory(depth, hidden, _scaled_by_item)


def with_tolist(depth: int = 3, hidden: int = 16):
    """Its forward calls ``.tolist()`` on the data."""
    return _factory(depth, hidden, _listed)


def with_nonzero(depth: int = 3, hidden: int = 16):
    """Its forward's shapes depend on ``torch.nonzero`` of the data."""
    return _factory(depth, hidden, _nonzero)


@torch.library.custom_op("ckptlab_predict_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """A custom op with a CPU kernel and a gradient but no fake kernel."""
    return x * 2.0


twice.register_autograd(lambda ctx, grad: grad * 2.0)


def with_custom_op(depth: int = 3, hidden: int = 16):
    """Its forward calls an op that has no fake (meta) kernel."""
    return _factory(depth, hidden, twice)
