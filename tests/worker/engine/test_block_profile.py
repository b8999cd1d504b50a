"""The block recorder (worker/engine/block_profile.py) reads what each block of a chain costs in
one step: identical blocks read identical costs, whichever hook sees the gradient first."""

from __future__ import annotations

import torch

from ckptlab.planning.planner import BlockProfile
from ckptlab.worker.engine.block_profile import BlockRecorder
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.training import build_checkpointed
from ckptlab.worker.measure.meter import Meter
from tests.factories import make_spec


def record(recompute: bool = False, **overrides) -> list[BlockProfile]:
    """One un-checkpointed step of ``make_spec(**overrides)`` on CPU, every block recorded
    (``recompute``: with :class:`BlockRecorder`'s ``recompute``)."""
    spec = make_spec(**overrides)
    dev = torch.device("cpu")
    meter = Meter(dev, None)
    with meter.mode():
        built = build_checkpointed(spec, dev)
        x, y = built.make_batch(spec.batch_size, torch.Generator().manual_seed(0))
        with BlockRecorder(built.blocks, meter, recompute=recompute) as recorder:
            loss = built.loss_fn(built.module(x), y)
            recorder.stop_forward()
            loss.backward()
            recorder.finish_backward()
    return recorder.profiles()


def test_identical_blocks_read_the_same_backward_bytes():
    # Each block's input is the previous block's output: the gradient of that one tensor
    # ends one block's backward and starts the next one's. Read in two hooks, the second
    # saw the window the first had just reset, and every block but the first read 0.
    blocks = record(**{"model.depth": 4, "model.width": 64, "batch_size": 32})
    first = blocks[0].backward_bytes
    assert first >= 32 * 64 * 4  # at least the gradient it passes on
    assert [b.backward_bytes for b in blocks] == [first] * 4


def test_an_output_only_the_next_block_saved_is_released_before_its_own_backward():
    # With dropout, a block's output is the dropout's, which only the next Linear saves:
    # freed when the next block's backward is over, before this block's begins. Without
    # dropout the output is the ReLU's, which the ReLU saves for its own backward.
    shape = {"model.depth": 4, "model.width": 64, "batch_size": 32}
    out = 32 * 64 * 4
    assert [b.released_bytes for b in record(**shape, **{"model.dropout": 0.5})] == [out] * 4
    assert [b.released_bytes for b in record(**shape)] == [0] * 4


def test_a_blocks_recomputation_is_read_up_to_its_last_saved_tensor():
    # Linear -> ReLU -> dropout: the dropout's mask is the last tensor the block saves; its
    # output (input x mask), which only the next block saves, is never recomputed by a
    # checkpoint that stops early. Up to the mask the block held the Linear's output and
    # the ReLU's, or the ReLU's and the mask: 2 of the 3 tensors it keeps (issue 31).
    shape = {"model.depth": 4, "model.width": 64, "batch_size": 32, "model.dropout": 0.5}
    tensor = 32 * 64 * 4
    blocks = record(recompute=True, **shape)
    assert [b.retained_bytes for b in blocks] == [3 * tensor] * 4
    assert [b.recompute_bytes for b in blocks] == [2 * tensor] * 4
    assert [b.recompute_bytes for b in record(**shape)] == [None] * 4  # not asked: not read
    # what per_block's recomputations measure hold
    per_block = run_experiment(make_spec(**shape, **{"checkpoint.strategy": "per_block"})).dump()
    assert per_block["recompute_peak_bytes"] == 2 * tensor
