"""``migrate``: processes that start at once on a fresh SQLite file (a backend and a worker,
``ckptlab up``) all end with the newest schema; none fails with "table experiments already
exists" (the race CI hit in the backend-restart browser test)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from ckptlab.db.database import make_engine, migrate, schema_is_current


def _migrate_when_told(url: str, go: mp.synchronize.Event, out: mp.Queue) -> None:
    engine = make_engine(url)
    go.wait()
    try:
        migrate(engine)
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        engine.dispose()


def test_processes_migrating_a_fresh_sqlite_file_at_once_all_succeed(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    ctx = mp.get_context("spawn")  # imports done before the start signal, as two programs would
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_migrate_when_told, args=(url, go, out)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == ["ok"] * 4, results
    assert schema_is_current(make_engine(url))
