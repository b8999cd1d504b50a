"""The API's guards against a hostile page, a hostile client and a busy database: cross-site
writes (403), non-JSON writes (415), foreign ``Host`` headers (400, DNS rebinding), JSON
nested too deep (422), a locked database (503 with ``Retry-After``), never a 500."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from ckptlab.backend.middleware import MAX_JSON_DEPTH, WRITE_METHODS, json_nesting_depth
from ckptlab.settings import Settings
from tests.factories import spec_dict

EVIL = "http://evil.example"


def _queued(client) -> int:
    r = client.post("/api/experiments", json=spec_dict())
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _status(client, exp_id: int) -> str:
    return client.get(f"/api/experiments/{exp_id}").json()["status"]


@pytest.mark.parametrize("token", [None, "s3cret"])
@pytest.mark.parametrize("header", ["Origin", "Referer"])
def test_cross_site_text_plain_cancel_is_refused_and_cancels_nothing(make_client, token, header):
    c = make_client(api_token=token)
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    exp_id = _queued_with(c, auth)
    source = EVIL if header == "Origin" else f"{EVIL}/page.html"
    r = c.post(
        f"/api/experiments/{exp_id}/cancel",
        content=b"x",
        headers={header: source, "Content-Type": "text/plain"},
    )
    assert r.status_code == 403
    assert "cross-site" in r.json()["detail"]
    assert _status(c, exp_id) == "queued"
    # The same forged request carrying the token (a page cannot read it, but still) is refused.
    r = c.post(f"/api/experiments/{exp_id}/cancel", headers={header: source, **auth})
    assert r.status_code == 403
    assert _status(c, exp_id) == "queued"


def _queued_with(client, headers: dict) -> int:
    r = client.post("/api/experiments", json=spec_dict(), headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_same_origin_and_configured_origins_may_write(make_client):
    c = make_client(cors_origins=["https://dash.example.org"])
    r = c.post("/api/experiments", json=spec_dict(), headers={"Origin": "http://testserver"})
    assert r.status_code == 201
    exp_id = r.json()["id"]
    r = c.post(f"/api/experiments/{exp_id}/cancel", headers={"Origin": "https://dash.example.org"})
    assert r.status_code == 200
    assert _status(c, exp_id) == "cancelled"


@pytest.mark.parametrize("origin", ["null", "http://testserver.evil.example", "file:///tmp/x.html", "ftp://testserver"])
def test_lookalike_and_opaque_origins_are_refused(client, origin):
    r = client.post("/api/experiments", json=spec_dict(), headers={"Origin": origin})
    assert r.status_code == 403
    assert client.get("/api/experiments").json()["count"] == 0


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_writes_need_json(client, ctype):
    r = client.post("/api/experiments", content=json.dumps(spec_dict()).encode(), headers={"Content-Type": ctype})
    assert r.status_code == 415
    r = client.post("/api/sweeps?dry_run=true", content=b"{}", headers={"Content-Type": ctype})
    assert r.status_code == 415
    assert client.get("/api/experiments").json()["count"] == 0


def test_a_body_without_content_type_is_refused_and_a_bodiless_cancel_is_not(client):
    exp_id = _queued(client)
    r = client.post(f"/api/experiments/{exp_id}/cancel", content=b'{"a": 1}', headers={"Content-Type": ""})
    assert r.status_code == 415
    assert _status(client, exp_id) == "queued"
    assert client.post(f"/api/experiments/{exp_id}/cancel").status_code == 200  # curl -XPOST, no body
    assert _status(client, exp_id) == "cancelled"


def test_json_with_charset_is_json(client):
    r = client.post(
        "/api/experiments",
        content=json.dumps(spec_dict()).encode(),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 201


@pytest.mark.parametrize("path", ["/api/health", "/api/experiments", "/"])
def test_a_foreign_host_is_refused_on_reads_too(client, path):
    r = client.get(path, headers={"Host": "evil.example"})
    assert r.status_code == 400
    r = client.get(path, headers={"Host": "evil.example:8000"})
    assert r.status_code == 400


def test_default_trusted_hosts_are_the_bound_address_and_loopback(data_dir, database_url):
    from fastapi.testclient import TestClient

    from ckptlab.backend.app import create_app

    settings = Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=[])
    assert settings.trusted_hosts == ["127.0.0.1", "localhost", "[::1]"]
    app = create_app(settings)
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1234", "[::1]:8000"):
        with TestClient(app, base_url=f"http://{host}") as c:
            assert c.get("/api/health").status_code == 200, host
    with TestClient(app) as c:  # Host: testserver
        assert c.get("/api/health").status_code == 400
    assert Settings(host="0.0.0.0", allowed_hosts=[]).trusted_hosts[0] == "0.0.0.0"
    assert Settings(host="::", allowed_hosts=[]).trusted_hosts[0] == "[::]"


def test_allowed_hosts_from_the_environment(monkeypatch):
    monkeypatch.setenv("CKPTLAB_ALLOWED_HOSTS", "[::1],ckpt.example.org")
    assert Settings().trusted_hosts == ["[::1]", "ckpt.example.org"]
    monkeypatch.setenv("CKPTLAB_ALLOWED_HOSTS", '["*.example.org"]')
    assert Settings().trusted_hosts == ["*.example.org"]


# ------------------------------------------------------------------ nesting


def test_json_nesting_depth_counts_brackets_outside_strings():
    assert json_nesting_depth(b"1") == 0
    assert json_nesting_depth(b'{"a": [[1], {"b": 2}]}') == 3
    assert json_nesting_depth(b'{"a": "[[[[{{{{"}') == 1
    assert json_nesting_depth(b'{"a": "x\\"[[[["}') == 1
    assert json_nesting_depth(b"[" * 5000 + b"]" * 5000) == 5000


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _write_routes(client) -> list[tuple[str, str]]:
    routes = []
    for path, ops in client.get("/openapi.json").json()["paths"].items():
        for method in ops:
            if method.upper() in WRITE_METHODS:
                routes.append((method.upper(), path.replace("{experiment_id}", "1").replace("{sweep_id}", "1")))
    assert routes
    return routes


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 600, 1000])
def test_deep_json_to_every_write_route_is_a_4xx_never_a_500(client, levels):
    base = spec_dict()
    bodies = [
        _deep(levels),
        '{"a": ' + _deep(levels) + "}",
        '{"name": "x", "base": {"model": ' + _deep(levels) + '}, "axes": {"amp": ["off"]}}',
        '{"name": "x", "base": ' + json.dumps(base) + ', "axes": {"seed": ' + _deep(levels) + "}}",
    ]
    for method, path in _write_routes(client):
        for body in bodies:
            r = client.request(method, path, content=body.encode(), headers={"Content-Type": "application/json"})
            assert 400 <= r.status_code < 500, (method, path, r.status_code)
            if r.status_code == 422:
                assert r.json()["detail"][0]["loc"] == ["body"]
    assert client.get("/api/experiments").json()["count"] == 0


def test_nesting_at_the_limit_reaches_validation(client):
    body = '{"a": ' + _deep(MAX_JSON_DEPTH - 1) + "}"
    r = client.post("/api/experiments", content=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["type"] != "json_too_deep"


# ------------------------------------------------------------------ busy database


def test_writes_during_a_10s_exclusive_lock_get_503_or_succeed_never_500(client, database_url):
    exp_id = _queued(client)
    path = database_url.removeprefix("sqlite:///")
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(10)
        conn.rollback()
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        first = client.post("/api/experiments", json=spec_dict())
        held = time.monotonic() - started < 9  # answered while the lock was surely held
        answers = [
            first,
            client.post("/api/sweeps", json={"name": "s", "base": spec_dict(), "axes": {"amp": ["off"]}}),
            client.post(f"/api/experiments/{exp_id}/cancel"),
        ]
    finally:
        release.set()
        holder.join()
    codes = [r.status_code for r in answers]
    assert all(code in (200, 201, 503) for code in codes), codes
    busy = [r for r in answers if r.status_code == 503]
    if held:
        assert codes[0] == 503, "a write inside the lock, past the busy timeout, is refused"
    for r in busy:
        assert r.headers["Retry-After"].isdigit()
        assert "retry" in r.json()["detail"]
    # What was refused left nothing behind; what succeeded is stored; the same request
    # succeeds once the lock is gone.
    items = client.get("/api/experiments?limit=100").json()["data"]
    single = [e for e in items if e["sweep_id"] is None]
    assert len(single) == 1 + (codes[0] == 201)
    assert client.get("/api/sweeps").json()["count"] == (codes[1] == 201)
    if codes[2] == 503:
        assert _status(client, exp_id) == "queued"
        assert client.post(f"/api/experiments/{exp_id}/cancel").status_code == 200
    assert _status(client, exp_id) == "cancelled"
