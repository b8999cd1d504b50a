"""``/api/predictions``: a prediction runs in a child process under a time limit and a
memory cap, never blocks the event loop, and is stored succeeded, failed or timed_out
(never a 500); bad input is a 422 naming the field; listing, export and ``/api/meta``'s
targets.

Most tests run a fake predictor (``FAKE_CHILD``, the child's protocol: the request as JSON on
stdin, one JSON line per target on stdout; its behaviour picked by the spec's ``seed``); the
last ones run the real ``python -m ckptlab.worker.predict`` when it is installed."""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ckptlab.backend.services.predictions import PredictionSlots
from ckptlab.backend.services.predictions import child as child_module
from ckptlab.prediction.budget import default_budget_bytes
from ckptlab.prediction.targets import TARGETS, target_names
from ckptlab.settings import Settings
from tests.factories import spec_dict

#: The fake predictor. seed 0: succeeds (its summary carries the RLIMIT_DATA it ran under
#: and its pid); 1: answers failed; 2: hangs; 3: exits 2 with one stderr line; 4: crashes with
#: a traceback; 5: prints noise first, then succeeds; 6: allocates past its memory cap; 7:
#: answers a summary that does not validate; 8: answers the first target, then hangs.
FAKE_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time

    request = json.load(sys.stdin)
    seed = request["spec"]["seed"]
    targets = request.get("targets") or [request["target"]]
    with open(os.environ["FAKE_CHILD_LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")

    def answer(target):
        summary = {
            "device": "cpu" if target == "cpu" else "cuda",
            "peak_allocated_bytes": 1000 + len(target),
            "rlimit_data": resource.getrlimit(resource.RLIMIT_DATA)[0],
            "prediction": {"target": target, "method": "fake", "error_bound": "none", "fits": target != "l4-24gb",
                           "capacity_bytes": request["capacity_bytes"]},
        }
        print(json.dumps({"target": target, "status": "succeeded", "summary": summary}), flush=True)

    if seed == 1:
        for t in targets:
            print(json.dumps({"target": t, "status": "failed", "error": "aten::frobnicate has no fake kernel"}))
    elif seed in (2, 8):
        if seed == 8:
            answer(targets[0])
        while True:
            time.sleep(1)
    elif seed == 3:
        sys.stderr.write("error: malformed request: spec is missing\\n")
        sys.exit(2)
    elif seed == 4:
        raise RuntimeError("the predictor crashed")
    elif seed == 6:
        hog = bytearray(4 * 2**30)
    elif seed == 7:
        print(json.dumps({"target": targets[0], "status": "succeeded", "summary": {"peak_allocated_bytes": "lots"}}))
    else:
        if seed == 5:
            print("a library's chatter")
            print(json.dumps(["not", "an", "answer"]))
        for t in targets:
            answer(t)
    """
)
REAL_CHILD = importlib.util.find_spec("ckptlab.worker") is not None and any(
    (Path(p) / "predict" / "__main__.py").is_file()
    for p in importlib.util.find_spec("ckptlab.worker").submodule_search_locations
)


@pytest.fixture
def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake predictor in place of ``ckptlab.worker.predict``; yields the file each of its
    runs appends its pid to."""
    folder = tmp_path / "fake_child"
    folder.mkdir()
    (folder / "fake_predict_child.py").write_text(FAKE_CHILD)
    log = tmp_path / "fake_child.log"
    log.write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_CHILD_LOG", str(log))
    monkeypatch.setattr(child_module, "CHILD_MODULE", "fake_predict_child")
    return log


def _post(client: TestClient, seed: int = 0, target: str = "cpu", **extra):
    return client.post("/api/predictions", json={"spec": spec_dict(seed=seed), "target": target, **extra})


def _pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie left for its reaper counts as ended)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return True
    return state == "Z"


def _wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


#: A server that starts a prediction which hangs, then dies at once (as under SIGKILL).
DYING_SERVER = textwrap.dedent(
    """
    import asyncio, os, time
    from pathlib import Path
    from ckptlab.backend.services.predictions import child

    child.CHILD_MODULE = "fake_predict_child"
    log = Path(os.environ["FAKE_CHILD_LOG"])

    async def main():
        request = {"spec": {"seed": 2}, "target": "cpu", "capacity_bytes": None}
        asyncio.create_task(child.run_child(request, timeout_s=600, memory_bytes=2**33))
        deadline = time.monotonic() + 60
        while not log.read_text().strip() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        os._exit(0)

    asyncio.run(main())
    """
)


def test_a_prediction_is_stored_and_read_back(client, fake_child):
    r = _post(client, target="h100-80gb", capacity_bytes=2**30)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "succeeded" and body["error"] is None and body["target"] == "h100-80gb"
    assert body["capacity_bytes"] == 2**30 and body["summary"]["prediction"]["capacity_bytes"] == 2**30
    assert body["summary"]["peak_allocated_bytes"] == 1009 and body["summary"]["prediction"]["fits"] is True
    assert body["elapsed_s"] >= 0 and body["finished_at"] >= body["created_at"]
    assert body["spec"]["seed"] == 0
    assert client.get(f"/api/predictions/{body['id']}").json() == body


def test_the_child_runs_under_the_memory_cap(make_client, fake_child):
    client = make_client(prediction_memory_bytes=3 * 2**30)
    assert _post(client).json()["summary"]["rlimit_data"] == 3 * 2**30
    capped = make_client(prediction_memory_bytes=512 * 2**20)
    body = _post(capped, seed=6).json()
    assert body["status"] == "failed"
    assert "MemoryError" in body["error"] and "CKPTLAB_PREDICTION_MEMORY_BYTES" in body["error"]


@pytest.mark.parametrize(
    ("seed", "error"),
    [
        (1, "aten::frobnicate has no fake kernel"),
        (3, "the prediction process exited with code 2 before answering: error: malformed request: spec is missing"),
        (4, "the prediction process exited with code 1 before answering: RuntimeError: the predictor crashed"),
        (7, "the predicted summary does not validate: peak_allocated_bytes: Input should be a valid integer"),
    ],
)
def test_a_failed_prediction_is_a_201_with_one_sentence(client, fake_child, seed, error):
    r = _post(client, seed=seed)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["status"], body["error"], body["summary"]) == ("failed", error, None)
    assert client.get(f"/api/predictions/{body['id']}").json()["status"] == "failed"


def test_noise_on_stdout_is_ignored(client, fake_child):
    assert _post(client, seed=5).json()["status"] == "succeeded"


def test_a_prediction_past_its_time_limit_is_killed_and_stored_timed_out(make_client, fake_child):
    client = make_client(prediction_timeout_s=1.5)
    body = _post(client, seed=2).json()
    assert (body["status"], body["error"]) == ("timed_out", "timed out after 1.5 s")
    assert 1.5 <= body["elapsed_s"] < 30
    (pid,) = _pids(fake_child)
    assert _wait_gone(pid), "the timed-out child still runs"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_prediction_ends_with_its_server(fake_child):
    subprocess.run([sys.executable, "-c", DYING_SERVER], check=True, timeout=120)
    (pid,) = _pids(fake_child)
    assert _wait_gone(pid), "the server died and its prediction still runs"


def test_a_running_prediction_does_not_block_the_server(make_client, fake_child):
    client = make_client(prediction_timeout_s=20)
    answers: list = []
    slow = threading.Thread(target=lambda: answers.append(_post(client, seed=2)))
    slow.start()
    deadline = time.monotonic() + 30
    while not _pids(fake_child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids(fake_child), "the child never started"
    t0 = time.monotonic()
    assert client.get("/api/health").status_code == 200
    assert client.get("/api/predictions").json()["count"] == 0
    assert time.monotonic() - t0 < 5 and slow.is_alive()
    os.kill(_pids(fake_child)[0], 9)  # end it: a crash is stored failed
    slow.join(30)
    assert answers[0].status_code == 201 and answers[0].json()["status"] == "failed"
    assert "killed by signal 9" in answers[0].json()["error"]


def test_every_slot_taken_is_a_503_with_retry_after(client, fake_child):
    slots = client.app.state.prediction_slots = PredictionSlots(1)
    with slots.claim():
        r = _post(client)
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert "CKPTLAB_PREDICTION_SLOTS" in r.json()["detail"]
    assert _post(client).status_code == 201 and slots.busy == 0


def test_a_batch_runs_one_child_and_answers_in_the_order_of_its_targets(client, fake_child):
    targets = ["h100-80gb", "cpu", "l4-24gb"]
    r = client.post("/api/predictions/batch", json={"spec": spec_dict(), "targets": targets})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["count"] == 3 and [p["target"] for p in body["data"]] == targets
    assert [p["summary"]["prediction"]["fits"] for p in body["data"]] == [True, True, False]
    assert len(_pids(fake_child)) == 1
    assert client.get("/api/predictions").json()["count"] == 3


def test_a_batch_cut_short_keeps_the_answers_it_got(make_client, fake_child):
    client = make_client(prediction_timeout_s=1)
    body = client.post("/api/predictions/batch", json={"spec": spec_dict(seed=8), "targets": ["cpu", "a100-40gb"]})
    assert [(p["status"], p["error"]) for p in body.json()["data"]] == [
        ("succeeded", None),
        ("timed_out", "timed out after 1 s"),  # one limit for the whole batch
    ]


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({"target": "tpu-v9"}, ["body", "target"], "unknown target 'tpu-v9'; expected one of cpu, "),
        ({"target": 7}, ["body", "target"], "valid string"),
        ({"capacity_bytes": 0}, ["body", "capacity_bytes"], "greater than 0"),
        ({"capacity_bytes": -5}, ["body", "capacity_bytes"], "greater than 0"),
        ({"capacity_bytes": "80000000000"}, ["body", "capacity_bytes"], "valid integer"),
        ({"capacity_bytes": 1.5}, ["body", "capacity_bytes"], "valid integer"),
        ({"capacity_bytes": True}, ["body", "capacity_bytes"], "valid integer"),
        ({"capacity_bytes": 2**51}, ["body", "capacity_bytes"], "less than or equal"),
        ({"spec": spec_dict(**{"model.depth": 0})}, ["body", "spec", "model", "depth"], "greater than or equal"),
        ({"spec": {**spec_dict(), "bogus": 1}}, ["body", "spec", "bogus"], "Extra inputs"),
        ({"extra": 1}, ["body", "extra"], "Extra inputs"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, fake_child, body, loc, words):
    r = client.post("/api/predictions", json={"spec": spec_dict(), "target": "cpu", **body})
    assert r.status_code == 422, r.text
    (err,) = [e for e in r.json()["detail"] if e["loc"] == loc]
    assert words in err["msg"]
    assert _pids(fake_child) == [] and client.get("/api/predictions").json()["count"] == 0


def test_a_spec_over_the_server_limits_is_a_422_like_an_experiment(make_client, fake_child):
    client = make_client(max_batch_size=8)
    r = _post(client)
    assert r.status_code == 422 and [e["loc"] for e in r.json()["detail"]] == [["body", "spec", "batch_size"]]
    same = client.post("/api/experiments", json=spec_dict())
    assert [e["msg"] for e in same.json()["detail"]] == [e["msg"] for e in r.json()["detail"]]
    assert _pids(fake_child) == []


def test_a_model_over_the_parameter_and_memory_limits_is_still_predicted(make_client, fake_child):
    # A prediction allocates no parameters: the limits that protect a worker's memory do not apply.
    client = make_client(max_param_count=100, worker_memory_bytes=1024)
    assert client.post("/api/experiments", json=spec_dict()).status_code == 422
    r = _post(client)
    assert r.status_code == 201, r.text
    assert len(_pids(fake_child)) == 1


@pytest.mark.parametrize(
    ("targets", "loc", "words"),
    [
        ([], ["body", "targets"], "at least 1"),
        (["cpu", "nope"], ["body", "targets", 1], "unknown target 'nope'"),
        (["cpu", "cpu"], ["body", "targets"], "each target at most once; repeated: cpu"),
    ],
)
def test_bad_batch_targets_are_a_422_naming_them(client, fake_child, targets, loc, words):
    r = client.post("/api/predictions/batch", json={"spec": spec_dict(), "targets": targets})
    assert r.status_code == 422
    assert any(e["loc"] == loc and words in e["msg"] for e in r.json()["detail"]), r.json()


def test_unknown_ids_are_404_and_bad_ids_422(client):
    assert client.get("/api/predictions/424242").json() == {"detail": "prediction 424242 not found"}
    assert client.get("/api/predictions/424242").status_code == 404
    assert client.get("/api/predictions/0").status_code == 422


def test_listing_filters_and_pages(client, fake_child):
    for seed, target in [(0, "cpu"), (1, "cpu"), (0, "h100-80gb"), (0, "h100-80gb")]:
        assert _post(client, seed=seed, target=target).status_code == 201
    everything = client.get("/api/predictions").json()
    assert everything["count"] == 4 and [p["id"] for p in everything["data"]] == [4, 3, 2, 1]
    page = client.get("/api/predictions", params={"offset": 1, "limit": 2}).json()
    assert page["count"] == 4 and [p["id"] for p in page["data"]] == [3, 2]
    h100 = client.get("/api/predictions", params={"target": "h100-80gb"}).json()
    assert h100["count"] == 2
    failed = client.get("/api/predictions", params={"status": "failed", "target": "cpu"}).json()
    assert [p["id"] for p in failed["data"]] == [2]
    assert client.get("/api/predictions", params={"model_kind": "resnet"}).json()["count"] == 0
    assert client.get("/api/predictions", params={"model_kind": "mlp"}).json()["count"] == 4
    assert client.get("/api/predictions", params={"status": "bogus"}).status_code == 422


def test_export_as_json_and_csv(client, fake_child):
    _post(client, target="h100-80gb")
    _post(client, seed=1)
    as_json = client.get("/api/predictions/export").json()
    assert as_json["count"] == 2 and as_json["data"] == client.get("/api/predictions").json()["data"]
    r = client.get("/api/predictions/export", params={"format": "csv", "status": "succeeded"})
    assert r.headers["content-type"].startswith("text/csv")
    assert 'filename="predictions.csv"' in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 1 and rows[0]["target"] == "h100-80gb" and rows[0]["status"] == "succeeded"
    assert rows[0]["spec.model.depth"] == "8" and rows[0]["summary.prediction.fits"] == "True"
    header = r.text.splitlines()[0].split(",")
    assert header[:4] == ["id", "status", "target", "capacity_bytes"]


def test_meta_serves_the_targets_table(client):
    targets = client.get("/api/meta").json()["targets"]
    assert [t["name"] for t in targets] == target_names()
    assert targets == [TARGETS[name].public() for name in target_names()]


def test_the_openapi_schema_lists_the_routes_and_the_known_targets(client):
    doc = client.get("/openapi.json").json()
    assert {"/api/predictions", "/api/predictions/batch", "/api/predictions/export"} <= doc["paths"].keys()
    create = doc["components"]["schemas"]["PredictionCreate"]
    assert create["properties"]["target"]["enum"] == target_names()


def test_the_prediction_routes_import_no_torch():
    code = (
        "import sys; from ckptlab.backend.app import create_app; import ckptlab.backend.api.predictions; "
        "from ckptlab.settings import Settings; create_app(Settings(database_url='sqlite://')); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_predictions_on_both_databases(any_database_url, data_dir, fake_child):
    from ckptlab.backend.app import create_app

    with TestClient(create_app(Settings(data_dir=data_dir, database_url=any_database_url))) as client:
        body = client.post(
            "/api/predictions/batch", json={"spec": spec_dict(), "targets": ["cpu", "h200-141gb"]}
        ).json()
        assert [p["status"] for p in body["data"]] == ["succeeded", "succeeded"]
        failed = _post(client, seed=1, capacity_bytes=2**40).json()
        assert client.get(f"/api/predictions/{failed['id']}").json() == failed
        assert client.get("/api/predictions", params={"status": "failed"}).json()["count"] == 1
        assert len(list(csv.DictReader(io.StringIO(client.get("/api/predictions/export?format=csv").text)))) == 3


# The real predictor (python -m ckptlab.worker.predict), once it is installed.
real = pytest.mark.skipif(not REAL_CHILD, reason="python -m ckptlab.worker.predict is not there yet")


@real
@pytest.mark.slow
def test_the_real_predictor_answers_for_cpu_and_a_gpu(client):
    body = client.post("/api/predictions/batch", json={"spec": spec_dict(), "targets": ["cpu", "h100-80gb"]})
    assert body.status_code == 201, body.text
    cpu, h100 = body.json()["data"]
    assert (cpu["status"], h100["status"]) == ("succeeded", "succeeded"), (cpu["error"], h100["error"])
    assert cpu["summary"]["prediction"]["target"] == "cpu" and cpu["summary"]["peak_allocated_bytes"] > 0
    assert h100["summary"]["prediction"]["fits"] is True
    assert h100["summary"]["prediction"]["capacity_bytes"] == TARGETS["h100-80gb"].capacity_bytes


@real
@pytest.mark.slow
def test_the_real_predictor_takes_a_capacity(client):
    r = _post(client, target="a100-40gb", capacity_bytes=1024)
    assert r.status_code == 201 and r.json()["status"] == "succeeded", r.json()["error"]
    prediction = r.json()["summary"]["prediction"]
    assert prediction["capacity_bytes"] == 1024 and prediction["fits"] is False and prediction["margin_bytes"] < 0


@real
@pytest.mark.slow
def test_auto_without_a_budget_plans_each_target_for_its_default(client):
    spec = spec_dict(checkpoint={"strategy": "auto", "use_reentrant": False})
    body = client.post("/api/predictions/batch", json={"spec": spec, "targets": ["h100-80gb", "l4-24gb", "cpu"]})
    assert body.status_code == 201, body.text
    h100, l4, cpu = body.json()["data"]
    for row, name in ((h100, "h100-80gb"), (l4, "l4-24gb")):
        assert row["status"] == "succeeded", row["error"]
        budget = default_budget_bytes(TARGETS[name])
        assert row["summary"]["budget_bytes"] == budget and row["spec"]["checkpoint"]["budget_bytes"] == budget
    assert cpu["status"] == "failed" and "needs checkpoint.budget_bytes or capacity_bytes" in cpu["error"]
    assert cpu["spec"]["checkpoint"]["budget_bytes"] is None
    one = client.post("/api/predictions", json={"spec": spec, "target": "cpu", "capacity_bytes": 2**30})
    assert one.status_code == 201 and one.json()["spec"]["checkpoint"]["budget_bytes"] == default_budget_bytes(
        TARGETS["cpu"], 2**30
    )
