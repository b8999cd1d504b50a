"""The layout holds by construction: the arrows between units (subpackages by job) that
docs/architecture.md draws, no import cycle between any two modules, no crowded folder, the
vocabulary spelled once, and no source file over 450 lines.

See docs/architecture.md. The imports are read from the source (``ast``), including the
ones inside functions, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from ckptlab.domain import MemoryCategory
from ckptlab.spec.sweeps import AXIS_NAMES
from ckptlab.strategies import BASELINE, STRATEGIES, SelectivePolicy

ROOT = Path(__file__).resolve().parents[1]
#: Repository folder -> installed package (pyproject's package-dir): one top-level name.
FOLDERS = {
    "ckptlab": "ckptlab",
    "worker": "ckptlab.worker",
    "backend": "ckptlab.backend",
    "cli": "ckptlab.cli",
    "frontend": "ckptlab.frontend",
}
PROCESSES = ("ckptlab.worker", "ckptlab.backend", "ckptlab.cli", "ckptlab.frontend")
#: The floor's contracts: imported by every unit, importing none of ours.
CONTRACTS = {"ckptlab.domain", "ckptlab.strategies", "ckptlab.summary", "ckptlab.side_tasks"}
FLOOR = CONTRACTS | {
    "ckptlab.settings",
    "ckptlab.spec",
    "ckptlab.planning",
    "ckptlab.analysis",
    "ckptlab.prediction",
    "ckptlab.db",
}
#: Which unit (a subpackage, or a module beside them) may import which; docs/architecture.md
#: draws the same table. The floor (``ckptlab`` less its processes) imports neither process.
ALLOWED: dict[str, set[str]] = {
    **{c: set() for c in CONTRACTS},
    "ckptlab.settings": {"ckptlab.domain"},
    "ckptlab.planning": set(),
    "ckptlab.prediction": CONTRACTS,
    "ckptlab.spec": CONTRACTS | {"ckptlab.settings"},
    "ckptlab.analysis": CONTRACTS | {"ckptlab.settings", "ckptlab.spec"},
    "ckptlab.db": CONTRACTS | {"ckptlab.settings", "ckptlab.spec"},
    # the worker
    "ckptlab.worker.errors": CONTRACTS,
    "ckptlab.worker.models": CONTRACTS | {"ckptlab.spec"},
    "ckptlab.worker.measure": CONTRACTS | {"ckptlab.spec"},
    "ckptlab.worker.engine": FLOOR - {"ckptlab.db"}
    | {"ckptlab.worker.errors", "ckptlab.worker.measure", "ckptlab.worker.models"},
    "ckptlab.worker.predict": FLOOR - {"ckptlab.db"}
    | {
        "ckptlab.worker.engine",
        "ckptlab.worker.errors",
        "ckptlab.worker.measure",
        "ckptlab.worker.models",
        "ckptlab.worker.distributed",
    },
    "ckptlab.worker.distributed": FLOOR - {"ckptlab.db"}
    | {"ckptlab.worker.engine", "ckptlab.worker.errors", "ckptlab.worker.measure", "ckptlab.worker.models"},
    "ckptlab.worker.service": FLOOR
    | {"ckptlab.worker.engine", "ckptlab.worker.errors", "ckptlab.worker.measure", "ckptlab.worker.distributed"},
    "ckptlab.worker.progress_bar": FLOOR,
    "ckptlab.worker.profile": FLOOR | {"ckptlab.worker.models", "ckptlab.worker.service", "ckptlab.worker.predict"},
    "ckptlab.worker.predict_api": FLOOR | {"ckptlab.worker.models", "ckptlab.worker.predict"},
    "ckptlab.worker.cli": FLOOR
    | {"ckptlab.worker.service", "ckptlab.worker.progress_bar", "ckptlab.worker.predict_api"},
    # the backend
    "ckptlab.backend.encoding": FLOOR,
    "ckptlab.backend.middleware": FLOOR,
    "ckptlab.backend.schemas": FLOOR,
    "ckptlab.backend.services": FLOOR | {"ckptlab.backend.encoding", "ckptlab.backend.schemas"},
    "ckptlab.backend.deps": FLOOR | {"ckptlab.backend.middleware", "ckptlab.backend.services"},
    "ckptlab.backend.api": FLOOR
    | {"ckptlab.backend.deps", "ckptlab.backend.schemas", "ckptlab.backend.services", "ckptlab.backend.encoding"},
    "ckptlab.backend.app": FLOOR
    | {
        "ckptlab.backend.api",
        "ckptlab.backend.deps",
        "ckptlab.backend.encoding",
        "ckptlab.backend.middleware",
        "ckptlab.backend.services",
    },
    "ckptlab.backend.cli": FLOOR | {"ckptlab.backend.app"},
    # the command
    "ckptlab.cli": FLOOR | {"ckptlab.backend.cli", "ckptlab.worker.cli"},
}
#: The one exception: ``ckptlab/__init__.py`` re-exports the worker's public Python API
#: lazily (PEP 562 ``__getattr__``), so ``import ckptlab`` stays free of torch.
LAZY_FACADE = "ckptlab"
#: Python modules side by side in one folder, at most (``__init__`` not counted).
MAX_MODULES = 12
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


def product_modules() -> dict[str, Path]:
    """Installed module name -> source file, for every product module (not migrations)."""
    modules = {}
    for path in tracked_files(*(f"{folder}/*.py" for folder in FOLDERS)):
        if "migrations" in path.parts:
            continue
        name = ".".join([FOLDERS[path.parts[0]], *path.parts[1:]])[: -len(".py")]
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = product_modules()


def _resolve(name: str) -> str | None:
    """The product module ``name`` (a module, or an attribute of one) comes from."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> set[str]:
    """Product modules ``path`` imports anywhere in its body (inside functions too), by
    installed name. ``from pkg import mod`` counts as an import of ``pkg.mod``."""
    tree = ast.parse((ROOT / path).read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {_resolve(f"{node.module}.{a.name}") for a in node.names}
    return found - {None}


def module_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports. A module's own package is not an edge:
    importing ``a.b.c`` runs ``a/b/__init__.py`` first, whatever the module imports."""
    graph = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in imports_of(path) if m != name and not name.startswith(m + ".")}
    return graph


def unit_of(module: str) -> str:
    """The unit ``module`` belongs to: a subpackage, or a module beside the subpackages
    (``ckptlab.spec.limits`` -> ``ckptlab.spec``, ``ckptlab.worker.engine.run`` ->
    ``ckptlab.worker.engine``, ``ckptlab.domain`` -> itself)."""
    if module == "ckptlab.cli" or module.startswith("ckptlab.cli."):
        return "ckptlab.cli"  # the command: one unit
    depth = 3 if module.startswith(PROCESSES) else 2
    return ".".join(module.split(".")[:depth])


def test_no_import_of_the_repository_folders_by_their_own_names() -> None:
    # worker/, backend/, cli/ and frontend/ install as ckptlab.worker, ...: importing them
    # as ``worker`` from the repository root would load a second copy of each module.
    bare = re.compile(r"^\s*(from|import)\s+(worker|backend|cli|frontend)\b", re.MULTILINE)
    hits = [str(p) for p in tracked_files("*.py") if bare.search((ROOT / p).read_text())]
    assert not hits, f"import ckptlab.worker (etc.), not worker: {hits}"


def test_every_unit_is_in_the_table() -> None:
    units = {unit_of(m) for m in MODULES if m != LAZY_FACADE and m.count(".") >= 1}
    units -= {"ckptlab.worker", "ckptlab.backend", "ckptlab.frontend"}  # the packages themselves
    missing = {u for u in units if u not in ALLOWED}
    assert not missing, f"units without a row in ALLOWED (and docs/architecture.md): {sorted(missing)}"


def test_imports_point_down() -> None:
    wrong = []
    for module, imported in module_graph().items():
        if module == LAZY_FACADE:
            continue
        here = unit_of(module)
        for target in imported:
            there = unit_of(target)
            if there != here and there not in ALLOWED.get(here, set()):
                wrong.append(f"{module} -> {target} ({here} may not import {there})")
    assert not wrong, "imports against the table in docs/architecture.md:\n" + "\n".join(sorted(wrong))


def test_lazy_facade_imports_the_worker_only_on_attribute_access() -> None:
    path = ROOT / MODULES[LAZY_FACADE]
    tree = ast.parse(path.read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PROCESSES) for n in top_level), (
        "ckptlab/__init__.py must import the worker inside __getattr__ only"
    )


def test_no_import_cycle_between_any_two_modules() -> None:
    graph = module_graph()
    graph[LAZY_FACADE] = set()  # the facade imports the worker on attribute access only
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(cycles)


def test_no_folder_holds_more_than_a_dozen_modules() -> None:
    folders: dict[Path, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    crowded = {str(f): n for f, n in folders.items() if n > MAX_MODULES}
    assert not crowded, f"folders over {MAX_MODULES} modules: group them into subpackages by job: {crowded}"


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
STRATEGY_HOMES = {Path("ckptlab/strategies.py"), Path("ckptlab/spec/presets.py")}


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
    # ckptlab/spec/sweeps.py) or two strategies is a second list.
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


#: Where a model kind's name may be spelled: the model-kind table and example requests
#: (data). A spec class's ``kind: Literal["name"] = "name"`` line, its discriminator, too.
KIND_HOMES = {Path("ckptlab/spec/model_kinds.py"), Path("ckptlab/spec/presets.py")}
#: Kind names that are also other words, counted only on a line about a kind: ``python`` (an
#: environment key), ``resnet`` (an hf architecture, a preset), ``torchvision`` (a library).
KIND_SHARED = {"python", "resnet", "torchvision"}
KIND_LITERAL = re.compile(r"""^\s*kind: Literal\[(["'])\w+\1\]""")


def _model_kind_name_hits(paths: list[Path]) -> list[str]:
    """Lines of ``paths`` that spell a registered model kind's name as a quoted string."""
    from ckptlab.spec.kinds import model_kind_names

    names = set(model_kind_names())
    assert {"mlp", "hf"} <= names, "the built-in kinds are registered"
    own = names - KIND_SHARED

    def about_a_kind(line: str) -> bool:
        return "kind" in line.lower() and not KIND_LITERAL.match(line)

    hits = []
    for path in paths:
        lines = (ROOT / path).read_text().splitlines()
        if path.suffix == ".py":
            found = [(n, v) for n, v in _python_strings(path) if v in names]
            hits += [
                f"{path}:{n}: {lines[n - 1].strip()}"
                for n, v in found
                if not KIND_LITERAL.match(lines[n - 1]) and (v in own or about_a_kind(lines[n - 1]))
            ]
            continue
        quoted = re.compile(r"""(["'`])(""" + "|".join(sorted(names)) + r""")\1""")
        comment = re.compile(r"^\s*(//|\*|/\*|<!--)")
        for n, line in enumerate(lines, 1):
            words = {m.group(2) for m in quoted.finditer(line)}
            if not comment.match(line) and (words & own or (words and about_a_kind(line))):
                hits.append(f"{path}:{n}: {line.strip()}")
    return hits


def _kind_files() -> list[Path]:
    return [
        p
        for p in tracked_files("*.py", "*.js", "*.html")
        if p.parts[0] not in ("tests", "bench") and "migrations" not in p.parts and p not in KIND_HOMES
    ]


def test_model_kind_names_are_spelled_only_in_the_model_kind_table() -> None:
    # A kind's name as a string ("mlp", 'hf') outside its entry is a second vocabulary: code
    # asks the table (ckptlab.spec.kinds) or tests the spec class (isinstance). A name that
    # is also another word counts only on a line about a kind. Docstrings and comments are prose.
    hits = _model_kind_name_hits(_kind_files())
    assert not hits, "model kind spelled outside ckptlab/spec/model_kinds.py:\n" + "\n".join(hits)
