"""The user guide's commands, run as written (blocks marked ``<!-- run -->``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
BLOCK = re.compile(r"<!-- run -->\s*```bash\n(.*?)```", re.S)


def runnable_blocks() -> list[str]:
    return BLOCK.findall(GUIDE.read_text())


def test_guide_has_runnable_examples():
    assert len(runnable_blocks()) >= 4


@pytest.fixture
def guide_env(tmp_path):
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "CKPTLAB_DATA_DIR": str(tmp_path / "data"),
        "CKPTLAB_DATABASE_URL": "",
    }


def run_block(script: str, cwd: Path, env: dict[str, str]) -> str:
    """Run one guide block with ``bash -e`` in ``cwd``; its stdout (fails the test when the
    block fails or prints a traceback)."""
    result = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"block failed:\n{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def _is_the_pitfalls_block(block: str) -> bool:
    return "iter_loss += loss" in block and "outputs.append(out)" in block


@pytest.mark.parametrize("index", [i for i, block in enumerate(runnable_blocks()) if not _is_the_pitfalls_block(block)])
def test_guide_block_runs(index, tmp_path, guide_env):
    """Every block but the accumulation pitfalls' (run, and its output read, by the next test)."""
    run_block(runnable_blocks()[index], tmp_path, guide_env)


def test_the_accumulation_pitfalls_are_stated_as_measured(tmp_path, guide_env):
    """Issue 32: a running ``iter_loss += loss`` leaves live memory flat and fires nothing;
    outputs kept in a list climb by one output a step and fire ``memory_grows_per_step``.
    The guide says so, and its block measures both (in-process, ``ckptlab.profile``)."""
    text = GUIDE.read_text()
    assert "live memory\n  stays **flat**" in text and "**+640 B per step**" in text
    (block,) = [b for b in runnable_blocks() if _is_the_pitfalls_block(b)]
    lines = run_block(block, tmp_path, guide_env).splitlines()
    assert "iter_loss += loss: +0 B per step, 3 memory steps, []" in lines
    assert "outputs in a list: +640 B per step, 6 memory steps, ['memory_grows_per_step']" in lines


def test_every_image_the_readme_shows_is_a_screenshot_the_browser_tests_take():
    """Issue 32 item 7: the README's screenshots are the browser tests' (``make screenshots``
    regenerates every one), and the pages it promises are among them (the plan page)."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    shown = re.findall(r"\]\(docs/screenshots/([\w.-]+\.png)\)", readme)
    taken = set()
    for test in (root / "tests" / "frontend").glob("test_*.py"):
        taken |= set(re.findall(r'_screenshot\(page, "([\w.-]+\.png)"', test.read_text()))
    assert "plan.png" in shown
    for name in shown:
        assert name in taken, f"{name}: no browser test takes it, so make screenshots would never refresh it"
        assert (root / "docs" / "screenshots" / name).is_file(), name
