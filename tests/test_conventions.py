"""Conventions the code keeps as it grows: no function graded D or worse by radon, a small
run context, summaries and specs read through their typed models outside the store's edge,
and tests that wait on events rather than sleep."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_architecture import MODULES, ROOT, tracked_files


def test_no_test_synchronises_with_a_fixed_sleep() -> None:
    # Tests wait on events, not sleeps: a sleep in tests/ (time.sleep, asyncio/anyio.sleep,
    # Playwright's page.wait_for_timeout) must sit in a ``while`` loop that polls a condition
    # up to a deadline. The sleeps that are the scenario itself are listed, by function.
    scenario = {
        ("tests/worker/test_profile.py", "forward"): "_SlowBlock: a block slowed down on purpose",
        ("tests/worker/service/test_stall.py", "test_a_20_s_exclusive_lock_loses_no_work"): "the lock is held",
    }
    fixed: list[str] = []

    def visit(node: ast.AST, rel: str, func: str | None, polling: bool) -> None:
        for child in ast.iter_child_nodes(node):
            f, p = func, polling
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                f, p = getattr(child, "name", func), False
            elif isinstance(child, ast.While):
                p = True
            elif isinstance(child, ast.Call):
                callee = child.func
                name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
                if name in ("sleep", "wait_for_timeout") and not polling and (rel, func) not in scenario:
                    fixed.append(f"{rel}:{child.lineno}: {ast.unparse(child)}")
            visit(child, rel, f, p)

    for path in tracked_files("tests/*.py"):
        visit(ast.parse((ROOT / path).read_text(), filename=str(path)), path.as_posix(), None, False)
    assert not fixed, "fixed sleeps (wait on an event, or poll a condition with a deadline):\n" + "\n".join(fixed)


#: radon's cyclomatic-complexity grades: A 1-5, B 6-10, C 11-20, D 21-30, E 31-40, F 41+.
MAX_COMPLEXITY = 20
MAX_RUN_CONTEXT_LINES = 200


def test_no_function_is_graded_d_or_worse_by_radon() -> None:
    from radon.complexity import cc_visit

    complex_ = []
    for path in MODULES.values():
        for block in cc_visit((ROOT / path).read_text()):
            if block.complexity > MAX_COMPLEXITY:
                complex_.append(f"{path}:{block.lineno} {block.fullname} ({block.complexity})")
    assert not complex_, "split into named steps with one job each (radon grade D or worse):\n" + "\n".join(complex_)


def test_the_run_context_stays_small() -> None:
    # One run's objects and passes; its steps (worker/engine/step.py) and its summary
    # (worker/engine/summarize.py) live beside it.
    tree = ast.parse((ROOT / MODULES["ckptlab.worker.engine.context"]).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunContext"]
    assert cls.end_lineno - cls.lineno + 1 < MAX_RUN_CONTEXT_LINES


def test_summaries_and_specs_are_read_through_their_models() -> None:
    # The store's edge (ckptlab/db/models.py: Experiment.run_summary, .experiment_spec)
    # parses the JSON columns; every other reader reads typed records.
    raw = re.compile(r"summary\[|summary\.get\(|get_path\(")
    edge = {Path("ckptlab/db/models.py"), Path("ckptlab/summary.py")}
    hits = [
        f"{path}:{n}: {line.strip()}"
        for path in MODULES.values()
        if path not in edge
        for n, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if raw.search(line)
    ]
    assert not hits, "raw summary/spec reads outside the store's edge:\n" + "\n".join(hits)
