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


@pytest.mark.parametrize("index", range(len(runnable_blocks())))
def test_guide_block_runs(index, tmp_path, guide_env):
    script = runnable_blocks()[index]
    result = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=guide_env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, (
        f"block {index} failed:\n{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr
