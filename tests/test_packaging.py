"""Packaging: ``pip install .`` puts exactly one top-level name, ``ckptlab``, in site-packages,
with the repository's ``backend/``, ``worker/``, ``cli/`` and ``frontend/`` inside it as
``ckptlab.backend`` and so on (pyproject's ``package-dir``), and the console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_architecture import FOLDERS, ROOT, tracked_files

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    folders = {
        ".".join([FOLDERS[p.parts[0]], *p.parts[1:-1]])
        for p in tracked_files(*(f"{f}/*__init__.py" for f in FOLDERS))
        if "migrations" not in p.parts
    }
    assert folders == listed, f"listed but not a package: {listed - folders}; a package not listed: {folders - listed}"


@pytest.mark.slow
def test_a_built_wheel_holds_one_top_level_name_and_the_frontend(tmp_path: Path) -> None:
    # Build from a copy of the tracked files, so the tree's build/ and egg-info stay as they were.
    src = tmp_path / "src"
    for path in tracked_files():
        if path.parts[0] in (*FOLDERS, "README.md", "pyproject.toml"):
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, src / path)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("ckptlab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"ckptlab"}
    for module in ("ckptlab/worker/engine/run.py", "ckptlab/backend/app.py", "ckptlab/cli/main.py"):
        assert module in names
    assert "ckptlab/frontend/index.html" in names and "ckptlab/frontend/app.js" in names
    assert "ckptlab/migrations/env.py" in names
    assert "ckptlab = ckptlab.cli.main:main" in entry_points
