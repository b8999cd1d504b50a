"""One fixture for the sharded runs the tests measure: each spec runs once per test run
(a run starts a process per rank: seconds each), whichever test asks first, on whichever
pytest-xdist worker (distributed/test_launch.py and predict/test_sharded.py measure the same
specs; measured twice when on different workers, the suite took 36 s more)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary
from ckptlab.worker.distributed import run_distributed


def _run_folder(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test run's own temporary folder: under pytest-xdist the one every worker's
    temporary folder is in (tests/conftest.py keeps its locks there too), else the base."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(scope="session")
def measured(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[ExperimentSpec], RunSummary]:
    """``run_distributed(spec)``, remembered by the spec (a deep copy each call): in memory,
    and as JSON in the test run's temporary folder that the workers share (a new folder each
    run: nothing carries over to the next). A worker that asks for a spec that another is
    measuring waits for its result (an exclusive ``flock`` per spec); a run that raises
    stores nothing."""
    folder = _run_folder(pytestconfig, tmp_path_factory) / "ckptlab-measured"
    folder.mkdir(exist_ok=True)
    done: dict[str, RunSummary] = {}

    def run(spec: ExperimentSpec) -> RunSummary:
        key = spec.model_dump_json()
        if key not in done:
            stored = folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
            with open(stored.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if stored.exists():
                    done[key] = RunSummary.model_validate_json(stored.read_text())
                else:
                    done[key] = run_distributed(spec)
                    partial = stored.with_suffix(f".{os.getpid()}.tmp")
                    partial.write_text(done[key].model_dump_json())
                    partial.replace(stored)
        return done[key].model_copy(deep=True)

    return run
