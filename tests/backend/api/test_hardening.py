"""Bad input never crashes the API: server limits (422 naming the field), oversized bodies
(413), out-of-range ids, the write token, CORS, database errors, the OpenAPI document, and
the backend never importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy.exc import IntegrityError

from ckptlab.settings import Settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.limits import estimate_fixed_bytes, estimate_param_count
from tests.factories import hf_model, spec_dict


def count(client) -> int:
    return client.get("/api/experiments").json()["count"]


@pytest.mark.parametrize(
    ("overrides", "limits", "loc"),
    [
        ({"steps": 50}, {"max_steps": 20}, ["body", "steps"]),
        ({"batch_size": 512}, {"max_batch_size": 256}, ["body", "batch_size"]),
        ({"model.width": 4096, "model.depth": 64}, {"max_param_count": 10_000_000}, ["body", "model"]),
        ({"model.width": 1024, "model.depth": 8}, {"worker_memory_bytes": 64 * 2**20}, ["body", "model"]),
        (
            {"distributed": {"kind": "fsdp2", "world_size": 16}},
            {"max_world_size": 8},
            ["body", "distributed", "world_size"],
        ),
    ],
)
def test_specs_over_server_limits_get_422_naming_the_field(make_client, overrides, limits, loc):
    c = make_client(**limits)
    r = c.post("/api/experiments", json=spec_dict(**overrides))
    assert r.status_code == 422
    assert loc in [e["loc"] for e in r.json()["detail"]]
    assert count(c) == 0
    # The same limits make a sweep combination invalid (reported, not queued).
    body = {"name": "x", "base": spec_dict(**overrides), "axes": {"amp": ["off"]}}
    assert c.post("/api/sweeps", json=body).status_code == 422


def test_parameter_estimate_matches_the_models_the_worker_builds():
    from ckptlab.worker.models.build import build_model

    models = [
        {"kind": "mlp", "depth": 3, "width": 17},
        {"kind": "mlp", "depth": 2, "width": 5, "stem": False},
        {"kind": "resnet", "depth": 2, "channels": 3, "image_size": 16},
        {"kind": "transformer", "depth": 2, "d_model": 16, "heads": 2, "seq_len": 8, "vocab_size": 50},
        {"kind": "densenet", "depth": 3, "growth_rate": 4, "bn_size": 2, "image_size": 8},
    ]
    for m in models:
        spec = ExperimentSpec.model_validate({"model": m})
        built = build_model(spec.model)
        assert estimate_param_count(spec) == sum(p.numel() for p in built.module.parameters()), m
    custom = ExperimentSpec.model_validate({"model": {"kind": "custom", "name": "x", "depth": 2}})
    assert estimate_param_count(custom) is None


def test_admission_control_gives_the_fixed_memory_estimate(make_client):
    # 8 x 1024-wide layers: 8.4 M parameters; x 4 B x (param + grad + Adam's 2 states) = 135 MB.
    c = make_client(worker_memory_bytes=100 * 2**20)
    big = spec_dict(**{"model.width": 1024, "model.depth": 8})
    fixed = estimate_fixed_bytes(ExperimentSpec.model_validate(big))
    r = c.post("/api/experiments", json=big)
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "model"]]
    assert f"{fixed:,} bytes" in error["msg"] and "adam state" in error["msg"], error
    assert count(c) == 0
    # Without Adam's two states the same model fits (param + grad = 67 MB): 201.
    assert c.post("/api/experiments", json={**big, "optimizer": "sgd"}).status_code == 201
    # memory_limit_bytes has an upper bound in the schema (1 PiB).
    r = c.post("/api/experiments", json=spec_dict(memory_limit_bytes=2**50 + 1))
    assert r.status_code == 422 and ["body", "memory_limit_bytes"] in [e["loc"] for e in r.json()["detail"]]
    assert count(c) == 1


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_fixed_memory_estimate_is_what_the_engine_measures(optimizer):
    from ckptlab.worker.engine.run import run_experiment

    spec = ExperimentSpec.model_validate(spec_dict(optimizer=optimizer))
    summary = run_experiment(spec).dump()
    # After the first step: the fp32 parameters and the optimizer state as the tracker saw them.
    at_forward_end = summary["memory_at_forward_end"]
    params, state = at_forward_end["parameters"], at_forward_end["optimizer_state"]
    assert params == 4 * estimate_param_count(spec)
    measured = 2 * params + state  # a gradient per parameter after backward
    estimate = estimate_fixed_bytes(spec)
    # Exact but for Adam's scalar step tensors (4 B per parameter tensor), left out on purpose.
    assert estimate <= measured <= estimate * 1.001, (estimate, measured)
    assert (state > 0) == (optimizer == "adam")


def test_large_bodies_get_413(make_client):
    c = make_client(max_request_bytes=2048)
    big = {**spec_dict(), "padding": "x" * 5000}
    r = c.post("/api/experiments", json=big)
    assert r.status_code == 413 and "2048" in r.json()["detail"]

    def chunks():  # no Content-Length: the body is read up to the limit, then refused
        for _ in range(10):
            yield b"x" * 1000

    r = c.post("/api/experiments", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert c.post("/api/experiments", json=spec_dict()).status_code == 201
    assert count(c) == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/experiments/99999999999999999999999"),
        ("get", "/api/experiments/0"),
        ("get", "/api/experiments/-1/steps"),
        ("post", "/api/experiments/99999999999999999999999/cancel"),
        ("get", "/api/sweeps/99999999999999999999999"),
        ("post", "/api/sweeps/99999999999999999999999/cancel"),
        ("get", "/api/experiments?offset=99999999999999999999999"),
    ],
)
def test_out_of_range_ids_get_422(client, method, path):
    assert getattr(client, method)(path).status_code == 422


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"[]", b"null", b'{"model": "mlp"}', '{"steps": "\u00e9"}'.encode(), b"\xff\xfe"],
)
def test_malformed_bodies_get_422(client, content):
    r = client.post("/api/experiments", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    r = client.post("/api/sweeps", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 422


def test_unknown_ids_get_404(client):
    for path in ("/api/experiments/7", "/api/experiments/7/series", "/api/sweeps/7", "/api/sweeps/7/results"):
        r = client.get(path)
        assert r.status_code == 404 and "not found" in r.json()["detail"]
    assert client.post("/api/experiments/7/cancel").status_code == 404


def test_writes_need_the_token_when_one_is_set(make_client):
    c = make_client(api_token="s3cret")
    assert c.post("/api/experiments", json=spec_dict()).status_code == 401
    r = c.post("/api/experiments", json=spec_dict(), headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert c.post("/api/experiments", json=spec_dict(), headers={"Authorization": "Basic s3cret"}).status_code == 401
    sweep = {"name": "x", "base": spec_dict(), "axes": {"amp": ["off"]}}
    assert c.post("/api/sweeps", json=sweep).status_code == 401
    assert count(c) == 0
    ok = c.post("/api/experiments", json=spec_dict(), headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201
    assert c.get("/api/experiments").status_code == 200  # reads stay open
    assert c.get(f"/api/experiments/{ok.json()['id']}").status_code == 200
    doc = c.get("/openapi.json").json()
    assert doc["paths"]["/api/experiments"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in doc["paths"]["/api/experiments"]["get"]


@pytest.mark.parametrize("protect", [False, True])
def test_reads_that_compute_need_the_token_with_protect_reads(make_client, protect):
    c = make_client(api_token="s3cret", protect_reads=protect)
    auth = {"Authorization": "Bearer s3cret"}
    exp = c.post("/api/experiments", json=spec_dict(), headers=auth).json()["id"]
    sweep = c.post("/api/sweeps", json={"name": "x", "base": spec_dict(), "axes": {"amp": ["off"]}}, headers=auth)
    sid = sweep.json()["id"]
    computed = [
        f"/api/experiments/{exp}/comparison",
        "/api/experiments/export",
        f"/api/sweeps/{sid}/results",
        f"/api/sweeps/{sid}/charts/pareto",
        f"/api/sweeps/{sid}/recommendation",
        f"/api/plans/{sid}",
    ]
    for path in computed:
        assert c.get(path).status_code == (401 if protect else c.get(path, headers=auth).status_code), path
        assert c.get(path, headers=auth).status_code in (200, 404, 422), path
    for cheap in ("/api/experiments", f"/api/experiments/{exp}", f"/api/sweeps/{sid}", "/api/health"):
        assert c.get(cheap).status_code == 200, cheap  # lists and single rows stay open


def test_no_token_no_auth(client):
    assert client.post("/api/experiments", json=spec_dict()).status_code == 201
    assert "security" not in client.get("/openapi.json").json()["paths"]["/api/experiments"]["post"]


def test_cors_is_off_unless_configured(client, make_client):
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    r = client.options("/api/experiments", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/api/experiments", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    c = make_client(cors_origins=["http://localhost:5173"])
    r = c.options("/api/experiments", headers={**preflight, "Origin": "http://localhost:5173"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"
    r = c.get("/api/experiments", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_database_constraint_errors_are_409_not_500(make_client):
    c = make_client()

    def boom():
        raise IntegrityError("INSERT ...", {}, Exception("UNIQUE constraint failed"))

    c.app.add_api_route("/api/boom", boom, methods=["GET"])
    r = c.get("/api/boom")
    assert r.status_code == 409 and "conflicts" in r.json()["detail"]


def test_openapi_documents_every_route(client):
    doc = client.get("/openapi.json").json()
    ops = [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]
    assert len(ops) >= 14
    for path, method, op in ops:
        assert op.get("summary"), f"{method} {path} has no summary"
        ok = op["responses"].get("200") or op["responses"].get("201")
        assert ok and ok.get("content"), f"{method} {path} documents no response body"
        if "application/json" in ok["content"]:
            ref = ok["content"]["application/json"]["schema"].get("$ref")
            assert ref, f"{method} {path} has no response model"
            name = ref.rsplit("/", 1)[-1]
            schema = doc["components"]["schemas"][name]
            has_example = "examples" in schema or all(
                "examples" in doc["components"]["schemas"].get(p.get("$ref", "/").rsplit("/", 1)[-1], {})
                or "$ref" not in p
                for p in schema.get("properties", {}).values()
            )
            assert has_example, f"{name} has no example"
        else:
            assert any("example" in c for c in ok["content"].values()), f"{method} {path} has no example"
    create = doc["paths"]["/api/sweeps"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert doc["components"]["schemas"][create["$ref"].rsplit("/", 1)[-1]]["examples"]
    assert client.get("/docs").status_code == 200


def test_backend_never_imports_torch():
    code = (
        "import sys; from ckptlab.backend.app import create_app; from ckptlab.settings import Settings; "
        "create_app(Settings(database_url='sqlite://')); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/api/experiments", json.dumps(spec_dict())[:-1] + ', "memory_limit_bytes": NaN}', "memory_limit_bytes"),
        ("/api/experiments", json.dumps(spec_dict())[:-1] + ', "timeout_s": Infinity}', "timeout_s"),
        ("/api/sweeps", '{"name": "x", "base": {"seed": NaN}, "axes": {"amp": ["off"]}}', "base"),
        ("/api/sweeps", '{"name": "x", "base": {}, "axes": {"seed": [NaN, 1]}}', "axes"),
    ],
)
def test_nan_and_infinity_literals_get_422_not_500(client, path, body, loc):
    # Python's JSON parser accepts NaN / Infinity; they must not reach storage or the 422 echo.
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", loc]
    assert count(client) == 0


def test_security_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("CKPTLAB_CORS_ORIGINS", "http://a.example, http://b.example")
    monkeypatch.setenv("CKPTLAB_API_TOKEN", "t0k3n")
    s = Settings()
    assert s.cors_origins == ["http://a.example", "http://b.example"]
    assert s.api_token.get_secret_value() == "t0k3n" and "t0k3n" not in repr(s)
    monkeypatch.setenv("CKPTLAB_CORS_ORIGINS", '["http://c.example"]')
    assert Settings().cors_origins == ["http://c.example"]
    monkeypatch.delenv("CKPTLAB_CORS_ORIGINS")
    monkeypatch.delenv("CKPTLAB_API_TOKEN")
    monkeypatch.delenv("CKPTLAB_HOST", raising=False)
    assert Settings().cors_origins == [] and Settings().api_token is None and Settings().host == "127.0.0.1"


@pytest.mark.parametrize(
    ("path", "allow"),
    [("/api/experiments", "GET, POST"), ("/api/sweeps", "GET, POST"), ("/api/experiments/1", "GET")],
)
def test_a_method_a_path_lacks_gets_405_with_every_method_it_has(client, path, allow):
    for method in ("OPTIONS", "PUT", "DELETE"):
        r = client.request(method, path)
        assert r.status_code == 405 and r.headers["allow"] == allow


def test_booleans_of_the_spec_are_strict(client):
    for field in ("memory_snapshot", "verify_gradients"):
        r = client.post("/api/experiments", json={**spec_dict(), field: 0})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field]
    assert client.get("/api/experiments").json()["count"] == 0


def test_an_unknown_custom_model_is_a_422_at_submit_time(make_client, tmp_path, monkeypatch):
    from tests.support import install_model_plugin

    name = install_model_plugin(tmp_path, monkeypatch, name="api_plugin", module="ckptlab_api_plugin", source="")
    c = make_client()
    r = c.post("/api/experiments", json=spec_dict(model={"kind": "custom", "name": "nope", "depth": 2}))
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "model", "name"]]
    assert "no model 'nope' is installed" in error["msg"] and "api_plugin" in error["msg"]
    # Installed: accepted (read from the package metadata; the API imports nothing).
    installed = spec_dict(model={"kind": "custom", "name": name, "depth": 2})
    assert c.post("/api/experiments", json=installed).status_code == 201
    assert "ckptlab_api_plugin" not in sys.modules
    # An API without the workers' model packages can leave the check to the workers.
    relaxed = make_client(check_model_entry_points=False)
    body = spec_dict(model={"kind": "custom", "name": "nope", "depth": 2})
    assert relaxed.post("/api/experiments", json=body).status_code == 201


def test_a_python_target_the_operator_did_not_allow_is_a_422_and_never_imported(make_client):
    body = spec_dict(model={"kind": "python", "target": "ckptlab_never_imported:factory", "depth": 2})
    c = make_client()
    r = c.post("/api/experiments", json=body)
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "model", "target"]]
    assert "is not allowed on this server" in error["msg"]
    assert count(c) == 0 and "ckptlab_never_imported" not in sys.modules
    sweep = {"name": "x", "base": body, "axes": {"amp": ["off"]}}
    assert c.post("/api/sweeps", json=sweep).status_code == 422
    # Allowed by exact name: stored for a worker (the API still imports nothing).
    allowed = make_client(allowed_model_targets=["ckptlab_never_imported:factory"])
    assert allowed.post("/api/experiments", json=body).status_code == 201
    assert "ckptlab_never_imported" not in sys.modules


def test_admission_control_counts_hf_parameters(make_client):
    # Llama's config defaults are Llama-2-7B: 6.7 B parameters, refused before a worker
    # builds them; the tiny config is accepted.
    c = make_client(max_param_count=1_000_000_000)
    r = c.post("/api/experiments", json=spec_dict(model={"kind": "hf", "architecture": "llama"}))
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "model"] and "server's limit" in e["msg"]]
    assert "6,738,415,616 parameters" in error["msg"], error
    assert count(c) == 0
    assert c.post("/api/experiments", json=spec_dict(model=hf_model("llama"))).status_code == 201


def test_the_api_refuses_torchvision_where_it_does_not_import_and_stores_nothing(make_client):
    from ckptlab.spec.torchvision_model import torchvision_problem

    problem = torchvision_problem()
    if problem is None:
        pytest.skip("torchvision imports here: the kind is accepted (tests/worker/models/test_torchvision_models.py)")
    c = make_client()
    body = spec_dict(model={"kind": "torchvision", "architecture": "resnet18"})
    r = c.post("/api/experiments", json=body)
    assert r.status_code == 422
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "model", "kind"]]
    assert error["msg"] == problem and error["msg"].startswith("torchvision does not import here")
    assert c.get("/api/experiments").json()["count"] == 0
    # An operator whose API runs without the workers' packages can turn the check off.
    off = make_client(check_model_entry_points=False)
    assert (
        off.post(
            "/api/experiments", json=spec_dict(model={"kind": "torchvision", "architecture": "resnet18"})
        ).status_code
        == 201
    )


def test_the_fixed_memory_advice_fits_the_spec_it_answers(make_client):
    c = make_client(worker_memory_bytes=40 * 2**20)
    big = spec_dict(**{"model.width": 1024, "model.depth": 8})  # 8.4 M parameters: 67 MB with sgd
    msgs = {
        opt: next(e["msg"] for e in c.post("/api/experiments", json={**big, "optimizer": opt}).json()["detail"])
        for opt in ("adam", "sgd")
    }
    assert "or sgd, which keeps no optimizer state" in msgs["adam"]
    assert "sgd" not in msgs["sgd"].split(";")[-1]  # already sgd: only a smaller model helps
    assert all("checkpointing cannot help" in m for m in msgs.values())
