"""Sharded runs on CPU ranks (gloo): FSDP2 and DDP at world size 2 succeed under none,
per_block and auto on an MLP, the built-in transformer and a small hf llama; each rank holds
its share of the parameters; the gradients equal one process's on the same global batch; a
4-rank run works on this 2-core host; a rank killed with SIGKILL ends the run saying so and
leaves no rank behind."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest

from ckptlab.domain import MemoryCategory
from ckptlab.worker.distributed import run_distributed
from ckptlab.worker.distributed.launch import RANK_MODULE
from ckptlab.worker.errors import RunError
from tests.factories import SHARDED_MODELS, sharded_spec

PARAMETERS = MemoryCategory.PARAMETERS.value
MODELS = list(SHARDED_MODELS)


def _rank_pids() -> list[int]:
    """This process's rank children (``python -m ckptlab.worker.distributed.rank``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and RANK_MODULE.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("strategy", ["none", "per_block", "auto"])
@pytest.mark.parametrize("model", MODELS)
def test_fsdp2_on_two_cpu_ranks_shards_the_parameters_and_keeps_the_gradients(model, strategy, measured):
    summary = measured(sharded_spec(model, strategy))
    assert summary.world_size == 2 and summary.global_batch_size == 8 and len(summary.ranks) == 2
    worst = max(summary.ranks, key=lambda r: r.peak_allocated_bytes)
    assert summary.peak_allocated_bytes == worst.peak_allocated_bytes and summary.worst_rank == worst.rank
    share = math.ceil(summary.param_count / 2) * 4  # fp32 bytes of half the parameters
    for rank in summary.ranks:
        held = rank.memory_at_forward_end[PARAMETERS]
        assert abs(held - share) <= 0.01 * share, (rank.rank, held, share)
        assert rank.memory_at_peak[MemoryCategory.UNSHARDED_PARAMETERS.value] >= 0
    check = summary.sharded_gradients
    assert check is not None and check.match, check
    assert check.worst_rel_error <= check.tolerance and check.params_compared > 0


@pytest.mark.parametrize("model", MODELS)
def test_ddp_on_two_cpu_ranks_keeps_the_gradients(model, measured):
    summary = measured(sharded_spec(model, "per_block", kind="ddp"))
    assert summary.sharded_gradients.match, summary.sharded_gradients
    for rank in summary.ranks:  # every rank holds the whole model; its buckets are communication
        assert rank.memory_at_forward_end[PARAMETERS] >= summary.param_count * 4
        assert rank.memory_at_forward_end[MemoryCategory.COMMUNICATION.value] > 0


def test_rank_0_streams_its_steps():
    steps = []
    run_distributed(sharded_spec("mlp", "per_block"), on_step=steps.append)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]  # 3 memory steps, 2 timed


def test_four_fsdp2_ranks_run_on_a_two_core_host(measured):
    summary = measured(sharded_spec("mlp", "per_block", world_size=4))
    assert [r.rank for r in summary.ranks] == [0, 1, 2, 3] and summary.global_batch_size == 16
    assert summary.sharded_gradients.match
    share = math.ceil(summary.param_count / 4) * 4
    assert all(abs(r.memory_at_forward_end[PARAMETERS] - share) <= 0.01 * share for r in summary.ranks)


def test_more_ranks_hold_fewer_bytes_each(measured):
    two = measured(sharded_spec("mlp", "per_block"))
    four = measured(sharded_spec("mlp", "per_block", world_size=4))
    assert four.peak_allocated_bytes < two.peak_allocated_bytes


def test_a_killed_rank_ends_the_run_naming_it_and_no_rank_is_left():
    killed = []

    def kill_rank_1(record):
        if not killed:
            pids = sorted(_rank_pids())
            os.kill(pids[1], signal.SIGKILL)
            killed.append(pids)

    spec = sharded_spec("mlp", "per_block").model_copy(update={"steps": 50, "memory_early_stop": False})
    with pytest.raises(RunError, match=r"rank 1 exited \(signal 9\)"):
        run_distributed(spec, on_step=kill_rank_1)
    deadline = time.monotonic() + 10
    while _rank_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _rank_pids() == []


def test_a_rank_that_fails_ends_the_run_with_its_error():
    spec = sharded_spec("mlp", "none").model_copy(update={"memory_limit_bytes": 1024})
    with pytest.raises(RunError, match=r"^rank \d: out of memory"):
        run_distributed(spec)


def test_units_inside_the_checkpointed_blocks_run_and_the_audit_names_them(measured):
    summary = measured(sharded_spec("hf-llama", "per_block", shard_unit="block_children"))
    assert summary.sharded_gradients.match
    assert "fsdp_inside_block" in [f.code for f in summary.findings]
    torchtitan = measured(sharded_spec("hf-llama", "per_block"))
    assert not [f for f in torchtitan.findings if f.code == "fsdp_inside_block"]


def test_ddp_with_reentrant_checkpointing_and_find_unused_parameters_fails_saying_why(measured):
    """The seed pitfall (pytorch/pytorch#24005), reproduced on CPU ranks; the same run with
    non-reentrant checkpointing succeeds with the gradients of one process."""
    spec = sharded_spec("mlp", "per_block", kind="ddp", find_unused_parameters=True)
    reentrant = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"use_reentrant": True})})
    with pytest.raises(
        RunError, match=r"^rank \d: DDP marked a parameter ready twice: reentrant .*#24005.*use_reentrant false"
    ):
        run_distributed(reentrant)
    assert measured(spec).sharded_gradients.match


class _Exited:
    """A rank process that has ended with ``returncode`` (``Popen``'s: -N for signal N)."""

    def __init__(self, returncode: int | None):
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


def test_a_killed_rank_is_named_before_the_peer_that_aborted_after_it():
    # rank 1 killed (kill -9); rank 0 then aborted in its collective (SIGABRT): the run was
    # lost to rank 1's kill, not failed by rank 0's crash (seen in CI as "rank 0 exited (signal 6)")
    from ckptlab.worker.distributed.launch import _raise_dead
    from ckptlab.worker.errors import RankLost

    with pytest.raises(RankLost, match=r"^rank 1 exited \(signal 9\) without a summary"):
        _raise_dead([_Exited(-signal.SIGABRT), _Exited(-signal.SIGKILL)], {})
    with pytest.raises(RunError, match=r"^rank 0 exited \(signal 6\)") as crashed:  # a crash alone fails the run
        _raise_dead([_Exited(-signal.SIGABRT), _Exited(None)], {})
    assert not isinstance(crashed.value, RankLost)
    _raise_dead([_Exited(None), _Exited(0)], {})  # none dead by a signal: nothing raised
