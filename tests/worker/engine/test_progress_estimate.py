"""The step times a run's progress is estimated from (issue 32, item 8): each step record
carries its pass's recent step time (a paired timed step: its round, both steps), and the
first estimate of the README's first example is within 2x of the time that was left."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from ckptlab.analysis.progress import PASS_STEP_MS, run_progress
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.engine.run import run_experiment
from tests.factories import make_spec

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_first_spec() -> ExperimentSpec:
    """The spec of the README's first example (``cat > spec.json <<'EOF' ... EOF``)."""
    found = re.search(r"cat > spec\.json <<'EOF'\n(.*?)\nEOF", README.read_text(), re.S)
    assert found, "README.md has no `cat > spec.json <<'EOF'` example"
    return ExperimentSpec.model_validate(json.loads(found.group(1)))


def test_each_step_carries_its_pass_step_time_and_a_paired_step_counts_its_round() -> None:
    spec = make_spec(steps=4, warmup_steps=1, timed_steps=3, memory_early_stop=False, verify_gradients=False)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"strategy": "sequential"})})
    records: list[dict] = []
    summary = run_experiment(spec, on_step=records.append)
    memory, timed = records[:4], records[4:]
    assert PASS_STEP_MS not in memory[0]["extra"]  # the warm-up step: not what the rest takes
    assert memory[1]["extra"][PASS_STEP_MS] == memory[1]["step_ms"]
    partner = summary.paired_baseline_step_times_ms
    assert partner is not None and len(partner) == 3
    assert timed[0]["extra"][PASS_STEP_MS] == pytest.approx(timed[0]["step_ms"] + partner[0])


@pytest.mark.slow
def test_the_first_estimate_of_the_readmes_first_example_is_within_twice_the_time_left() -> None:
    spec = readme_first_spec()
    stored = spec.model_dump(mode="json")
    t0 = time.perf_counter()
    seen: list[tuple[float, float | None]] = []

    def on_step(record: dict) -> None:
        now = time.perf_counter() - t0
        p = run_progress(spec=stored, last_step=record["step"], last_extra=record["extra"], elapsed_s=now)
        seen.append((now, p.eta_s))
        assert p.total_steps == spec.steps + spec.timed_steps  # N fixed from the start

    run_experiment(spec, on_step=on_step)
    end = time.perf_counter() - t0
    at, eta = next((now, eta) for now, eta in seen if eta is not None)
    left = end - at
    assert left / 2 <= eta <= 2 * left, f"first estimate {eta:.1f} s with {left:.1f} s left"
