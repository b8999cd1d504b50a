"""The memory timeline of a run (issue 34, items 1 and 2): for the built-in transformer and
hf llama under none, per_block and selective, the kept peak step's timeline reaches the
summary's peak to the byte, who holds that peak sums to it, at least 95% of it is named
after a module, recomputation appears only where something is checkpointed; recording
changes no reading, and nothing of it runs in the timing pass."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from ckptlab.analysis.timeline import RECOMPUTED, RESIDENT, SAVED, UNKNOWN, StepTimeline, peak_holders
from ckptlab.domain import MemoryCategory, Unattributed
from ckptlab.settings import get_settings
from ckptlab.summary import RunSummary
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.timeline import module_names
from ckptlab.worker.engine.training import build_checkpointed
from tests.factories import SHARDED_MODELS, make_spec
from tests.support import install_model_plugin

CHECKPOINTS = {
    "none": {"strategy": "none"},
    "per_block": {"strategy": "per_block"},
    "selective": {"strategy": "selective", "policy": "save_matmuls"},
}


def _run(model: str, checkpoint: str, **spec) -> tuple[RunSummary, list[tuple[StepTimeline, bool]]]:
    kept: list[tuple[StepTimeline, bool]] = []
    spec = make_spec(
        model=SHARDED_MODELS[model],
        verify_gradients=False,
        checkpoint={**CHECKPOINTS[checkpoint], "use_reentrant": False},
        **{"steps": 3, **spec},
    )
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    return summary, kept


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
@pytest.mark.parametrize("model", ["transformer", "hf-llama"])
def test_the_peak_steps_timeline_is_the_summarys_peak_to_the_byte_and_named(model, checkpoint):
    summary, kept = _run(model, checkpoint)
    assert [tl.step for tl, _ in kept][0] == 1, "the first step is kept"
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    peak, index = peak_tl.peak()
    assert peak == summary.peak_allocated_bytes
    assert int(peak_tl.live_bytes.max()) == summary.peak_allocated_bytes
    assert index >= 0 and peak_tl.phase_at(index) == summary.peak_phase

    holders = peak_holders(peak_tl)
    assert holders.peak_bytes == peak
    assert sum(h.bytes for h in holders.holders) == peak  # exactly, by construction
    assert sum(holders.by_category.values()) == peak
    named = sum(h.bytes for h in holders.holders if h.module != UNKNOWN)
    assert named == holders.named_bytes and named >= 0.95 * peak, holders.holders[:5]
    # the parameters and their optimizer state are named after their modules, never "unknown"
    params = MemoryCategory.PARAMETERS.value
    assert all(h.module not in {UNKNOWN, Unattributed.OPTIMIZER} for h in holders.holders if h.category == params)
    # so are their gradients, wherever autograd made them
    grads = peak_tl.category == peak_tl.categories.index(MemoryCategory.GRADIENTS.value)
    assert grads.any() and UNKNOWN not in {peak_tl.modules[m] for m in peak_tl.module[grads]}
    for tl, _ in kept:  # every timeline's live bytes come back to where the bytes are
        assert tl.live_bytes[-1] >= 0 and (tl.flags[: tl.n_resident] & RESIDENT).all()

    recomputed = [int((tl.flags & RECOMPUTED).any()) + len(tl.recompute_spans) for tl, _ in kept]
    if checkpoint == "none":
        assert recomputed == [0] * len(kept), "recomputation in a run that checkpoints nothing"
        assert all(not tl.regions for tl, _ in kept)
    else:
        assert all(r > 0 for r in recomputed), "a checkpointed run's steps recompute"
        assert peak_tl.regions and (peak_tl.region >= 0).any()


def test_each_event_carries_what_the_issue_names():
    _summary, kept = _run("transformer", "per_block")
    tl = kept[-1][0]
    assert tl.n_events == len(tl.bytes_delta) and set(np.unique(np.sign(tl.bytes_delta))) <= {-1, 0, 1}
    assert {p for _, p in tl.phases} == {"forward", "backward", "optimizer"}
    assert [p for _, p in tl.phases][0] == "forward"
    names = set(tl.modules)
    assert {"blocks.0", "blocks.1.mlp.0", Unattributed.BATCH.value, Unattributed.LOSS.value} <= names
    assert not any(".group." in n for n in names), "a checkpointed block keeps the name it had"
    assert "aten.addmm.default" in tl.ops and "torch.get_rng_state" in tl.ops
    assert tl.regions == ["blocks.0", "blocks.1"]
    saved = tl.flags & SAVED > 0
    assert saved.any() and (~saved).any()
    # recomputed blocks are made inside the recomputation spans, in backward
    made = np.flatnonzero(tl.events >= 0)
    recomputed_events = made[(tl.flags[tl.events[made]] & RECOMPUTED) > 0]
    spans = tl.recompute_spans
    assert all(any(s <= i < e for s, e in spans) for i in recomputed_events)
    assert all(tl.phase_at(i) == "backward" for i in recomputed_events)


def test_the_peak_step_is_the_one_the_summary_takes():
    # with a warm-up step, the summary's peak is the highest step after it (Adam's state
    # appears in step 1's optimizer phase, so later steps start higher)
    summary, kept = _run("transformer", "none", warmup_steps=1)
    peaks = {tl.step: tl.peak()[0] for tl, _ in kept}
    (peak_step,) = [tl.step for tl, is_peak in kept if is_peak]
    assert peak_step > 1 and peaks[peak_step] == summary.peak_allocated_bytes


def _recorded_steps(monkeypatch) -> list[int]:
    """The steps the memory pass records (``TimelineKeeper.recording`` spied on)."""
    from ckptlab.worker.engine.timeline import TimelineKeeper

    steps: list[int] = []
    recording = TimelineKeeper.recording

    def spy(self, step):
        steps.append(step)
        return recording(self, step)

    monkeypatch.setattr(TimelineKeeper, "recording", spy)
    return steps


def test_a_flat_memory_records_the_first_step_and_the_first_after_the_warm_up(monkeypatch):
    recorded = _recorded_steps(monkeypatch)
    summary, kept = _run("transformer", "per_block", steps=5, warmup_steps=1, memory_early_stop=False)
    assert summary.memory_steps_run == 5 and recorded == [1, 2]
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    assert peak_tl.step == 2 and peak_tl.peak()[0] == summary.peak_allocated_bytes


def test_a_memory_that_moves_records_the_step_after_each_move(monkeypatch, leaky_model):
    # each step keeps one more output: every step rises over the one before, so each step
    # after the first rise is recorded, and the last one, the run's peak, is kept
    recorded = _recorded_steps(monkeypatch)
    kept: list[tuple[StepTimeline, bool]] = []
    spec = make_spec(model={"kind": "custom", "name": leaky_model, "depth": 2}, steps=6, warmup_steps=1)
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    assert recorded == [1, 2, 4, 5, 6]
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    assert peak_tl.step == 6 and peak_tl.peak()[0] == summary.peak_allocated_bytes


def test_a_peak_only_the_last_unrecorded_step_reaches_is_not_claimed(monkeypatch, late_peak_model):
    # flat steps 2 to 4 are not recorded after step 2; step 5 jumps and is the pass's last:
    # the highest recorded step is kept, but not marked the run's peak
    recorded = _recorded_steps(monkeypatch)
    kept: list[tuple[StepTimeline, bool]] = []
    model = {"kind": "custom", "name": late_peak_model, "depth": 2}
    spec = make_spec(model=model, steps=5, warmup_steps=1, memory_early_stop=False, verify_gradients=False)
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    assert recorded == [1, 2]
    assert summary.peak_allocated_bytes >= 4 * 2**20
    assert [tl.step for tl, _ in kept] == [1, 2] and not any(is_peak for _, is_peak in kept)
    assert all(tl.peak()[0] < summary.peak_allocated_bytes for tl, _ in kept)


def test_a_memory_that_rises_falls_and_rises_again_records_until_a_step_reaches_its_peak(monkeypatch, late_peak_model):
    # steps 3 and 5 reach the peak; 3 is not recorded (after flat steps), 4 is (after a
    # rise) but stays below it, so 5 is recorded too, and kept as the peak
    recorded = _recorded_steps(monkeypatch)
    kept: list[tuple[StepTimeline, bool]] = []
    model = {"kind": "custom", "name": late_peak_model, "depth": 2, "options": {"high": "3,5"}}
    spec = make_spec(model=model, steps=5, warmup_steps=1, memory_early_stop=False, verify_gradients=False)
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    assert recorded == [1, 2, 4, 5]
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    assert peak_tl.step == 5 and peak_tl.peak()[0] == summary.peak_allocated_bytes


def test_recording_changes_no_reading(monkeypatch):
    on, kept = _run("transformer", "per_block")
    assert kept
    monkeypatch.setenv("CKPTLAB_RECORD_TIMELINE", "0")
    get_settings.cache_clear()
    try:
        off, none = _run("transformer", "per_block")
    finally:
        monkeypatch.delenv("CKPTLAB_RECORD_TIMELINE")
        get_settings.cache_clear()
    assert none == []
    for field in ("peak_allocated_bytes", "activation_bytes", "recompute_peak_bytes", "memory_at_peak"):
        assert getattr(on, field) == getattr(off, field), field


@pytest.mark.parametrize("steps", [3, 2])  # (2: the memory pass ends on a recorded step)
def test_nothing_of_it_runs_in_the_timing_pass(monkeypatch, steps):
    # the timing pass runs without the tracker's mode; the hooks and forward wrappers are gone
    # before it starts
    from ckptlab.worker.engine import context

    seen = []
    timed = context.timed_step

    def watched(run):
        modules = list(run.built.module.modules())
        seen.append(
            (
                run.meter.timeline,
                getattr(run.meter.probe, "recorder", None),
                sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + ("forward" in vars(m)) for m in modules)
                + len(torch.nn.modules.module._global_forward_hooks)
                + len(torch.nn.modules.module._global_forward_pre_hooks),
                torch._C._autograd._top_saved_tensors_default_hooks(True) is not None,
            )
        )
        return timed(run)

    monkeypatch.setattr(context, "timed_step", watched)
    _run("transformer", "per_block", steps=steps, timed_steps=2, paired_timing=False)
    assert seen and all(s == (None, None, 0, False) for s in seen), seen


def test_steps_recorded_one_after_another_share_the_hooks_and_a_step_not_recorded_has_none(monkeypatch):
    # the wrappers and the saved-tensor hooks stay on from one recorded step to the next
    # (the same wrapper objects), and are off for a step that is not recorded (after the pass:
    # test_nothing_of_it_runs_in_the_timing_pass)
    from ckptlab.worker.engine import context

    seen = []
    memory_step = context._memory_step

    def watched(run, step):
        modules = list(run.built.module.modules())
        record = memory_step(run, step)
        seen.append(
            (
                step,
                run.meter.timeline is not None,
                tuple(vars(m).get("forward") for m in modules),
                torch._C._autograd._top_saved_tensors_default_hooks(True) is not None,
            )
        )
        return record

    monkeypatch.setattr(context, "_memory_step", watched)
    _run("transformer", "per_block", steps=5, warmup_steps=1, timed_steps=1, paired_timing=False)
    recorded = [s for s in seen if s[1]]
    assert [s[0] for s in recorded] == [1, 2] and len(seen) > 2  # flat: the later steps are not recorded
    assert recorded[0][2] == recorded[1][2] and all(f is not None for f in recorded[0][2])
    for _step, _, forwards, hooked in seen[2:]:
        assert forwards == (None,) * len(forwards) and not hooked


def test_module_names_are_the_blocks_names_as_built():
    spec = make_spec(model=SHARDED_MODELS["transformer"], checkpoint={"strategy": "per_block", "every": 2})
    built = build_checkpointed(spec, torch.device("cpu"))
    names, regions, region_names = module_names(built.module)
    assert region_names == ["blocks.0-1"]
    assert set(names.values()) >= {"blocks.0", "blocks.1", "blocks.1.mlp.0", "head.1"}
    block1 = next(m for m, n in names.items() if n == "blocks.1.mlp.0")
    assert regions[block1] == 0


#: Blocks that return an intermediate beside their output, which the next block takes and
#: keeps (the shape of huggingface/accelerate#4172): checkpointing a block then keeps that
#: intermediate from forward to backward, more than the block's inputs.
CARRYING = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, carry):
        z = torch.relu(self.up(x)) + carry  # an intermediate, 4x the width
        return x + self.down(z), z


class Carrying(nn.Module):
    def __init__(self, blocks, width):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = blocks
        self.out = nn.Linear(width, 1)
        self.width = width

    def forward(self, x):
        x = self.inp(x)
        carry = torch.zeros(x.shape[0], 4 * self.width)
        for b in self.blocks:
            x, carry = b(x, carry)
        return self.out(x)


def factory(depth=3, width=64):
    blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def make_batch(batch_size, gen):
        return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 1, generator=gen)

    return Carrying(blocks, width), blocks, make_batch
"""


@pytest.fixture
def carrying_model(tmp_path, monkeypatch):

    yield install_model_plugin(
        tmp_path, monkeypatch, name="carrying", module="ckptlab_carrying_plugin", source=CARRYING
    )
    sys.modules.pop("ckptlab_carrying_plugin", None)


def _codes(summary: RunSummary) -> set[str]:
    return {f.code for f in summary.findings}


def test_a_region_that_keeps_more_than_its_inputs_is_a_finding(carrying_model):
    spec = make_spec(
        model={"kind": "custom", "name": carrying_model, "depth": 3},
        steps=2,
        verify_gradients=False,
        checkpoint={"strategy": "per_block", "use_reentrant": False},
    )
    summary = run_experiment(spec)
    keeps = {k["region"]: k for k in summary.region_keeps}
    assert set(keeps) == {"blocks.0", "blocks.1", "blocks.2"}
    carried = 16 * 4 * 64 * 4  # the batch's intermediate z: 16 x 256 float32
    for name in ("blocks.0", "blocks.1"):  # the next block takes z and keeps it
        keep = keeps[name]
        assert keep["excess_bytes"] >= carried and keep["kept_bytes"] == keep["intended_bytes"] + keep["excess_bytes"]
        assert keep["excess"][0]["module"] == name and keep["excess"][0]["op"] == "aten.add.Tensor"
    assert "region_keeps_more_than_its_inputs" in _codes(summary)
    finding = next(f for f in summary.findings if f.code == "region_keeps_more_than_its_inputs")
    assert "blocks.0 kept" in finding.message and "aten.add.Tensor in blocks.0" in finding.message


@pytest.mark.parametrize("checkpoint", ["per_block", "selective"])
@pytest.mark.parametrize("model", ["transformer", "hf-llama"])
def test_the_built_ins_keep_what_their_checkpoints_mean_to(model, checkpoint):
    summary, kept = _run(model, checkpoint)
    keeps = summary.region_keeps
    assert keeps and all(k["excess_bytes"] == 0 and k["kept_bytes"] == k["intended_bytes"] for k in keeps), keeps
    assert all(k["inputs_bytes"] > 0 and k["rng_state_bytes"] > 0 for k in keeps)
    assert all((k["policy_bytes"] > 0) == (checkpoint == "selective") for k in keeps)
    assert "region_keeps_more_than_its_inputs" not in _codes(summary)
    assert _run(model, "none")[0].region_keeps is None


@pytest.mark.parametrize(
    "extra", [{"checkpoint.use_reentrant": True}, {"grad_accum_steps": 2}, {"checkpoint.every": 2}], ids=str
)
def test_reentrant_checkpoints_and_accumulated_micro_batches_reach_the_peak_too(extra):
    checkpoint = {"strategy": "per_block", "use_reentrant": False}
    spec = make_spec(
        model=SHARDED_MODELS["transformer"], steps=3, verify_gradients=False, checkpoint=checkpoint, **extra
    )
    kept: list[tuple[StepTimeline, bool]] = []
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    holders = peak_holders(peak_tl)
    assert peak_tl.peak()[0] == summary.peak_allocated_bytes == sum(h.bytes for h in holders.holders)
    assert holders.named_bytes >= 0.95 * holders.peak_bytes
    assert peak_tl.recompute_spans and (peak_tl.flags & RECOMPUTED).any()
    assert all(k["excess_bytes"] == 0 for k in summary.region_keeps)


@pytest.mark.gpu
@pytest.mark.parametrize(("checkpoint", "use_reentrant"), [("none", False), ("per_block", False), ("per_block", True)])
def test_a_cuda_run_records_its_timeline_by_module_with_the_allocators_own_bytes_apart(checkpoint, use_reentrant):
    # On CUDA a recorded step runs under a tracker of its own; what the allocator holds that is
    # no tensor's (the cuBLAS workspaces) is one block. Its maximum reads the allocator's peak
    # to within the blocks the allocator rounds up or leaves unsplit (at most 1 MiB each).
    kept: list[tuple[StepTimeline, bool]] = []
    model = {"kind": "transformer", "depth": 4, "d_model": 256, "heads": 4, "seq_len": 256, "vocab_size": 2000}
    spec = make_spec(
        model=model,
        batch_size=8,
        steps=3,
        device="cuda",
        verify_gradients=False,
        checkpoint={**CHECKPOINTS[checkpoint], "use_reentrant": use_reentrant},
    )
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    peak = peak_tl.peak()[0]
    print(
        f"{checkpoint} (reentrant {use_reentrant}): timeline max {peak} B, "
        f"allocator peak {summary.peak_allocated_bytes} B"
    )
    assert 0.97 * summary.peak_allocated_bytes <= peak <= 1.01 * summary.peak_allocated_bytes
    holders = peak_holders(peak_tl)
    assert sum(h.bytes for h in holders.holders) + holders.others_bytes == peak
    not_a_tensor = sum(h.bytes for h in holders.holders if h.module == Unattributed.NOT_A_TENSOR)
    assert 0 < not_a_tensor < 0.5 * peak  # the workspaces, apart
    named = sum(h.bytes for h in holders.holders if h.module not in {UNKNOWN, Unattributed.NOT_A_TENSOR})
    assert named >= 0.95 * (peak - not_a_tensor), holders.holders[:5]
    categories = {h.category for h in holders.holders}
    assert {MemoryCategory.PARAMETERS.value, MemoryCategory.OPTIMIZER_STATE.value} <= categories
    assert bool(peak_tl.recompute_spans) == (checkpoint != "none")
    # every block made in backward named as a module (autograd runs it on a thread of its own)
    backward = next(i for i, p in peak_tl.phases if p == "backward")
    made = peak_tl.events[backward:][peak_tl.events[backward:] >= 0]
    unknown = sum(int(peak_tl.nbytes[b]) for b in made if peak_tl.modules[peak_tl.module[b]] == UNKNOWN)
    print(f"  backward blocks {len(made)}, unknown bytes {unknown} of {int(peak_tl.nbytes[made].sum())}")
    assert unknown <= 0.05 * int(peak_tl.nbytes[made].sum())
