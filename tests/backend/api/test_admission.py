"""Admission control bounds activations (issue 33, item 4): the specs that were accepted with
201 and then failed or spun on a 24 GiB worker are refused at submit with a 422 naming the
bound, the worker's memory and what to lower; normal specs are still accepted."""

from __future__ import annotations

import pytest

from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.limits import estimate_fixed_bytes, estimate_param_count, estimate_peak_floor, limit_errors
from ckptlab.spec.presets import EXAMPLE_SPEC, PRESETS
from tests.factories import HF_TINY, TINY, hf_model, spec_dict

#: The issue's host: 24 GiB of RAM, of which the default share (75%) for one experiment.
ISSUE_HOST = int(0.75 * 24 * 2**30)
SMALL_LLAMA = {k: v for k, v in hf_model("llama").items() if k != "seq_len"}
#: The issue's five specs, accepted with 201 under default settings before.
ISSUE_SPECS = {
    "mlp 4096x32, batch 65536, sgd": {
        "model": {"kind": "mlp", "depth": 32, "width": 4096},
        "batch_size": 65536,
        "optimizer": "sgd",
    },
    "resnet 1024 channels at 1024 px": {"model": {"kind": "resnet", "depth": 1, "channels": 1024, "image_size": 1024}},
    "transformer seq 32768, vocab 10^6": {
        "model": {"kind": "transformer", "seq_len": 32768, "vocab_size": 1_000_000},
        "batch_size": 4,
    },
    "hf llama seq 32768, batch 65536": {"model": {**SMALL_LLAMA, "seq_len": 32768}, "batch_size": 65536},
    "hf vit 1024 px, patch 1": {"model": hf_model("vit", image_size=1024, patch_size=1)},
}


@pytest.mark.parametrize("name", sorted(ISSUE_SPECS))
def test_the_issues_specs_are_refused_naming_the_bound_and_the_memory(make_client, name):
    c = make_client(worker_memory_bytes=ISSUE_HOST, auto_runs_on_cpu=True)
    body = ISSUE_SPECS[name]
    r = c.post("/api/experiments", json=body)
    assert r.status_code == 422, r.text
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "batch_size"]]
    floor = estimate_peak_floor(ExperimentSpec.model_validate(body))
    msg = error["msg"]
    assert f"{floor.activations:,} bytes" in msg and f"{floor.total:,} bytes" in msg, msg
    assert "18.00 GiB (CKPTLAB_WORKER_MEMORY_BYTES)" in msg and "A lower bound" in msg, msg
    assert "lower model." in msg and "batch_size" in msg, msg
    assert c.get("/api/experiments").json()["count"] == 0
    sweep = {"name": "x", "base": body, "axes": {"seed": [0, 1]}}
    assert c.post("/api/sweeps", json=sweep).status_code == 422


def _normal_specs() -> dict[str, dict]:
    specs = {"README example": EXAMPLE_SPEC, "tests' TINY": TINY}
    specs |= {f"preset {name}": p["spec"] for name, p in PRESETS.items()}
    specs |= {f"tiny hf {a}": spec_dict(model=hf_model(a)) for a in HF_TINY}
    return specs


@pytest.mark.parametrize("name", sorted(_normal_specs()))
def test_normal_specs_are_still_accepted(make_client, name):
    spec = _normal_specs()[name]
    assert not limit_errors(ExperimentSpec.model_validate(spec), Settings(worker_memory_bytes=ISSUE_HOST))
    # Even a 2 GiB worker takes them.
    assert make_client(worker_memory_bytes=2 * 2**30).post("/api/experiments", json=spec).status_code == 201


def test_the_refusal_says_which_batch_passes_and_it_does(make_client):
    c = make_client(worker_memory_bytes=ISSUE_HOST, auto_runs_on_cpu=True)
    body = ISSUE_SPECS["mlp 4096x32, batch 65536, sgd"]
    msg = c.post("/api/experiments", json=body).json()["detail"][0]["msg"]
    fits = estimate_peak_floor(ExperimentSpec.model_validate(body)).batch_that_fits(ISSUE_HOST)
    assert f"batch_size {fits} passes this check" in msg and "checkpoint more" in msg
    assert c.post("/api/experiments", json={**body, "batch_size": fits}).status_code == 201
    assert c.post("/api/experiments", json={**body, "batch_size": fits + 1}).status_code == 422


def test_the_gradient_check_counts_and_turning_it_off_is_the_advice(make_client):
    # Checkpointed every 4 blocks the run keeps few inputs, but the gradient check's step
    # without checkpointing keeps all 32: refused, saying verify_gradients; without it, 201.
    c = make_client(worker_memory_bytes=ISSUE_HOST, auto_runs_on_cpu=True)
    body = {**ISSUE_SPECS["mlp 4096x32, batch 65536, sgd"], "checkpoint": {"strategy": "per_block", "every": 4}}
    body["batch_size"] = 32768
    r = c.post("/api/experiments", json=body)
    assert r.status_code == 422 and "verify_gradients" in r.json()["detail"][0]["msg"]
    assert c.post("/api/experiments", json={**body, "verify_gradients": False}).status_code == 201


def test_predictions_and_cuda_runs_are_not_bounded_by_host_memory():
    spec = ExperimentSpec.model_validate(ISSUE_SPECS["hf vit 1024 px, patch 1"])
    settings = Settings(worker_memory_bytes=ISSUE_HOST)
    assert limit_errors(spec, settings, allocates=False) == []  # a prediction allocates nothing
    on_cuda = spec.model_copy(update={"device": "cuda"})  # activations in device memory
    assert [e for e in limit_errors(on_cuda, settings) if e["loc"] == ["body", "batch_size"]] == []
    # device auto runs on the GPU of a backend whose workers have one (CKPTLAB_AUTO_RUNS_ON_CPU=false) ...
    on_gpu_workers = Settings(worker_memory_bytes=ISSUE_HOST, auto_runs_on_cpu=False)
    assert [e for e in limit_errors(spec, on_gpu_workers) if e["loc"] == ["body", "batch_size"]] == []
    # ... and on the CPU otherwise; a cpu spec and a sharded run (CPU ranks) always count
    cpu_auto = Settings(worker_memory_bytes=ISSUE_HOST, auto_runs_on_cpu=True)
    assert [e["loc"] for e in limit_errors(spec, cpu_auto)] == [["body", "batch_size"]]
    on_cpu = spec.model_copy(update={"device": "cpu"})
    assert [e["loc"] for e in limit_errors(on_cpu, on_gpu_workers)] == [["body", "batch_size"]]


def test_fsdp2_memory_is_counted_per_rank():
    # 8 x 4096-wide blocks with adam: 2.2 GiB of parameters, gradients and state in one
    # process; over 4 FSDP2 ranks a quarter of it per rank.
    base = spec_dict(**{"model.width": 4096, "model.depth": 8}, verify_gradients=False)
    one = ExperimentSpec.model_validate(base)
    sharded = ExperimentSpec.model_validate({**base, "distributed": {"kind": "fsdp2", "world_size": 4}})
    assert estimate_fixed_bytes(sharded) == -(-estimate_param_count(one) // 4) * 4 * (2 + 2)
    settings = Settings(worker_memory_bytes=2**30)
    assert any(e["loc"] == ["body", "model"] for e in limit_errors(one, settings))
    assert limit_errors(sharded, settings) == []
