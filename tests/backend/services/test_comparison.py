"""An experiment against its baseline: the overhead with its 95% CI, the same rule as the
sweep table (no signed number for a difference inside the noise)."""

from __future__ import annotations

import random

from ckptlab.backend.services import comparison
from tests.backend.conftest import finish_next
from tests.factories import make_spec, spec_dict


def _times(center: float, seed: int, n: int = 20) -> dict:
    rng = random.Random(seed)
    times = [center * (1 + rng.uniform(-0.1, 0.1)) for _ in range(n)]
    return {"step_times_ms": times, "step_time_ms": sorted(times)[n // 2]}


def _create(client, **overrides) -> int:
    r = client.post("/api/experiments", json=spec_dict(**overrides))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_same_work_is_no_measurable_difference_and_a_real_slowdown_is_a_number(client, db_session):
    base = _create(client)  # strategy none
    same = _create(client, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 1})
    slow = _create(client, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    other = _create(client, batch_size=8, **{"checkpoint.strategy": "sequential"})  # no baseline of its spec
    for exp_id, summary in [(base, _times(10, 1)), (same, _times(10, 2)), (slow, _times(13, 3)), (other, _times(9, 4))]:
        finish_next(db_session, exp_id, summary)

    c = client.get(f"/api/experiments/{same}/comparison").json()
    assert c["baseline_ids"] == [base] and c["is_baseline"] is False
    assert c["overhead"]["measurable"] is False
    assert c["overhead_text"].startswith("no measurable difference (95% CI ")

    c = client.get(f"/api/experiments/{slow}/comparison").json()
    assert c["overhead"]["measurable"] is True and 20 < c["overhead"]["low_pct"] < c["overhead"]["high_pct"] < 40
    assert c["overhead_text"].startswith("+3")

    assert client.get(f"/api/experiments/{base}/comparison").json()["is_baseline"] is True
    c = client.get(f"/api/experiments/{other}/comparison").json()
    assert (c["baseline_ids"], c["overhead"], c["overhead_text"]) == ([], None, None)
    assert client.get("/api/experiments/999/comparison").status_code == 404


def test_a_second_baseline_run_joins_the_first(client, db_session):
    first = _create(client)
    run = _create(client, **{"checkpoint.strategy": "sequential"})
    second = _create(client)
    finish_next(db_session, first, _times(10, 5))
    finish_next(db_session, run, _times(10, 6))
    finish_next(db_session, second, _times(10, 7))
    c = client.get(f"/api/experiments/{run}/comparison").json()
    assert c["baseline_ids"] == [first, second]


def test_in_a_sweep_the_comparison_is_the_sweep_tables(client, db_session):
    body = {
        "name": "cmp",
        "base": spec_dict(**{"checkpoint.strategy": "sequential"}),
        "axes": {"checkpoint.segments": [2]},
    }
    sweep = client.post("/api/sweeps", json=body).json()
    ids = sorted(e["id"] for e in sweep["experiments"])  # baseline, run, baseline again
    for exp_id, center in zip(ids, (10, 12, 10), strict=True):
        finish_next(db_session, exp_id, _times(center, exp_id))
    row = next(r for r in client.get(f"/api/sweeps/{sweep['id']}/results").json()["data"] if r["role"] == "run")
    c = client.get(f"/api/experiments/{row['experiment_id']}/comparison").json()
    assert c["baseline_ids"] == [ids[0], ids[2]]
    assert (c["overhead"], c["overhead_text"]) == (row["overhead"], row["overhead_text"])


def test_a_paired_run_is_served_the_overhead_its_worker_stored(client, db_session):
    """Reads do not bootstrap a paired run's rounds again: the figures stored at its finish
    are the answer (here deliberately not the rounds': the read shows which it used)."""
    run = _create(client, **{"checkpoint.strategy": "sequential"})
    rounds = _times(10, 11, n=200)["step_times_ms"]
    stored = {"estimate_pct": 31.0, "low_pct": 29.5, "high_pct": 33.0, "rounds": 200, "clock": "CPU time"}
    summary = {**_times(13, 12, n=200), "step_cpu_ms": rounds, "paired_with": "none"}
    summary |= {"paired_baseline_cpu_ms": rounds, "paired_baseline_step_times_ms": rounds, "paired_overhead": stored}
    finish_next(db_session, run, summary)
    c = client.get(f"/api/experiments/{run}/comparison").json()
    assert (c["overhead"]["estimate_pct"], c["overhead"]["low_pct"], c["overhead"]["high_pct"]) == (31.0, 29.5, 33.0)
    assert c["overhead"]["measurable"] is True and c["overhead_text"].startswith("+31%")


def test_a_baseline_the_server_would_refuse_is_not_offered_and_says_why(client, db_session):
    """Issue 32: "Run the baseline" submits the spec with strategy none; the comparison says
    when this server would refuse that (a python target it does not allow), and a run
    ``ckptlab.profile`` stored (its summary names the model) says to profile the baseline."""
    from ckptlab.db import store

    model = {"kind": "python", "target": "my_pkg.models:Net", "depth": 2}
    ids = {}
    for name, summary in [("profiled", {"model": "Net (1,234 parameters)"}), ("cli", {})]:
        exp = store.create_experiment(db_session, spec=make_spec(model=model, **{"checkpoint.strategy": "per_block"}))
        finish_next(db_session, exp.id, summary)
        ids[name] = exp.id
    built_in = _create(client, **{"checkpoint.strategy": "sequential"})
    finish_next(db_session, built_in, _times(10, 13))

    refused = {
        name: client.get(f"/api/experiments/{i}/comparison").json()["baseline_refused"] for name, i in ids.items()
    }
    assert refused["profiled"] == comparison.PROFILED_BASELINE
    assert 'ckptlab.profile(model, sample, strategy="none")' in refused["profiled"]
    assert refused["cli"].startswith("this server would refuse its baseline: python target 'my_pkg.models:Net'")
    assert client.get(f"/api/experiments/{built_in}/comparison").json()["baseline_refused"] is None
