"""A prediction's memory timeline (issue 34, item 4: predicted beside measured): its fake
memory pass records the first and peak steps as a real run's does. On target ``cpu`` the
peak step's maximum is the predicted peak to the byte and its events are the real run's,
named alike; on a CUDA target the timeline is the fake tensor count (blocks rounded to
512 B) and the predicted peak adds the cuBLAS workspaces to it. A sharded spec's traced rank
records none. The entry's answer line carries them for the backend to store."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from ckptlab.analysis.timeline import StepTimeline, decode, peak_holders
from ckptlab.analysis.timeline_rows import row_from_json
from ckptlab.prediction.targets import CPU_TARGET, get_target
from ckptlab.settings import get_settings
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.predict import __main__ as entry
from ckptlab.worker.predict import predict_run
from tests.factories import SHARDED_MODELS, make_spec, sharded_spec, spec_dict

CHECKPOINTS = {
    "none": {"strategy": "none"},
    "per_block": {"strategy": "per_block"},
    "selective": {"strategy": "selective", "policy": "save_matmuls"},
}


def _spec(model: str, checkpoint: str):
    return make_spec(
        model=SHARDED_MODELS[model],
        steps=3,
        timed_steps=0,
        paired_timing=False,
        verify_gradients=False,
        checkpoint={**CHECKPOINTS[checkpoint], "use_reentrant": False},
    )


def _kept(run, *args, **kwargs) -> tuple[object, list[tuple[StepTimeline, bool]]]:
    kept: list[tuple[StepTimeline, bool]] = []
    summary = run(*args, on_timeline=lambda tl, is_peak: kept.append((tl, is_peak)), **kwargs)
    return summary, kept


def _peak(kept: list[tuple[StepTimeline, bool]]) -> StepTimeline:
    (tl,) = [tl for tl, is_peak in kept if is_peak]
    return tl


def _named(tl: StepTimeline) -> tuple[list[str], list[str], list[str], np.ndarray]:
    """Each block's module, op and category by name, and its bytes: what two timelines of the
    same step share when they name alike."""
    return (
        [tl.modules[m] for m in tl.module],
        [tl.ops[o] for o in tl.op],
        [tl.categories[c] for c in tl.category],
        tl.nbytes,
    )


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
@pytest.mark.parametrize("model", ["transformer", "hf-llama"])
def test_on_cpu_the_predicted_timeline_reaches_the_predicted_peak_and_names_as_measured(model, checkpoint):
    spec = _spec(model, checkpoint)
    predicted, kept = _kept(predict_run, spec, CPU_TARGET)
    assert [tl.step for tl, _ in kept][0] == 1, "the first step is kept"
    tl = _peak(kept)
    peak, index = tl.peak()
    assert peak == int(tl.live_bytes.max()) == predicted.peak_allocated_bytes  # to the byte
    assert tl.phase_at(index) == predicted.peak_phase
    holders = peak_holders(tl)
    assert sum(h.bytes for h in holders.holders) == peak and holders.named_bytes >= 0.95 * peak

    measured, real = _kept(run_experiment, spec)
    real_tl = _peak(real)
    assert real_tl.peak()[0] == measured.peak_allocated_bytes == peak
    assert (tl.step, tl.n_events, tl.n_resident) == (real_tl.step, real_tl.n_events, real_tl.n_resident)
    got, want = _named(tl), _named(real_tl)
    for name, a, b in zip(("module", "op", "category"), got[:3], want[:3], strict=True):
        assert a == b, name
    assert np.array_equal(got[3], want[3]) and np.array_equal(tl.events, real_tl.events)
    assert np.array_equal(tl.flags, real_tl.flags), "saved for backward, recomputed, resident: as measured"
    assert tl.phases == real_tl.phases and tl.recompute_spans == real_tl.recompute_spans
    assert tl.regions == real_tl.regions and (checkpoint == "none") == (not tl.recompute_spans)
    assert predicted.region_keeps == measured.region_keeps


def test_on_a_cuda_target_the_peak_adds_the_cublas_workspaces_to_the_fake_count():
    target = get_target("h100-80gb")
    predicted, kept = _kept(predict_run, _spec("transformer", "per_block"), target)
    tl = _peak(kept)
    assert target.cublas_workspaces_bytes > 0
    assert predicted.peak_allocated_bytes == tl.peak()[0] + target.cublas_workspaces_bytes
    assert not (tl.nbytes % 512).any(), "each fake block is counted as the caching allocator rounds it"


def test_a_sharded_specs_traced_rank_and_recording_off_keep_none(monkeypatch):
    predicted, kept = _kept(predict_run, sharded_spec("mlp", "per_block"), CPU_TARGET)
    assert predicted.peak_allocated_bytes and kept == []
    monkeypatch.setenv("CKPTLAB_RECORD_TIMELINE", "false")
    get_settings.cache_clear()
    try:
        predicted, kept = _kept(predict_run, _spec("transformer", "none"), CPU_TARGET)
    finally:
        monkeypatch.delenv("CKPTLAB_RECORD_TIMELINE")
        get_settings.cache_clear()
    assert predicted.peak_allocated_bytes and kept == []


def _answer(body: dict) -> dict:
    out = io.StringIO()
    assert entry.main(io.StringIO(json.dumps(body)), out, io.StringIO()) == 0
    (line,) = out.getvalue().splitlines()
    return json.loads(line)


SPEC = spec_dict(model=SHARDED_MODELS["transformer"], steps=3, checkpoint={"strategy": "per_block"})


def test_the_answer_line_carries_the_timelines_as_stored_rows(monkeypatch):
    answer = _answer({"spec": SPEC, "target": "cpu"})
    rows = [row_from_json(r) for r in answer["timelines"]]
    assert [r["step"] for r in rows][0] == 1 and sum(r["is_peak"] for r in rows) == 1
    (peak,) = [r for r in rows if r["is_peak"]]
    assert peak["peak_bytes"] == answer["summary"]["peak_allocated_bytes"]
    tl = decode(peak["data"])
    assert tl.peak() == (peak["peak_bytes"], peak["peak_index"]) and tl.n_events == peak["n_events"]

    monkeypatch.setattr(entry, "TIMELINE_ANSWER_BYTES", 10)  # over the line's share: the prediction stands
    answer = _answer({"spec": SPEC, "target": "cpu"})
    assert answer["status"] == "succeeded" and answer["timelines"] == []
