"""The public Python API's docstrings (``ckptlab.__all__``), as torch's ``mem_tracker.py``
writes them: an *Example usage* that runs as written (each is run here, in a fresh process),
*Known limitations*, and the strategy list of the table, not of a past version."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap

import pytest

import ckptlab
from ckptlab.strategies import STRATEGIES

PUBLIC = sorted(ckptlab.__all__)


def example_of(doc: str) -> str:
    """The indented block after ``Example usage::``, dedented."""
    match = re.search(r"Example usage::\n\n((?:[ \t]+.*\n|\n)+)", doc)
    assert match, "no 'Example usage::' block"
    return textwrap.dedent(match.group(1))


@pytest.mark.parametrize("name", PUBLIC)
def test_public_docstrings_have_an_example_and_known_limitations(name: str) -> None:
    doc = inspect.getdoc(getattr(ckptlab, name)) or ""
    assert "Known limitations:" in doc
    assert "Raises:" in doc and "Returns:" in doc
    assert example_of(doc).strip()


def test_the_profile_docstring_names_every_strategy_of_the_table() -> None:
    doc = inspect.getdoc(ckptlab.profile) or ""
    missing = [n for n in STRATEGIES if f"``{n}``" not in doc]
    assert not missing, f"ckptlab.profile's docstring does not name {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name", PUBLIC)
def test_the_example_runs_as_written(name: str, tmp_path) -> None:
    code = example_of(inspect.getdoc(getattr(ckptlab, name)) or "")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"example of {name} failed:\n{code}\n--- stderr\n{result.stderr[-3000:]}"
