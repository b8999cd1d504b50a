"""Shared fixtures: one per resource (database, API client, worker process, a registered
strategy, a registered model kind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from ckptlab.db.database import make_engine, make_sessionmaker, migrate
from ckptlab.settings import Settings
from ckptlab.spec import kinds
from ckptlab.spec.base import SpecInt
from ckptlab.strategies import Mechanism, Strategy, registered
from tests.postgres import PostgresCluster, find_pg_bin
from tests.support import stop_process

# Starlette's TestClient sends ``Host: testserver``; the API answers only its trusted hosts
# (ckptlab.settings.Settings.trusted_hosts). Tests of the host check set their own list.
os.environ.setdefault("CKPTLAB_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1,[::1]")


#: Seconds each test file took in a full ``make test`` (tests/file_seconds.json; files under
#: 5 s left out): under pytest-xdist the workers collect the files longest first.
FILE_SECONDS: dict[str, float] = json.loads((Path(__file__).parent / "file_seconds.json").read_text())


def pytest_collection_modifyitems(config, items):
    """Mark every test that takes :func:`cpu_load` ``alone`` (see :func:`pytest_runtest_protocol`),
    and skip tests marked ``gpu`` when CUDA is absent. Under pytest-xdist, order the files
    longest first (:data:`FILE_SECONDS`; a file's tests keep their order, an unlisted file
    counts 0 and runs last): ``make test`` hands out whole files in that order
    (``--dist loadfile --no-loadscope-reorder``), so no long file starts last and keeps one
    worker busy after the other has finished (the default order, most tests first, started
    the 90-second one-test files last)."""
    for item in items:
        if "cpu_load" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.alone)
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextmanager
def _xdist_turn(lock_dir: Path, *, alone: bool) -> Iterator[None]:
    """Hold the run's readers-writer lock (two ``flock`` files in ``lock_dir``, which every
    worker of the run shares) for one test: shared, or exclusive when ``alone``. The
    ``turn`` file queues them, so a test waiting to run alone is not starved by the other
    workers' shared turns: the workers finish the test they are in, then wait for it."""
    import fcntl

    with open(lock_dir / "ckptlab-turn.lock", "a") as turn, open(lock_dir / "ckptlab-tests.lock", "a") as tests:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turn, fcntl.LOCK_UN)
        yield  # closing the files releases both


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block, the previous count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under pytest-xdist (``make test``: ``-n auto``), a test marked ``alone`` runs with no
    other test beside it, its fixtures' setup and teardown included: the other workers wait.
    These are the tests that judge timings beside :func:`cpu_load`'s spinners; their
    tolerances hold for one spinner per core, not with another test's work on top (issue 31's
    ±15% passed 3 of 3 with the spinners alone, 1 of 4 with another session's tests beside
    them, docs/benchmarks.md), and the test of the run's own thread count. Without xdist
    tests run one at a time anyway.

    The other tests run with the cores shared out among the workers as torch threads (one
    each on 2 cores): two workers' torch ops on two threads each on two cores wait on each
    other at every op (the in-process engine tests took 4-9x longer that way)."""
    if not hasattr(item.config, "workerinput"):
        return (yield)
    alone = item.get_closest_marker("alone") is not None
    # The run's base temporary folder (each worker's is a folder in it): one per run.
    lock_dir = item.config._tmp_path_factory.getbasetemp().parent
    with _xdist_turn(lock_dir, alone=alone):
        if alone:
            return (yield)
        workers = int(item.config.workerinput.get("workercount", 1))
        with _torch_threads(max(1, (os.cpu_count() or 1) // workers)):
            return (yield)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket may connect anywhere (``socket.socket.connect`` and ``connect_ex`` raise)
    and the Hugging Face hub is offline (``HF_HUB_OFFLINE=1``): what runs under it proves
    that it downloads nothing."""
    import socket

    def refuse(self, address, *args, **kwargs):
        raise OSError(f"network access attempted in a test: connect({address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A fresh ckptlab data folder."""
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def database_url(data_dir: Path) -> str:
    """URL of a fresh, migrated SQLite database."""
    url = f"sqlite:///{data_dir / 'ckptlab.db'}"
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster for the whole session (see :mod:`tests.postgres`);
    skips when Debian's PostgreSQL server binaries are absent."""
    pg_bin = find_pg_bin()
    if pg_bin is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    cluster = PostgresCluster(pg_bin)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """URL of the session's throwaway PostgreSQL server (its ``postgres`` database)."""
    return postgres_cluster.url


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database_url(request: pytest.FixtureRequest, data_dir: Path) -> str:
    """URL of a fresh, migrated database: once SQLite, once PostgreSQL (a new database in the
    session's cluster)."""
    if request.param == "sqlite":
        url = f"sqlite:///{data_dir / 'ckptlab.db'}"
    else:
        url = request.getfixturevalue("postgres_cluster").create_database()
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    return url


def _session_on(url: str) -> Iterator[Session]:
    engine = make_engine(url)
    with make_sessionmaker(engine)() as session:
        yield session
    engine.dispose()


@pytest.fixture
def any_session(any_database_url: str) -> Iterator[Session]:
    """A session on :func:`any_database_url`."""
    yield from _session_on(any_database_url)


@pytest.fixture
def db_session(database_url: str) -> Iterator[Session]:
    """A session on the fresh database."""
    yield from _session_on(database_url)


@pytest.fixture
def settings(data_dir: Path, database_url: str) -> Settings:
    """Settings pointing at the fresh database."""
    return Settings(data_dir=data_dir, database_url=database_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """An in-process API client over the fresh database."""
    from ckptlab.backend.app import create_app

    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def worker_process(database_url: str, data_dir: Path) -> Iterator[subprocess.Popen]:
    """A real ``ckptlab worker`` process on the fresh database, stopped with SIGTERM."""
    env = {**os.environ, "CKPTLAB_DATABASE_URL": database_url, "CKPTLAB_POLL_INTERVAL_S": "0.1"}
    log = open(data_dir / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptlab.cli", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    yield proc
    stop_process(proc)
    log.close()


@pytest.fixture
def cpu_load() -> Iterator[int]:
    """A busy background load for the test: one spinning process per core (what a shared
    host does to timings); yields their count, and stops them."""
    n = os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def noop_strategy() -> Iterator[Strategy]:
    """A strategy added to the table for one test only, the way a new strategy is added
    (:func:`ckptlab.strategies.register_strategy`): it wraps no block, reads
    ``preserve_rng_state`` and ranks between sequential and per_block."""
    noop = Strategy(
        name="noop_test",
        summary="wrap no block (a test's strategy)",
        label="noop_test ({preserve_rng_state})",
        fields=("preserve_rng_state",),
        mechanism=Mechanism.KEEP,
        groups=lambda n, ck: [],
        rank=15,
    )
    with registered(noop):
        yield noop


class NoopModelSpec(BaseModel):
    """The model of the ``noop_model_kind`` fixture: ``depth`` blocks ``Linear(features,
    features)`` on inputs ``(B, features)``, regressing random targets of the same shape."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["noop_kind"] = "noop_kind"
    depth: SpecInt = Field(2, ge=1, le=16, description="linear blocks")
    features: SpecInt = Field(8, ge=1, le=64, description="features per block")


def build_noop_model(spec: NoopModelSpec):
    """The builder of the ``noop_model_kind`` fixture (``tests.conftest:build_noop_model``):
    no stem, ``depth`` linear blocks, no head; mean squared error against random targets."""
    import torch
    from torch import nn

    from ckptlab.worker.models.base import Built, Chain, default_loss

    def make_batch(batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch_size, spec.features)
        return torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)

    blocks = nn.Sequential(*[nn.Linear(spec.features, spec.features) for _ in range(spec.depth)])
    return Built(Chain(nn.Identity(), blocks, nn.Identity()), blocks, make_batch, default_loss)


@pytest.fixture
def noop_model_kind() -> Iterator[kinds.ModelKind]:
    """A model kind added to the table for one test only, the way a new kind is added
    (:func:`ckptlab.spec.kinds.register_model_kind`): ``noop_kind``, ``depth`` linear blocks
    of ``features`` features (:class:`NoopModelSpec`, built by :func:`build_noop_model`),
    ranked between mlp and resnet."""
    noop = kinds.ModelKind(
        name="noop_kind",
        spec=NoopModelSpec,
        summary="linear blocks (a test's kind)",
        label="{kind} {depth}×{features}",
        builder="tests.conftest:build_noop_model",
        count_parameters=lambda m: m.depth * (m.features * m.features + m.features),
        example={"depth": 3, "features": 16},
        rank=5,
    )
    with kinds.registered(noop):
        yield noop
