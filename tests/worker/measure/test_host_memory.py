"""Host-memory exhaustion is ``oom``, not ``failed``: each child runs under a data-size cap
(:mod:`ckptlab.worker.measure.hostmem`), and the worker goes on with the next experiment."""

from __future__ import annotations

import signal

import psutil
import pytest

from ckptlab.db import store
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.domain import FINISHED_STATUSES, Status
from ckptlab.settings import WORKER_MEMORY_SHARE, Settings, host_memory_bytes
from ckptlab.worker.measure import hostmem
from ckptlab.worker.service.slots import run_worker
from tests.factories import make_spec
from tests.support import in_process_worker, wait_for

MiB = 2**20


@pytest.fixture
def db(database_url):
    """A session factory on the test's SQLite database."""
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _create(Session, **spec) -> int:
    with Session() as s:
        return store.create_experiment(s, spec=make_spec(**spec)).id


def _row(Session, experiment_id):
    with Session() as s:
        return store.get_experiment(s, experiment_id=experiment_id)


def test_worker_memory_defaults_to_a_share_of_the_hosts_ram_and_reads_the_environment(monkeypatch):
    assert Settings().worker_memory_bytes == int(host_memory_bytes() * WORKER_MEMORY_SHARE) > 0
    assert WORKER_MEMORY_SHARE == 0.75  # the share the settings and the guides state
    monkeypatch.setenv("CKPTLAB_WORKER_MEMORY_BYTES", str(3 * 2**30))
    assert Settings().worker_memory_bytes == 3 * 2**30


def test_a_cpu_specs_lower_memory_limit_is_the_runs_limit_not_a_cuda_ones():
    spec = make_spec(memory_limit_bytes=100 * MiB)
    assert hostmem.run_memory_limit(spec, "cpu", 1000 * MiB) == 100 * MiB
    assert hostmem.run_memory_limit(spec, "cpu", 10 * MiB) == 10 * MiB
    assert hostmem.run_memory_limit(spec, "cuda:0", 1000 * MiB) == 1000 * MiB  # caps device memory there
    assert hostmem.run_memory_limit(make_spec(), "cpu", 1000 * MiB) == 1000 * MiB
    assert hostmem.runtime_headroom_bytes() >= hostmem.RUNTIME_HEADROOM_BYTES


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (MemoryError(), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough memory"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes."), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("can't allocate memory"), False),
    ],
)
def test_out_of_memory_errors_are_told_apart(exc, oom):
    assert hostmem.is_out_of_memory(exc) is oom


def test_a_sigkill_near_the_limit_is_out_of_memory():
    assert hostmem.killed_for_memory(-signal.SIGKILL, 90 * MiB, 100 * MiB)
    assert not hostmem.killed_for_memory(-signal.SIGKILL, 10 * MiB, 100 * MiB)  # killed for another reason
    assert not hostmem.killed_for_memory(-signal.SIGSEGV, 90 * MiB, 100 * MiB)
    assert not hostmem.killed_for_memory(-signal.SIGKILL, None, 100 * MiB)
    assert hostmem.proc_status_bytes("VmData") > 0 and hostmem.proc_status_bytes("VmHWM", 2**30) is None


def test_a_batch_over_the_cap_ends_oom_with_its_bytes_and_the_next_one_succeeds(db, database_url, data_dir):
    # The first Linear's input alone is 512 MiB (65536 x 2048 fp32), its output as much again.
    big = _create(db, steps=2, verify_gradients=False, batch_size=65536, **{"model.width": 2048, "model.depth": 1})
    ok = _create(db)
    limit = 64 * MiB
    settings = Settings(database_url=database_url, data_dir=data_dir, worker_memory_bytes=limit)
    ran = run_worker(database_url=database_url, exit_when_idle=True, settings=settings, devices=["cpu"])

    assert ran == 2
    row = _row(db, big)
    assert row.status == Status.OOM
    assert row.error.startswith("RunOutOfMemory: out of host memory")
    oom = row.summary["oom"]
    assert oom["phase"] in ("setup", "forward") and oom["step"] == 1
    assert oom["limit_bytes"] == limit
    assert oom["cap_bytes"] >= limit + hostmem.runtime_headroom_bytes()
    assert oom["requested_bytes"] >= 512 * MiB  # the allocation that failed
    assert 0 < oom["rss_bytes"] < oom["cap_bytes"]
    assert _row(db, ok).status == Status.SUCCEEDED


def _running_child() -> psutil.Process | None:
    """The forkserver child running an experiment (the warm idle one has a single thread)."""
    for p in psutil.Process().children(recursive=True):
        try:
            if "forkserver" in " ".join(p.parent().cmdline()) and p.num_threads() >= 3:
                return p
        except psutil.Error:
            continue
    return None


def test_a_child_killed_near_its_limit_is_oom_with_its_rss(db, database_url, data_dir):
    long_id = _create(db, steps=100_000, verify_gradients=False)
    ok = _create(db)
    # Far below what the runtime alone needs: any kill of this child is "near the limit".
    settings = Settings(database_url=database_url, data_dir=data_dir, worker_memory_bytes=1 * MiB)
    with in_process_worker(settings, exit_when_idle=True):

        def running():
            with db() as s:
                return store.last_step(s, experiment_id=long_id, attempt=1) >= 3 and _running_child()

        child = wait_for(running, timeout=60, interval=0.05)
        child.send_signal(signal.SIGKILL)  # as the kernel's OOM killer would
        row = wait_for(lambda: (r := _row(db, long_id)).status in FINISHED_STATUSES and r, timeout=30)
        wait_for(lambda: _row(db, ok).status in FINISHED_STATUSES, timeout=60)
    assert row.status == Status.OOM and "killed (exit code -9)" in row.error
    oom = row.summary["oom"]
    assert oom["limit_bytes"] == 1 * MiB and oom["rss_bytes"] > 1 * MiB and oom["step"] >= 3
    assert _row(db, ok).status == Status.SUCCEEDED
