"""``GET /api/meta``: the vocabulary the frontend reads instead of spelling it."""

from __future__ import annotations

from ckptlab.domain import FINISHED_STATUSES, MemoryCategory, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
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

    monkeypatch.setattr("ckptlab.backend.services.series.warm_running_series", broken)
    with caplog.at_level(logging.ERROR, logger="ckptlab.side_tasks"):
        c = make_client(series_warm_interval_s=0.02)
        wait_for(lambda: len(calls) >= 3, timeout=10, interval=0.02)
    assert "side task series-warmer raised; restarting it" in caplog.text
    assert c.get("/api/health").status_code == 200


def test_meta_serves_the_model_kind_table(client):
    from ckptlab.spec.kinds import MODEL_KIND_TABLE, model_kind_names

    meta = client.get("/api/meta").json()
    assert meta["model_kinds"] == model_kind_names() and len(meta["model_kinds"]) == 8
    table = {k["name"]: k for k in meta["model_kind_table"]}
    assert list(table) == meta["model_kinds"]  # by rank
    assert [name for name, k in table.items() if k["default"]] == [ExperimentSpec().model.kind]
    for name, entry in table.items():
        assert entry == MODEL_KIND_TABLE[name].public()
        assert {"summary", "label", "example", "rank", "fields"} <= set(entry) and "kind" not in entry["fields"]
    mlp = table["mlp"]["fields"]["depth"]
    assert (mlp["minimum"], mlp["maximum"], mlp["default"]) == (1, 1024, 32)  # the spec class's bounds
    # torchvision's parameters are not counted: the table says so (no silent skip).
    assert table["torchvision"]["parameter_limit_checked"] is False and table["torchvision"]["parameter_limit_note"]
    assert table["mlp"]["parameter_limit_checked"] is True and table["mlp"]["parameter_limit_note"] is None
    assert table["torchvision"]["option_text"]["architecture"]["resnet50"] == "resnet50 — 16 blocks"
    # The OpenAPI example lists every kind too.
    example = client.get("/openapi.json").json()["components"]["schemas"]["MetaPublic"]["examples"][0]
    assert example["model_kinds"] == meta["model_kinds"]
