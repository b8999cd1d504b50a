"""The layout holds by construction: import direction between the top-level packages, no
cycles, the vocabulary spelled once, and no source file over 450 lines.

See docs/architecture.md. The imports are read from the source (``ast``), including the
ones inside functions, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from ckptlab.domain import MemoryCategory
from ckptlab.strategies import BASELINE, STRATEGIES, SelectivePolicy
from ckptlab.sweeps import AXIS_NAMES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ckptlab", "worker", "backend", "cli")
#: Which top-level package may import which (the floor imports neither process).
ALLOWED = {
    "ckptlab": set(),
    "worker": {"ckptlab"},
    "backend": {"ckptlab"},
    "cli": {"ckptlab", "worker", "backend"},
}
#: The one exception: ``ckptlab/__init__.py`` re-exports the worker's public Python API
#: lazily (PEP 562 ``__getattr__``), so ``import ckptlab`` stays free of torch.
LAZY_FACADE = Path("ckptlab/__init__.py")
MAX_LINES = 450
STATUS_WORDS = ("queued", "running", "succeeded", "failed", "oom", "timed_out", "cancelled")


def tracked_files(*patterns: str) -> list[Path]:
    """Files git tracks (and untracked, not ignored ones) matching ``patterns``."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [Path(p) for p in out if (ROOT / p).is_file()]


def imported_packages(path: Path) -> set[str]:
    """Top-level packages among ``PACKAGES`` that ``path`` imports anywhere in its body."""
    tree = ast.parse((ROOT / path).read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in PACKAGES}
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down(package: str) -> None:
    wrong = {}
    for path in tracked_files(f"{package}/*.py"):
        if path == LAZY_FACADE:
            continue
        bad = imported_packages(path) - ALLOWED[package] - {package}
        if bad:
            wrong[str(path)] = sorted(bad)
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: {wrong}"


def test_lazy_facade_imports_the_worker_only_on_attribute_access() -> None:
    path = ROOT / LAZY_FACADE
    tree = ast.parse(path.read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("worker", "backend")) for n in top_level
    ), "ckptlab/__init__.py must import worker/backend inside __getattr__ only"


def test_no_import_cycles_between_top_level_packages() -> None:
    graph = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in tracked_files(f"{package}/*.py"):
            if path != LAZY_FACADE:
                graph[package] |= imported_packages(path) - {package}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    cycles = [p for p in PACKAGES if reaches(p, p)]
    assert not cycles, f"import cycle through {cycles}: {graph}"


def test_status_words_are_spelled_only_in_the_domain_module() -> None:
    literal = re.compile(r"""(["'])(""" + "|".join(STATUS_WORDS) + r""")\1""")
    allowed_py = {Path("ckptlab/domain.py")}
    hits = []
    for path in tracked_files("*.py", "*.js", "*.html"):
        if path in allowed_py or path.parts[0] == "tests" or "migrations" in path.parts:
            continue
        for n, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            if literal.search(line):
                hits.append(f"{path}:{n}: {line.strip()}")
    assert not hits, "status spelled outside ckptlab/domain.py:\n" + "\n".join(hits)


def test_memory_category_keys_are_spelled_only_in_the_domain_module() -> None:
    # A category key as a quoted word (a dict key, a tag, an array item) outside
    # ckptlab/domain.py is a second vocabulary; a column ``label: '...'`` is prose.
    words = "|".join(c.value for c in MemoryCategory)
    literal = re.compile(r"""(?<!label: )(["'])(""" + words + r""")\1""")
    hits = []
    for path in tracked_files("*.py", "*.js", "*.html"):
        if path == Path("ckptlab/domain.py") or path.parts[0] in ("tests", "bench") or "migrations" in path.parts:
            continue
        for n, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            if literal.search(line):
                hits.append(f"{path}:{n}: {line.strip()}")
    assert not hits, "memory category spelled outside ckptlab/domain.py:\n" + "\n".join(hits)


#: Where strategy and policy names may be spelled: the table, and example requests (data).
STRATEGY_HOMES = {Path("ckptlab/strategies.py"), Path("ckptlab/presets.py")}


def _product_files(*patterns: str) -> list[Path]:
    """Product source files (not tests, bench scripts or migrations) matching ``patterns``."""
    return [
        p
        for p in tracked_files(*patterns)
        if p.parts[0] not in ("tests", "bench") and "migrations" not in p.parts and p not in STRATEGY_HOMES
    ]


def _python_strings(path: Path) -> list[tuple[int, str]]:
    """(line, value) of the string constants in ``path``, docstrings left out (prose)."""
    tree = ast.parse((ROOT / path).read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_strategy_and_policy_names_are_spelled_only_in_the_strategy_table() -> None:
    # A name as a string ("sequential", 'save_matmuls') outside the table is a second
    # vocabulary. A name that is also another word ("none": CSS and English; "auto": a
    # device) counts only on a line about a strategy. Docstrings and comments are prose.
    shared = {BASELINE, "auto"}
    names = {n for n in STRATEGIES if n not in shared} | {p.value for p in SelectivePolicy}
    hits = []
    for path in _product_files("*.py"):
        lines = (ROOT / path).read_text().splitlines()
        for n, value in _python_strings(path):
            if value in names or (value in shared and "strateg" in lines[n - 1].lower()):
                hits.append(f"{path}:{n}: {lines[n - 1].strip()}")
    quoted = re.compile(r"""(["'`])(""" + "|".join(map(re.escape, sorted(names))) + r""")\1""")
    baseline = re.compile(r"""strateg.*(["'`])(""" + "|".join(sorted(shared)) + r""")\1""", re.IGNORECASE)
    comment = re.compile(r"^\s*(//|\*|/\*|<!--)")
    for path in _product_files("*.js", "*.html"):
        for n, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            if not comment.match(line) and (quoted.search(line) or baseline.search(line)):
                hits.append(f"{path}:{n}: {line.strip()}")
    assert not hits, "strategy or policy name spelled outside ckptlab/strategies.py:\n" + "\n".join(hits)


def test_the_frontend_holds_no_list_of_strategies_or_axes() -> None:
    # The form, charts and labels read /api/meta (strategy_table, sweep_axes): an array or
    # object literal in frontend/ that names two sweep axis paths (a copy of AXIS_NAMES in
    # ckptlab/sweeps.py) or two strategies is a second list.
    dotted = [p for p in AXIS_NAMES if "." in p]
    axis = re.compile(r"""(["'`])(""" + "|".join(map(re.escape, dotted)) + r""")\1""")
    strategy = re.compile(r"""(["'`])(""" + "|".join(map(re.escape, STRATEGIES)) + r""")\1""")
    literal = re.compile(r"\[[^\[\]]*\]|\{[^{}]*\}", re.DOTALL)
    copies = []
    for path in tracked_files("frontend/*.js", "frontend/*.html"):
        for span in literal.findall((ROOT / path).read_text()):
            for pattern in (axis, strategy):
                found = {m.group(2) for m in pattern.finditer(span)}
                if len(found) > 1:
                    copies.append(f"{path}: {sorted(found)}")
    assert not copies, "a list of strategies or axes in the frontend:\n" + "\n".join(copies)


def test_no_source_file_over_the_line_limit() -> None:
    long = {}
    for path in tracked_files("*.py", "*.js", "*.html", "*.css"):
        if "migrations" in path.parts:
            continue
        n = len((ROOT / path).read_text().splitlines())
        if n > MAX_LINES:
            long[str(path)] = n
    assert not long, f"files over {MAX_LINES} lines: {long}"
