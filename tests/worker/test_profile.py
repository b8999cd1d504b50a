"""``ckptlab.profile``: the engine on a model defined in the caller's code, stored so that
the dashboard shows it."""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

import ckptlab
from ckptlab.backend.app import create_app
from ckptlab.db import events, queue, store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.models import Step, Worker
from ckptlab.settings import Settings, get_settings
from ckptlab.worker.profile import find_blocks
from ckptlab.worker.service.heartbeat import in_process_owner, in_process_worker_id
from tests.factories import make_spec
from tests.support import in_process_worker as worker_thread
from tests.support import wait_for

#: A short lease for the tests that run a dashboard's worker beside ``profile()``.
LEASE_S = 1.5


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


class _SlowBlock(_Block):
    """Sleeps ``delay_s`` in every forward, so that a run lasts several leases."""

    delay_s = 0.0

    def forward(self, x):
        time.sleep(self.delay_s)
        return super().forward(x)


class _Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4, block: type[_Block] = _Block):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, width), nn.ReLU())  # mixed types: not the blocks
        self.layers = nn.ModuleList(block(width) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@contextmanager
def _session(url):
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as s:
            yield s
    finally:
        engine.dispose()


def _worker(url, worker_id) -> Worker | None:
    with _session(url) as s:
        return s.get(Worker, worker_id)


@pytest.fixture
def fresh_settings(monkeypatch):
    """``get_settings()`` re-read from the environment this test sets, and again after it."""
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_profile_runs_a_model_in_hand_and_the_dashboard_lists_it(database_url, data_dir):
    torch.manual_seed(0)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    url = database_url
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    summary = ckptlab.profile(model, (x, y), strategy="per_block", steps=3, timed_steps=2, database_url=url)
    assert summary.status == "succeeded", summary.error
    assert summary.param_count == sum(p.numel() for p in model.parameters())
    assert summary.gradients_match is True and summary.recompute_peak_bytes > 0
    # The caller's model is untouched: same weights, no checkpointing wrappers.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(isinstance(m, _Block) for m in model.layers)

    assert summary.database_url == url
    with TestClient(create_app(Settings(database_url=url, data_dir=data_dir))) as client:
        listed = client.get("/api/experiments").json()["data"]
        timeline = client.get(f"/api/experiments/{summary.experiment_id}/timeline").json()
        holders = client.get(f"/api/experiments/{summary.experiment_id}/peak-holders").json()
    (row,) = [e for e in listed if e["id"] == summary.experiment_id]
    assert row["spec"]["model"] == {"kind": "python", "target": f"{__name__}:_Net", "depth": 4, "kwargs": {}}
    assert row["status"] == "succeeded"
    # its memory timeline (issue 34): the peak step's, named after the caller's own modules
    assert timeline["step"] == timeline["peak_step"] and timeline["peak_bytes"] == summary.peak_allocated_bytes
    assert holders["peak_bytes"] == summary.peak_allocated_bytes
    assert sum(h["bytes"] for h in holders["holders"]) + holders["others_bytes"] == holders["peak_bytes"]
    assert {"stem.0", "layers.0.lin", "head"} <= {h["module"] for h in holders["holders"]}
    assert timeline["recomputations"] and "layers.3" in timeline["checkpoint_region"]


def test_profile_without_targets_and_with_blocks_named(database_url):
    url = database_url
    summary = ckptlab.profile(
        _Net(depth=6),
        torch.randn(4, 8),
        blocks="layers",
        strategy="sequential",
        segments=2,
        steps=2,
        timed_steps=0,
        verify_gradients=False,
        database_url=url,
    )
    assert summary.status == "succeeded", summary.error
    assert summary.activation_bytes > 0


def test_blocks_are_the_longest_container_of_same_type_children():
    assert find_blocks(_Net(depth=5)) == "layers"
    with pytest.raises(ValueError, match="pass blocks="):
        find_blocks(nn.Linear(2, 2))


def test_profile_finds_a_llamas_decoder_layers_with_a_dict_sample_and_the_dashboard_lists_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 100, (2, 16))
    url = f"sqlite:///{tmp_path / 'ckptlab.db'}"
    summary = ckptlab.profile(
        model, {"input_ids": ids, "labels": ids}, strategy="per_block", steps=2, timed_steps=1, database_url=url
    )
    assert summary.status == "succeeded", summary.error
    assert summary.model == f"LlamaForCausalLM ({params:,} parameters)"
    assert summary.blocks == "3 × LlamaDecoderLayer: transformers layout"
    assert summary.gradients_match is True and summary.activation_bytes > 0

    with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path))) as client:
        listed = client.get("/api/experiments", params={"strategy": "per_block"}).json()["data"]
    (row,) = [e for e in listed if e["id"] == summary.experiment_id]
    assert row["spec"]["model"]["target"].endswith(":LlamaForCausalLM") and row["spec"]["model"]["depth"] == 3
    assert row["summary"]["param_count"] == params and row["summary"]["model"] == summary.model
    assert row["spec"]["checkpoint"]["strategy"] == "per_block"


def test_profile_stores_in_the_dashboards_database_and_warns_when_it_creates_one(fresh_settings, tmp_path):
    fresh_settings.delenv("CKPTLAB_DATABASE_URL", raising=False)
    fresh_settings.setenv("CKPTLAB_DATA_DIR", str(tmp_path / "dash"))
    expected = f"sqlite:///{(tmp_path / 'dash' / 'ckptlab.db').resolve()}"  # what `ckptlab up` opens
    assert Settings().resolved_database_url == expected
    run = {"steps": 2, "timed_steps": 0, "verify_gradients": False}
    with pytest.warns(UserWarning, match="creating a new database .*dash/ckptlab.db.*CKPTLAB_DATABASE_URL"):
        first = ckptlab.profile(_Net(depth=2), torch.randn(2, 8), **run)
    assert (first.status, first.database_url) == ("succeeded", expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the database exists now: nothing to say
        second = ckptlab.profile(_Net(depth=2), torch.randn(2, 8), **run)
    assert second.database_url == expected and second.experiment_id == first.experiment_id + 1

    other = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    fresh_settings.setenv("CKPTLAB_DATABASE_URL", other)
    get_settings.cache_clear()
    with pytest.warns(UserWarning, match="elsewhere.db"):
        assert ckptlab.profile(_Net(depth=2), torch.randn(2, 8), **run).database_url == other


def test_a_long_profile_run_beside_a_dashboard_worker_is_never_taken_over(fresh_settings, database_url, data_dir):
    """The run outlasts several leases while a worker (with its reaper) polls the same
    database: it heartbeats, so it ends ``succeeded`` under its own id in its first attempt;
    a profile run whose process is gone is failed by that reaper meanwhile, not requeued."""
    fresh_settings.setenv("CKPTLAB_LEASE_S", str(LEASE_S))
    fresh_settings.setattr(_SlowBlock, "delay_s", 0.02)
    settings = Settings(database_url=database_url, data_dir=data_dir, lease_s=LEASE_S)
    me = in_process_worker_id()
    with _session(database_url) as s:
        gone = store.create_experiment(
            s, spec=make_spec(), status="running", worker_id=f"{queue.IN_PROCESS_PREFIX}gone:1"
        ).id
    started = time.monotonic()
    with worker_thread(settings, worker_id="dashboard"):
        # Registered (and migrated) before profile() migrates: alembic is not thread-safe.
        wait_for(lambda: _worker(database_url, "dashboard"), timeout=30, interval=0.05)
        summary = ckptlab.profile(
            _Net(depth=4, block=_SlowBlock),
            torch.randn(4, 8),
            strategy="per_block",
            steps=30,
            timed_steps=30,
            database_url=database_url,
        )
        dashboard = _worker(database_url, "dashboard")
    took = time.monotonic() - started
    assert took > 4 * LEASE_S, f"the run lasted {took:.1f} s, not several leases"
    assert summary.status == "succeeded", summary.error
    assert summary.gradients_match is True and summary.activation_bytes > 0
    assert dashboard.stopped_at is None  # the worker ran throughout (it marks itself stopped)
    with _session(database_url) as s:
        row = store.get_experiment(s, experiment_id=summary.experiment_id)
        assert (row.status, row.attempt, row.worker_id) == ("succeeded", 1, me)  # never claimed
        assert {st.attempt for st in s.query(Step).filter_by(experiment_id=row.id)} == {1}
        assert s.get(Worker, me).stopped_at is not None  # let go once the run ended
        lost = store.get_experiment(s, experiment_id=gone)
        assert (lost.status, lost.error, lost.attempt) == ("failed", queue.IN_PROCESS_LOST, 1)


def test_runs_of_one_process_share_its_worker_until_the_last_ends(database_url):
    settings = Settings(database_url=database_url, lease_s=LEASE_S)
    with in_process_owner(database_url, settings) as first:
        registered = _worker(database_url, first).heartbeat_at
        with in_process_owner(database_url, settings) as second:
            assert first == second == in_process_worker_id()
            wait_for(lambda: _worker(database_url, first).heartbeat_at > registered, timeout=5 * LEASE_S)
        assert _worker(database_url, first).stopped_at is None  # the other run still holds it
    assert _worker(database_url, first).stopped_at is not None


def test_a_run_interrupted_in_the_callers_process_is_recorded_and_the_interrupt_raised(database_url, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("ckptlab.worker.service.slots.execute_experiment", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ckptlab.profile(_Net(depth=2), torch.randn(2, 8), steps=2, database_url=database_url)
    with _session(database_url) as s:
        (row,), _total = store.list_experiments(s)
        assert row.status == "cancelled" and "interrupted in the process running ckptlab.profile" in row.error
        assert s.get(Worker, in_process_worker_id()).stopped_at is not None


def test_cancel_stops_a_profile_run_between_steps_and_its_history_says_so(fresh_settings, database_url):
    """``POST /cancel`` sets the flag; the run in the caller's process sees it between two
    steps and ends ``cancelled`` within a second or so, its steps so far kept (issue 33: it
    used to run on for minutes and end ``succeeded``)."""
    fresh_settings.setattr(_SlowBlock, "delay_s", 0.02)
    asked: list[float] = []

    def cancel_after_the_first_steps() -> None:
        def running():
            with _session(database_url) as s:
                rows = s.query(Step).all()
                return rows[0].experiment_id if len(rows) >= 3 else None

        exp_id = wait_for(running, timeout=120, interval=0.05)
        with _session(database_url) as s:
            queue.request_cancel(s, experiment_id=exp_id)
        asked.append(time.monotonic())

    import threading

    canceller = threading.Thread(target=cancel_after_the_first_steps)
    canceller.start()
    summary = ckptlab.profile(
        _Net(depth=4, block=_SlowBlock),
        torch.randn(4, 8),
        strategy="per_block",
        steps=500,
        timed_steps=500,
        database_url=database_url,
    )
    ended = time.monotonic()
    canceller.join()
    assert summary.status == "cancelled" and summary.error.startswith("cancelled while running")
    assert ended - asked[0] < 5  # a step or two after the flag, not the 1,000 steps asked for
    with _session(database_url) as s:
        steps = s.query(Step).filter_by(experiment_id=summary.experiment_id).count()
        history = [(e.status, e.reason) for e in events.history(s, experiment_id=summary.experiment_id)]
    assert 3 <= steps < 1000
    assert history[-1][0] == "cancelled" and history[-1][1].startswith("cancelled while running")
