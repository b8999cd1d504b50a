"""A sharded spec predicted as one rank over a fake process group: at world size 2 on the
CPU target its rank's figures are the measured ranks' (CPU ranks over gloo); at larger world
sizes each rank holds its share of the parameters and optimizer state; DDP is refused
saying why.

The prediction is the run as if every collective completed at once. gloo completes them on
its own threads, and a buffer its work holds (a unit's reduce-scatter input) is freed when
that thread lets go of it, sometimes after the next allocations: the measured peak is then
higher, by a different amount from run to run. Seen on this 2-core host: equal to the byte
in most runs; +3.0% (7,296 B, the MLP under none) and +8.7% (50,816 B, the built-in
transformer under per_block, in one run of the whole suite). So the test asserts what
holds every time: the parameters and optimizer state each rank holds are equal to the
byte, and the measured peak is at or above the prediction and at most 10% above it."""

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
    for rank in run.ranks:  # see the module docstring
        assert predicted.peak_allocated_bytes <= rank.peak_allocated_bytes <= 1.10 * predicted.peak_allocated_bytes
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
