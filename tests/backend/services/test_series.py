"""Per-step series: at most max_points points, spikes and the global extremes kept, nulls
skipped, the cache brought up to date by new steps, bad input rejected; a long range drawn
from the rollup with exact counts and extremes, a zoomed range at full resolution, and a
rollup that misses steps left unused until it is rebuilt."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import insert

from ckptlab.backend.services.series import SeriesCache, downsample_indices, warm_running_series
from ckptlab.db import queue, rollups, store
from ckptlab.db.models import Step
from ckptlab.summary import RunSummary
from tests.backend.conftest import add_steps, running_experiment, step_record

N = 20_000
SPIKES = (1234, 7777, 15000)


def step_times() -> np.ndarray:
    """The long run's step time at steps 1..N (index = step - 1), ms."""
    rng = np.random.default_rng(0)
    base = 10 + np.sin(np.arange(N) / 500) + rng.normal(0, 0.05, N)
    base[[s - 1 for s in SPIKES]] = [40.0, 55.0, 47.0]
    base[9999] = 1.0  # the global minimum, at step 10000
    return base


@pytest.fixture
def long_run(db_session):
    """A running experiment with N steps: a smooth step time with three spikes, one dip."""
    exp = running_experiment(db_session)
    records = [step_record(i + 1, step_ms=float(v), loss=None if i % 2 else 1.0) for i, v in enumerate(step_times())]
    store.add_steps(db_session, experiment_id=exp.id, attempt=1, records=records)
    return exp


def series(client, exp, **params):
    r = client.get(f"/api/experiments/{exp.id}/series", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_series_keeps_spikes_and_global_extremes(client, long_run):
    r = client.get(f"/api/experiments/{long_run.id}/series", params={"metric": "step_ms", "max_points": 300})
    assert r.status_code == 200
    body = r.json()
    assert len(body["x"]) == len(body["y"]) <= 300
    assert body["total"] == N and body["downsampled"] is True and body["skipped"] == 0
    assert body["x"] == sorted(body["x"])
    assert set(SPIKES) <= set(body["x"]), "every spike survives downsampling"
    assert body["max"] == {"step": 7777, "value": 55.0}
    assert body["min"] == {"step": 10000, "value": 1.0}
    assert 10000 in body["x"] and max(body["y"]) == 55.0 and min(body["y"]) == 1.0


def test_series_skips_null_values_and_returns_small_series_whole(client, db_session, long_run):
    body = client.get(f"/api/experiments/{long_run.id}/series", params={"metric": "loss", "max_points": 20000}).json()
    assert body["total"] == N // 2 and body["skipped"] == N // 2
    assert body["downsampled"] is False and len(body["x"]) == N // 2
    assert all(x % 2 == 1 for x in body["x"])  # the null losses (even steps) are left out
    cpu = client.get(f"/api/experiments/{long_run.id}/series", params={"metric": "reserved_bytes"}).json()
    assert cpu["total"] == 0 and cpu["x"] == [] and cpu["min"] is None


def test_series_sees_steps_added_after_it_was_cached(client, db_session):
    exp = running_experiment(db_session)
    store.add_steps(db_session, experiment_id=exp.id, attempt=1, records=[step_record(s) for s in range(1, 101)])
    url = f"/api/experiments/{exp.id}/series?metric=peak_allocated_bytes&max_points=50"
    first = client.get(url).json()
    assert first["total"] == 100 and first["max"]["value"] == 2000
    store.add_steps(
        db_session,
        experiment_id=exp.id,
        attempt=1,
        records=[step_record(s, peak_allocated_bytes=5000 if s == 150 else 2000) for s in range(101, 201)],
    )
    second = client.get(url).json()
    assert second["total"] == 200 and second["max"] == {"step": 150, "value": 5000}
    assert 150 in second["x"] and len(second["x"]) <= 50


def test_series_is_of_the_current_attempt(client, db_session):
    exp = running_experiment(db_session)
    store.add_steps(db_session, experiment_id=exp.id, attempt=1, records=[step_record(s) for s in range(1, 11)])
    queue.requeue_experiment(db_session, experiment_id=exp.id, attempt=1)
    again = queue.claim_next(db_session, worker_id="test:2")
    assert again.attempt == 2
    store.add_steps(db_session, experiment_id=exp.id, attempt=2, records=[step_record(s) for s in range(1, 4)])
    body = client.get(f"/api/experiments/{exp.id}/series").json()
    assert body["attempt"] == 2 and body["x"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("metric=params", ["query", "metric"]),
        ("max_points=3", ["query", "max_points"]),
        ("max_points=1000001", ["query", "max_points"]),  # over the schema's maximum
        ("max_points=abc", ["query", "max_points"]),
        ("step_min=-1", ["query", "step_min"]),
        ("step_max=2147483648", ["query", "step_max"]),  # past a 32-bit step
        ("step_min=10&step_max=9", ["query", "step_max"]),
        ("step_min=x", ["query", "step_min"]),
    ],
)
def test_series_rejects_bad_queries(client, db_session, query, loc):
    exp = running_experiment(db_session)
    r = client.get(f"/api/experiments/{exp.id}/series?{query}")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc
    assert client.get("/api/experiments/12345/series").status_code == 404


def test_max_points_over_the_servers_cap_is_capped_not_refused(make_client, db_session):
    exp = running_experiment(db_session)
    add_steps(db_session, exp, range(1, 101))
    body = make_client(series_max_points=20).get(f"/api/experiments/{exp.id}/series?max_points=50000").json()
    assert body["total"] == 100 and len(body["x"]) <= 20


def test_downsample_indices_unit():
    x = np.arange(1, 101, dtype=np.int64)
    y = np.ones(100)
    y[[10, 20]] = [math.nan, math.inf]
    y[50] = 9.0
    assert list(downsample_indices(x, y, 1000)) == [i for i in range(100) if i not in (10, 20)]
    picked = downsample_indices(x, y, 10)
    assert len(picked) <= 10 and 50 in picked and 10 not in picked and 20 not in picked
    with pytest.raises(ValueError):
        downsample_indices(x, y, 3)


def test_running_experiments_are_kept_warm(db_session):
    live = running_experiment(db_session)
    store.add_steps(db_session, experiment_id=live.id, attempt=1, records=[step_record(s) for s in range(1, 51)])
    done = running_experiment(db_session)
    queue.finish_experiment(db_session, experiment_id=done.id, status="succeeded", summary=RunSummary())
    cache = SeriesCache()
    assert warm_running_series(db_session, cache, metrics=("step_ms", "loss")) == 1
    assert set(cache._entries) == {(live.id, 1, "step_ms"), (live.id, 1, "loss")}
    store.add_steps(db_session, experiment_id=live.id, attempt=1, records=[step_record(51, step_ms=99.0)])
    warm_running_series(db_session, cache, metrics=("step_ms",))
    warmed = cache._entries[(live.id, 1, "step_ms")]
    assert len(warmed.values) == 51 and warmed.values[-1] == 99.0


def test_a_long_range_is_drawn_from_the_rollup_with_exact_counts_and_extremes(client, long_run):
    truth = step_times()
    body = series(client, long_run, metric="step_ms", max_points=50)
    assert body["resolution"] == 256, "20,000 steps in 50 points: buckets of 256 steps (78 of them)"
    assert len(body["x"]) <= 50 and body["downsampled"] is True
    assert body["total"] == N and body["skipped"] == 0
    assert body["min"] == {"step": 10000, "value": 1.0} and body["max"] == {"step": 7777, "value": 55.0}
    assert {10000, 7777} <= set(body["x"])
    assert body["x"] == sorted(set(body["x"]))
    assert body["y"] == [float(truth[x - 1]) for x in body["x"]], "every point is a stored step's value"
    whole = series(client, long_run, metric="step_ms", max_points=20000)  # every step read
    assert whole["resolution"] == 1 and len(whole["x"]) == N
    for key in ("total", "skipped", "min", "max"):
        assert body[key] == whole[key], key
    loss = series(client, long_run, metric="loss", max_points=50)
    assert loss["resolution"] == 256 and (loss["total"], loss["skipped"]) == (N // 2, N // 2)
    assert all(x % 2 == 1 for x in loss["x"]) and loss["min"] == {"step": 1, "value": 1.0}


def test_a_zoomed_range_comes_back_at_full_resolution(client, long_run):
    truth = step_times()
    body = series(client, long_run, step_min=9000, step_max=10999, max_points=2000)
    assert body["resolution"] == 1 and body["downsampled"] is False
    assert body["x"] == list(range(9000, 11000))
    assert body["y"] == [float(v) for v in truth[8999:10999]]
    assert (body["step_min"], body["step_max"], body["total"]) == (9000, 10999, 2000)
    assert body["min"] == {"step": 10000, "value": 1.0}
    tail = series(client, long_run, step_min=19990, step_max=10**6)
    assert tail["x"] == list(range(19990, N + 1)), "a range past the last step ends there"
    assert series(client, long_run, step_min=N + 1)["x"] == []


def test_a_long_range_with_ragged_ends_is_exact_too(client, long_run):
    truth = step_times()
    body = series(client, long_run, step_min=8001, step_max=17000, max_points=20)
    assert body["resolution"] == 256 and len(body["x"]) <= 20
    assert body["total"] == 9000, "buckets inside the range, the steps of its ragged ends read one by one"
    inside = truth[8000:17000]
    assert body["max"] == {"step": 15000, "value": 47.0}, "the range's own maximum, not the run's"
    assert body["min"] == {"step": 10000, "value": 1.0} and body["min"]["value"] == inside.min()
    assert all(8001 <= x <= 17000 for x in body["x"])
    assert body["y"] == [float(truth[x - 1]) for x in body["x"]]
    loss = series(client, long_run, metric="loss", step_min=8001, step_max=17000, max_points=20)
    assert (loss["total"], loss["skipped"]) == (4500, 4500)


def test_a_rollup_that_misses_steps_is_not_used_until_rebuilt(client, db_session):
    exp = running_experiment(db_session)
    add_steps(db_session, exp, range(1, 3001))
    late = [
        {**step_record(s, step_ms=80.0 if s == 3050 else 3.5), "experiment_id": exp.id, "attempt": 1}
        for s in range(3001, 3101)
    ]
    db_session.execute(insert(Step), late)  # stored another way: no rollup
    db_session.commit()
    stale = series(client, exp, max_points=10)
    assert stale["resolution"] == 1, "the rollup ends at step 3000: every step is read instead"
    assert stale["total"] == 3100 and stale["max"] == {"step": 3050, "value": 80.0}
    rollups.rebuild_rollups(db_session, experiment_id=exp.id)
    rebuilt = series(client, exp, max_points=10)
    assert rebuilt["resolution"] == 256 and rebuilt["total"] == 3100
    assert rebuilt["max"] == {"step": 3050, "value": 80.0}


def test_a_run_drawn_from_its_rollup_is_not_kept_warm(db_session):
    long = running_experiment(db_session)
    add_steps(db_session, long, range(1, 3001))
    short = running_experiment(db_session)
    add_steps(db_session, short, range(1, 101))
    cache = SeriesCache()
    assert warm_running_series(db_session, cache, metrics=("step_ms",), max_points=10) == 1
    assert set(cache._entries) == {(short.id, 1, "step_ms")}
