"""An experiment against its baseline: the overhead with its 95% CI, the same rule as the
sweep table (no signed number for a difference inside the noise)."""

from __future__ import annotations

import random

from tests.backend.conftest import finish_next
from tests.factories import spec_dict


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
