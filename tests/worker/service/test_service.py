import logging

import pytest

from ckptlab.db.store import create_experiment, get_experiment, list_steps
from ckptlab.worker.service.slots import run_worker
from tests.factories import make_spec


def test_worker_runs_queued_experiments_and_survives_a_failure(database_url, db_session):
    bad = create_experiment(db_session, spec=make_spec(device="cuda"))  # fails on a CPU-only worker
    good = create_experiment(db_session, spec=make_spec(steps=4))
    import torch

    ran = run_worker(database_url=database_url, exit_when_idle=True, worker_id="test-worker")
    assert ran == 2
    db_session.expire_all()
    good_row = get_experiment(db_session, experiment_id=good.id)
    assert good_row.status == "succeeded"
    assert good_row.worker_id == "test-worker"
    assert good_row.summary["activation_bytes"] > 0
    assert [s.step for s in list_steps(db_session, experiment_id=good.id)] == [1, 2, 3, 4]
    bad_row = get_experiment(db_session, experiment_id=bad.id)
    if torch.cuda.is_available():
        assert bad_row.status == "succeeded"
    else:
        assert bad_row.status == "failed"
        assert "CUDA is not available" in bad_row.error
        assert bad_row.finished_at is not None


def test_crashed_child_marks_experiment_failed(database_url, db_session, monkeypatch):
    exp = create_experiment(db_session, spec=make_spec())
    # A child that dies without recording anything, like a segfault or the OOM killer.
    monkeypatch.setattr("ckptlab.worker.service.child.child_main", _die)
    run_worker(database_url=database_url, exit_when_idle=True)
    db_session.expire_all()
    row = get_experiment(db_session, experiment_id=exp.id)
    assert row.status == "failed"
    assert "exited with code 7" in row.error


def _die(*_args):
    import os

    os._exit(7)


def test_slots_one_per_device_and_cpu_slots_for_cpu():
    from ckptlab.worker.service.devices import slot_devices

    assert slot_devices(["cuda:0", "cuda:1"]) == ["cuda:0", "cuda:1"]
    assert slot_devices(["cpu"], cpu_slots=3) == ["cpu", "cpu", "cpu"]
    assert slot_devices(["cuda:0", "cpu", "cuda:0"], cpu_slots=2) == ["cuda:0", "cpu", "cpu"]
    for bad in (["tpu"], ["cpu:1"], ["cuda:x"], []):
        with pytest.raises(ValueError):
            slot_devices(bad)
    with pytest.raises(ValueError, match="cpu_slots"):
        slot_devices(["cpu"], cpu_slots=0)


def test_default_devices_follow_cuda_visible_devices(monkeypatch):
    from ckptlab.worker.service.devices import detect_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert detect_devices() == ["cuda:0", "cuda:1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_devices() == ["cpu"]


@pytest.mark.parametrize(
    ("spec_device", "slot", "expected"),
    [
        ("auto", "cuda:1", "cuda:1"),
        ("cuda", "cuda:1", "cuda:1"),
        ("cpu", "cuda:1", None),  # the spec's cpu
        ("auto", "cpu", "cpu"),
        ("cpu", "cpu", None),
        ("cuda", "cpu", None),  # left to the engine, which fails it without CUDA
    ],
)
def test_the_engine_gets_the_slot_device_where_the_spec_allows(spec_device, slot, expected):
    from ckptlab.worker.service.devices import engine_device

    assert engine_device(spec_device, slot) == expected


def test_a_side_task_that_dies_stops_the_worker_with_a_logged_reason(database_url, monkeypatch, caplog):
    import threading

    def broken(*_args, **_kwargs):
        raise TypeError("reap_lost() got an unexpected keyword argument")  # a bug, not a lock

    monkeypatch.setattr("ckptlab.db.reaper.reap_once", broken)
    ran: list[int] = []
    with caplog.at_level(logging.ERROR):
        t = threading.Thread(target=lambda: ran.append(run_worker(database_url=database_url, devices=["cpu"])))
        t.start()
        t.join(30)
    assert not t.is_alive(), "the worker kept running without its reaper"
    assert ran == [0]
    assert "side task reaper died (TypeError" in caplog.text and "stopping worker" in caplog.text


def _threads_reported(database_url, db_session, n, **worker_kw):
    """Run ``n`` tiny experiments through ``run_worker`` on cpu; each summary's
    ``environment.cpu_threads``."""
    ids = [create_experiment(db_session, spec=make_spec(seed=i)).id for i in range(n)]
    assert run_worker(database_url=database_url, exit_when_idle=True, devices=["cpu"], **worker_kw) == n
    db_session.expire_all()
    rows = [get_experiment(db_session, experiment_id=i) for i in ids]
    assert [r.status for r in rows] == ["succeeded"] * n
    return [r.summary["environment"]["cpu_threads"] for r in rows]


def test_cpu_slots_split_the_cores_between_their_children(database_url, db_session):
    import os

    threads = _threads_reported(database_url, db_session, 3, cpu_slots=2)
    assert threads == [max(1, (os.cpu_count() or 1) // 2)] * 3


def test_threads_per_slot_follow_the_option_then_the_setting(database_url, db_session, data_dir):
    from ckptlab.settings import Settings

    settings = Settings(database_url=database_url, data_dir=data_dir, worker_cpu_threads=3)
    assert _threads_reported(database_url, db_session, 1, cpu_slots=1, settings=settings) == [3]
    assert _threads_reported(database_url, db_session, 1, cpu_slots=1, cpu_threads=1, settings=settings) == [1]


def test_default_cpu_slots_are_one_per_four_cores(monkeypatch):
    from ckptlab.worker.service.devices import cpu_threads_per_slot, default_cpu_slots

    for cores, slots in [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (None, 1)]:
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        assert default_cpu_slots() == slots
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [cpu_threads_per_slot(n) for n in (1, 2, 4, 32)] == [16, 8, 4, 1]


def test_cpu_slots_beyond_the_cores_wait_for_a_free_core(database_url, db_session, monkeypatch, caplog):
    # 4 one-thread slots on 2 cores: at most 2 CPU experiments run at once.
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    ids = [create_experiment(db_session, spec=make_spec(seed=i)).id for i in range(6)]
    with caplog.at_level(logging.WARNING):
        ran = run_worker(database_url=database_url, exit_when_idle=True, devices=["cpu"], cpu_slots=4, cpu_threads=1)
    assert ran == 6
    assert "4 CPU slots of 1 torch threads on 2 cores: at most 2 CPU experiments run at once" in caplog.text
    db_session.expire_all()
    rows = [get_experiment(db_session, experiment_id=i) for i in ids]
    assert [r.status for r in rows] == ["succeeded"] * 6
    events = sorted([(r.started_at, 1) for r in rows] + [(r.finished_at, -1) for r in rows])
    running = [sum(d for _, d in events[: k + 1]) for k in range(len(events))]
    assert max(running) <= 2, events


def test_a_sharded_run_goes_through_the_worker_with_every_rank_stored(database_url, db_session):
    spec = make_spec(
        model={"kind": "mlp", "depth": 4, "width": 64, "dropout": 0.0},
        batch_size=4,
        checkpoint={"strategy": "per_block"},
        distributed={"kind": "fsdp2", "world_size": 2},
    )
    exp = create_experiment(db_session, spec=spec)
    assert run_worker(database_url=database_url, exit_when_idle=True, devices=["cpu"]) == 1
    db_session.expire_all()
    row = get_experiment(db_session, experiment_id=exp.id)
    assert row.status == "succeeded", row.error
    summary = row.run_summary
    assert [r.rank for r in summary.ranks] == [0, 1] and summary.global_batch_size == 8
    assert summary.sharded_gradients.match
    assert [s.step for s in list_steps(db_session, experiment_id=exp.id)] == [1, 2, 3]
