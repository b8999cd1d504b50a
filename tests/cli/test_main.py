"""``ckptlab run``: the table, the JSON summary, and exit code 2 with one line on bad input."""

import json
import re

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from ckptlab.cli.main import app
from ckptlab.db.database import make_engine
from ckptlab.db.models import Experiment
from ckptlab.settings import get_settings
from tests.factories import hf_model, spec_dict


@pytest.fixture
def cli(monkeypatch, data_dir):
    """Invoke the CLI with its data folder (and SQLite file) under ``data_dir``."""
    monkeypatch.setenv("CKPTLAB_DATA_DIR", str(data_dir))
    monkeypatch.delenv("CKPTLAB_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, list(args))

    yield invoke
    get_settings.cache_clear()


def write_spec(tmp_path, name="spec.json", **overrides):
    p = tmp_path / name
    p.write_text(json.dumps(spec_dict(**overrides)))
    return p


def stored_count(data_dir) -> int:
    db = data_dir / "ckptlab.db"
    if not db.exists():
        return 0
    engine = make_engine(f"sqlite:///{db}")
    try:
        from sqlalchemy import inspect

        if not inspect(engine).has_table("experiments"):
            return 0
        with engine.connect() as c:
            return c.scalar(select(func.count()).select_from(Experiment))
    finally:
        engine.dispose()


def run_json(cli, path) -> dict:
    result = cli("run", str(path), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_run_prints_table_and_json_summary(cli, tmp_path, data_dir):
    result = cli("run", str(write_spec(tmp_path, steps=3)), "--json")
    assert result.exit_code == 0, result.output
    assert "forward ms" in result.stdout
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "succeeded"
    assert summary["activation_bytes"] > 0
    assert summary["params_without_grad"] == 0
    assert stored_count(data_dir) == 1


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("architecture", ["llama", "resnet"])
def test_run_an_hf_model_from_its_config(cli, tmp_path, architecture):
    pytest.importorskip("transformers")
    spec = tmp_path / "hf.json"
    spec.write_text(
        json.dumps(
            spec_dict(
                steps=2,
                batch_size=2,
                model=hf_model(architecture),
                checkpoint={"strategy": "sequential", "segments": 2},
            )
        )
    )
    result = cli("run", str(spec), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "succeeded" and summary["gradients_match"] is True
    assert summary["activation_bytes"] > 0
    assert "gradients: match an un-checkpointed step" in result.stdout  # the verdict in the text, too


def test_run_says_where_the_peak_is_and_warns_about_a_setting_that_does_nothing(cli, tmp_path):
    spec = write_spec(
        tmp_path,
        steps=3,
        timed_steps=4,
        **{"model.depth": 72, "model.width": 200, "checkpoint.strategy": "sequential", "checkpoint.segments": 1},
    )
    result = cli("run", str(spec), "--json")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert "is in optimizer.step" in out and "checkpointing cannot lower this peak" in out
    assert "over 4 timed steps (tracker off)" in out
    assert "warning sequential_equals_none" in out
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["peak_phase"] == "optimizer" and summary["activation_bytes_at_peak"] == 0


def test_segments_law_at_the_edges(cli, tmp_path):
    """4 segments keep fewer activation bytes than no checkpointing; 1 segment keeps the
    same (PyTorch never checkpoints the last segment)."""
    depth = {"model.depth": 16, "model.width": 128, "batch_size": 32}
    none = run_json(cli, write_spec(tmp_path, "none.json", **depth))
    seg4 = run_json(
        cli, write_spec(tmp_path, "s4.json", **depth, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    )
    seg1 = run_json(
        cli, write_spec(tmp_path, "s1.json", **depth, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 1})
    )
    assert seg4["activation_bytes"] < 0.6 * none["activation_bytes"]
    assert seg1["activation_bytes"] == pytest.approx(none["activation_bytes"], rel=0.02)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"checkpoint.strategy": "sequential", "checkpoint.segments": 0}, "checkpoint.segments"),
        ({"checkpoint.strategy": "sequential", "checkpoint.segments": 9}, "checkpoint.segments"),
        ({"model.kind": "vit"}, "model.kind"),
        ({"checkpoint.segmnets": 2}, "checkpoint.segmnets"),
    ],
)
def test_bad_spec_exits_2_with_one_line_and_stores_nothing(cli, tmp_path, data_dir, overrides, field):
    result = cli("run", str(write_spec(tmp_path, **overrides)))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0]
    assert result.stdout == ""
    assert stored_count(data_dir) == 0


@pytest.mark.parametrize("content", [None, "{not json"])
def test_missing_or_malformed_file_exits_2(cli, tmp_path, data_dir, content):
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    result = cli("run", str(path))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert stored_count(data_dir) == 0


def test_worker_rejects_an_unknown_device_in_one_line(cli):
    result = cli("worker", "--devices", "tpu:0", "--once")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: unknown device 'tpu:0'; expected cpu, cuda or cuda:N"


def test_the_readmes_first_example_prints_what_checkpointing_saved(cli, tmp_path):
    """Issue 32, item 7: the first example a newcomer runs sets its peak with activations, and
    `ckptlab run` says what checkpointing saved against the reference forward."""
    from tests.worker.engine.test_progress_estimate import readme_first_spec

    spec = readme_first_spec()
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    result = cli("run", str(path))
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())
    saved = re.search(
        r"checkpointing saved ([\d.]+) MiB of activations: ([\d.]+) MiB kept instead of ([\d.]+) MiB", words
    )
    assert saved, words
    assert float(saved.group(2)) < 0.5 * float(saved.group(3))  # more than half of the activations saved
    assert "checkpointing cannot lower this peak" not in words
    assert re.search(r"peak [\d.]+ MiB is in \w+: activations \d+%", words), words  # they lead the peak
    assert "gradients: match" in words


def test_run_of_auto_prints_the_plans_predicted_against_its_paired_overhead(cli, tmp_path):
    """Issue 31 item 1: ``ckptlab run`` of strategy auto says which blocks its plan
    checkpointed and the overhead the plan predicted (with its interval) beside the one the
    run measured paired, in the same figures as the stored summary."""
    from ckptlab.worker.cli import selective_words
    from ckptlab.worker.engine.run import run_experiment
    from tests.factories import PLANNER_MODELS, make_spec

    kind = PLANNER_MODELS["mlp"]
    none = run_experiment(make_spec(**kind, verify_gradients=False)).dump()["peak_allocated_bytes"]
    auto = {"checkpoint.strategy": "auto", "checkpoint.budget_bytes": none * 9 // 10}
    spec = make_spec(**kind, verify_gradients=False, timed_steps=5, **auto)
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    result = cli("run", str(path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    words = " ".join(result.stdout.split())
    predicted, paired = summary["plan"]["predicted_overhead"], summary["paired_overhead"]
    assert summary["plan"]["checkpointed_blocks"]
    assert (
        f"auto plan: blocks {summary['plan']['checkpointed_blocks']} checkpointed"
        f"{selective_words(summary['plan'])}; step-time overhead "
        f"predicted {100 * predicted['estimate']:+.1f}% (95% CI {100 * predicted['low']:+.1f}% to "
        f"{100 * predicted['high']:+.1f}%), measured paired {paired['estimate_pct']:+.1f}% "
        f"(95% CI {paired['low_pct']:+.1f}% to {paired['high_pct']:+.1f}%)"
    ) in words, words


def test_selective_words_name_each_selective_block_in_block_order():
    from ckptlab.worker.cli import selective_words

    plan = {"selective_blocks": {"10": "save_matmuls", "2": "save_matmuls_and_attention"}}
    assert selective_words(plan) == " (selective: block 2 save_matmuls_and_attention, block 10 save_matmuls)"
    assert selective_words({"selective_blocks": {}}) == selective_words({}) == ""
