"""A sharded spec predicted as one rank over a fake process group: at world size 2 on the
CPU target its rank's figures are the measured ranks' (CPU ranks over gloo) within 2% (the
issue's bar; seen: equal to the byte in 24 of 24 runs, 12 of them under two busy loops on
this 2-core host, since the measured ranks give gloo private copies of FSDP2's buffers:
:func:`ckptlab.worker.distributed.shard.collective_categories`); at larger world sizes each
rank holds its share of the parameters and optimizer state; DDP is refused saying why."""

from __future__ import annotations

import pytest

from ckptlab.prediction.targets import CPU_TARGET, get_target
from ckptlab.worker.errors import RunError
from ckptlab.worker.predict import predict_run
from tests.factories import sharded_spec

PARAMETERS, OPTIMIZER = "parameters", "optimizer_state"


@pytest.mark.parametrize("strategy", ["none", "per_block", "auto"])
@pytest.mark.parametrize("model", ["mlp", "transformer", "hf-llama"])
def test_a_traced_rank_equals_the_measured_ranks_on_cpu(model, strategy, measured):
    spec = sharded_spec(model, strategy)
    predicted = predict_run(spec, CPU_TARGET)
    run = measured(spec)
    assert predicted.world_size == 2 and predicted.global_batch_size == 8 and len(predicted.ranks) == 1
    for rank in run.ranks:
        assert rank.peak_allocated_bytes == pytest.approx(predicted.peak_allocated_bytes, rel=0.02)
        for category in (PARAMETERS, OPTIMIZER):
            assert predicted.memory_at_forward_end[category] == rank.memory_at_forward_end[category]


def test_more_ranks_hold_a_smaller_share_each():
    figures = {}
    for world in (2, 8, 64):
        summary = predict_run(sharded_spec("hf-llama", "per_block", world_size=world), CPU_TARGET)
        figures[world] = summary.memory_at_forward_end[PARAMETERS]
        assert summary.world_size == world
    assert figures[2] > figures[8] > figures[64]
    assert figures[2] / figures[8] == pytest.approx(4, rel=0.05)  # FSDP2 pads each shard: not exactly 4
    on_h100 = predict_run(sharded_spec("hf-llama", "per_block", world_size=64), get_target("h100-80gb"))
    assert on_h100.prediction.fits is True and on_h100.ranks[0].peak_allocated_bytes == on_h100.peak_allocated_bytes


def test_ddp_is_refused_saying_why():
    with pytest.raises(RunError, match="ddp run cannot be predicted yet"):
        predict_run(sharded_spec("mlp", "per_block", kind="ddp"), CPU_TARGET)
