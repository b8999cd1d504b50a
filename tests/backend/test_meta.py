"""``GET /api/meta``: the vocabulary the frontend reads instead of spelling it."""

from __future__ import annotations

from ckptlab.domain import FINISHED_STATUSES, MemoryCategory, Status
from ckptlab.hf import HF_ARCHITECTURES
from ckptlab.strategies import STRATEGIES


def test_meta_lists_the_domain_vocabulary_and_the_servers_limits(make_client):
    meta = make_client(max_sweep_size=7).get("/api/meta").json()
    assert [s["name"] for s in meta["statuses"]] == [s.value for s in Status]
    assert {s["name"] for s in meta["statuses"] if s["finished"]} == {s.value for s in FINISHED_STATUSES}
    assert meta["memory_categories"] == [c.value for c in MemoryCategory]
    assert meta["strategies"] == list(STRATEGIES)
    assert meta["max_sweep_size"] == 7
    batch = meta["spec_schema"]["properties"]["batch_size"]
    assert batch["default"] >= 1 and batch["minimum"] == 1


def test_meta_describes_every_hf_architecture_with_its_config_fields(client):
    archs = client.get("/api/meta").json()["hf_architectures"]
    assert set(archs) == set(HF_ARCHITECTURES)
    llama = archs["llama"]
    assert llama["family"] == "causal_lm" and llama["attention"] is True
    assert llama["fields"]["hidden_size"] == {
        "type": "int",
        "default": 4096,
        "description": "width of the hidden states",
        "minimum": 8,
        "maximum": 16384,
    }
    assert archs["resnet"]["fields"]["depths"]["default"] == [3, 4, 6, 3]
    assert "hf" in client.get("/api/meta").json()["model_kinds"]


def test_meta_needs_no_token_and_says_when_writes_need_one(make_client):
    c = make_client(api_token="secret")
    r = c.get("/api/meta")
    assert r.status_code == 200
    assert r.json()["write_token_required"] is True
    assert make_client().get("/api/meta").json()["write_token_required"] is False


def test_a_background_loop_that_raises_is_restarted_and_the_api_keeps_serving(make_client, monkeypatch, caplog):
    import logging

    from tests.support import wait_for

    calls = []

    def broken(*_args, **_kwargs):
        calls.append(1)
        raise RuntimeError("cache exploded")

    monkeypatch.setattr("backend.services.series.warm_running_series", broken)
    with caplog.at_level(logging.ERROR, logger="ckptlab.side_tasks"):
        c = make_client(series_warm_interval_s=0.02)
        wait_for(lambda: len(calls) >= 3, timeout=10, interval=0.02)
    assert "side task series-warmer raised; restarting it" in caplog.text
    assert c.get("/api/health").status_code == 200
