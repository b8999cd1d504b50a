"""One fixture for the sharded runs the tests measure: each spec runs once per session
(a run starts a process per rank: seconds each), whichever test asks first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary
from ckptlab.worker.distributed import run_distributed


@pytest.fixture(scope="session")
def measured() -> Callable[[ExperimentSpec], RunSummary]:
    """``run_distributed(spec)``, remembered by the spec (a deep copy each call)."""
    done: dict[str, RunSummary] = {}

    def run(spec: ExperimentSpec) -> RunSummary:
        key = spec.model_dump_json()
        if key not in done:
            done[key] = run_distributed(spec)
        return done[key].model_copy(deep=True)

    return run
