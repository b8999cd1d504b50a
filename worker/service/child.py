"""The child process a worker slot runs each experiment in.

Isolation: an out-of-memory kill, a segfault or a hang costs that experiment only.
Children come from a ``forkserver`` that was started once (a fresh interpreter, like
``spawn``) and has imported torch and :mod:`ckptlab.worker.engine.run`; forking a clean child from it
takes milliseconds where a ``spawn`` child spends ~2.5 s of CPU importing torch. (Where
``forkserver`` is missing, ``spawn``.) Children ignore SIGINT and SIGTERM (the worker
decides), and end at once when the worker dies, even by SIGKILL: they watch their job pipe
for EOF. Each runs its job under a host-memory cap (:func:`ckptlab.worker.measure.hostmem.apply_cap`), so
running out of memory costs that experiment only and is recorded ``oom``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from typing import Any

from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.store import get_experiment
from ckptlab.worker.measure.hostmem import apply_cap
from ckptlab.worker.service.outcome import Job, record_run

__all__ = ["Child", "child_main"]


def _exit_when_parent_goes(conn: Any) -> None:
    """Wait on the job pipe: EOF means the worker died (even by SIGKILL), so this child
    ends at once instead of running its experiment next to the attempt that replaces it."""
    try:
        conn.recv()
    except (EOFError, OSError):
        os._exit(70)


def child_main(conn: Any, database_url: str) -> None:
    """A pre-started child: warm up, wait for one job on ``conn``, run it, exit."""
    # The worker decides what a Ctrl-C or a SIGTERM sent to the whole process group (a
    # terminal, systemd's control-group kill) means: finish, or be killed and requeued.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import ckptlab.worker.engine.run  # noqa: F401 - imports torch; already imported under the forkserver

    # Connect to the database before any claim (no torch op: an idle child uses no CPU).
    engine = make_engine(database_url)
    Session = make_sessionmaker(engine)
    try:
        with Session() as s:
            get_experiment(s, experiment_id=0)
    except Exception:  # noqa: BLE001 - the job will retry and report
        pass
    try:
        job: Job = conn.recv()
    except (EOFError, OSError):
        return  # the worker closed the pipe: not needed
    threading.Thread(target=_exit_when_parent_goes, args=(conn,), daemon=True).start()
    if job.memory_limit_bytes is not None:  # before the run: its allocations past it fail here
        apply_cap(job.memory_limit_bytes)
    if job.cpu_threads:
        import torch

        torch.set_num_threads(job.cpu_threads)
    try:
        record_run(Session, job)
    finally:
        engine.dispose()


#: Imported once by the forkserver, so that forked children start warm: ``__main__`` (a
#: script that starts workers is then not re-imported per child), torch._dynamo (torch
#: imports it lazily at the first op under a dispatch mode: ~3 s of CPU), the engine, this
#: module and the database drivers (psycopg: ~0.1 s). Only imports: no torch op runs and no
#: connection is opened before the fork. A module that is not installed is skipped.
_PRELOAD = [
    "__main__",
    "torch._dynamo",
    "ckptlab.worker.engine.run",
    "ckptlab.worker.service.child",
    "ckptlab.worker.service.outcome",
    "ckptlab.worker.measure.hostmem",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
]

_ctx_lock = threading.Lock()
_ctx: Any = None


def _mp_context() -> Any:
    """The start method for children: forkserver preloading torch and the engine, else spawn."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            if "forkserver" in mp.get_all_start_methods():
                _ctx = mp.get_context("forkserver")
                _ctx.set_forkserver_preload(_PRELOAD)
            else:
                _ctx = mp.get_context("spawn")
        return _ctx


class Child:
    """A started child process and the parent's end of its job pipe."""

    def __init__(self, database_url: str):
        ctx = _mp_context()
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(child_conn, database_url), daemon=True)
        self.proc.start()
        child_conn.close()

    def send(self, job: Job) -> bool:
        """Hand over the job; False when the child is already gone."""
        try:
            self.conn.send(job)
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def close(self) -> None:
        """End an idle child (EOF on its pipe), killing it if it lingers."""
        self.conn.close()
        self.proc.join(5)
        if self.proc.is_alive():
            self.kill()
