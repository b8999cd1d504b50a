"""One torch thread for the prediction tests: the real runs they compare with are tiny, and two
threads on two busy cores wait on each other at every op (docs/benchmarks.md, sweep
throughput on a loaded machine): the byte counts do not depend on it, the time does (10x)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the test, the previous count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
