"""Shared fixtures: one per resource (database, API client, worker process)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from ckptlab.db.engine import make_engine, make_sessionmaker, migrate
from ckptlab.settings import Settings


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` when CUDA is absent."""
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


@pytest.fixture
def db_session(database_url: str) -> Iterator[Session]:
    """A session on the fresh database."""
    engine = make_engine(database_url)
    with make_sessionmaker(engine)() as session:
        yield session
    engine.dispose()


@pytest.fixture
def settings(data_dir: Path, database_url: str) -> Settings:
    """Settings pointing at the fresh database."""
    return Settings(data_dir=data_dir, database_url=database_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """An in-process API client over the fresh database."""
    from backend.app import create_app

    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def worker_process(database_url: str, data_dir: Path) -> Iterator[subprocess.Popen]:
    """A real ``ckptlab worker`` process on the fresh database, stopped with SIGTERM."""
    env = {**os.environ, "CKPTLAB_DATABASE_URL": database_url, "CKPTLAB_POLL_INTERVAL_S": "0.1"}
    log = open(data_dir / "worker.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ckptlab", "worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
