"""The CUDA memory snapshot of a run with ``memory_snapshot`` is the allocator history of the
step its memory timeline keeps as the peak step (issue 34): checked on CPU with a stand-in
for the allocator's history, and on CUDA (marked ``gpu``)."""

from __future__ import annotations

import pytest

from ckptlab.analysis.timeline import StepTimeline
from ckptlab.worker.engine.run import run_experiment
from tests.factories import make_spec


class _FakeHistory:
    """Stands in for the CUDA allocator's history (``AllocatorHistory``): a snapshot names
    the step it was started in."""

    def __init__(self, where):
        self.where, self.started, self.taken, self.dropped = where, None, [], []

    def start(self):
        assert self.started is None  # one step at a time
        self.started = self.where["step"]

    def take(self):
        step, self.started = self.started, None
        self.taken.append(step)
        return f"step {step}".encode()

    def stop(self):
        self.started = None
        self.dropped.append(self.where["step"])


def _spy_on_snapshots(monkeypatch) -> tuple[list[_FakeHistory], list[bytes | None]]:
    """Every run's step histories (fakes, on CPU) and the snapshot each keeper gives as its
    peak step's."""
    from ckptlab.worker.engine import timeline

    histories: list[_FakeHistory] = []
    snapshots: list[bytes | None] = []
    monkeypatch.setattr(
        timeline, "step_snapshots", lambda run, wanted: histories.append(_FakeHistory(run.where)) or histories[-1]
    )
    peak_snapshot = timeline.TimelineKeeper.peak_snapshot
    monkeypatch.setattr(
        timeline.TimelineKeeper, "peak_snapshot", lambda self: snapshots.append(peak_snapshot(self)) or snapshots[-1]
    )
    return histories, snapshots


def _late_peak_run(name: str, high: str) -> list[tuple[StepTimeline, bool]]:
    """The timelines kept of 5 steps of :data:`LATE_PEAK` (``name``) jumping at the forwards ``high``."""
    kept: list[tuple[StepTimeline, bool]] = []
    model = {"kind": "custom", "name": name, "depth": 2, "options": {"high": high}}
    spec = make_spec(model=model, steps=5, warmup_steps=1, memory_early_stop=False, verify_gradients=False)
    run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)))
    return kept


def test_the_snapshot_kept_is_of_the_step_the_timeline_keeps_as_the_peak(monkeypatch, late_peak_model):
    # steps 1, 2, 4 and 5 are recorded and 5 is kept as the peak (test_timeline.py); each
    # recorded step gets a history of its own, and the one kept is step 5's
    histories, snapshots = _spy_on_snapshots(monkeypatch)
    kept = _late_peak_run(late_peak_model, "3,5")
    (peak_tl,) = [tl for tl, is_peak in kept if is_peak]
    # each recorded step's history is taken when the step becomes the peak candidate (1, the
    # warm-up's; 2, then 5), else dropped (4, below 2): only one snapshot is made per rise
    assert len(histories) == 1 and histories[0].taken == [1, 2, 5] and histories[0].dropped == [4]
    assert peak_tl.step == 5 and snapshots == [b"step 5"]


def test_without_a_peak_claimed_the_snapshot_is_of_the_highest_step_kept(monkeypatch, late_peak_model):
    # step 4 jumps unrecorded (after flat steps), so step 5 is recorded, but no higher than
    # step 2: step 2 stays the highest kept, and its snapshot is the one kept, not the last's
    histories, snapshots = _spy_on_snapshots(monkeypatch)
    kept = _late_peak_run(late_peak_model, "4")
    assert histories[0].taken == [1, 2] and histories[0].dropped == [5]
    assert [tl.step for tl, _ in kept] == [1, 2] and not any(is_peak for _, is_peak in kept)
    assert snapshots == [b"step 2"]


@pytest.mark.gpu
def test_a_cuda_runs_memory_snapshot_is_its_peak_steps(tmp_path):
    # The allocator history kept is the peak step's alone: about as many allocations as that
    # step's timeline made (the whole run's, three memory steps and the timed ones, would be
    # several times more). Unverified: no GPU in the session that wrote it.
    import pickle

    kept: list[tuple[StepTimeline, bool]] = []
    model = {"kind": "transformer", "depth": 2, "d_model": 128, "heads": 4, "seq_len": 64, "vocab_size": 500}
    spec = make_spec(model=model, steps=3, device="cuda", verify_gradients=False, memory_snapshot=True)
    path = tmp_path / "snapshot.pickle"
    summary = run_experiment(spec, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)), snapshot_path=str(path))
    assert summary.snapshot_path == str(path)
    peak_tl = next((tl for tl, is_peak in kept if is_peak), kept[-1][0])  # (the highest kept, if none is marked)
    snapshot = pickle.loads(path.read_bytes())
    allocs = sum(1 for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc")
    made = int((peak_tl.events >= 0).sum())
    assert 0.5 * made <= allocs <= 2 * made, (allocs, made)
