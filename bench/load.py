"""A busy host for the benchmarks that measure under load: spinning processes beside them."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU while inside (one per core: what a shared host does
    to timings); stopped on the way out."""
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in loops:
        p.start()
    try:
        yield
    finally:
        for p in loops:
            p.terminate()
        for p in loops:
            p.join()
