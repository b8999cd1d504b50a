"""The ``ckptlab`` command: the worker's commands (``worker``, ``run``), the backend's
(``serve``), the database's (``db rebuild-rollups``) and ``up``, which migrates the
database once and starts both processes.

Exit codes: 0 success, 1 the experiment failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Annotated

import typer
from rich.console import Console

from ckptlab.backend.cli import app as backend_app
from ckptlab.backend.cli import serve_forever, settings_with
from ckptlab.db.cli import app as ckptlab_app
from ckptlab.db.database import Database
from ckptlab.worker.cli import app as worker_app

__all__ = ["app", "main"]

app = typer.Typer(
    help="Activation-checkpointing experiments: memory against recomputation time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(worker_app)
app.add_typer(backend_app)
app.add_typer(ckptlab_app)
console = Console()


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
) -> None:
    """Start the backend and one worker on an embedded SQLite database under ./data."""
    s = settings_with(host, port)
    with Database(s.resolved_database_url) as db:
        db.ensure_schema()  # once, before two processes would race to do it
    env = {**os.environ, "CKPTLAB_DATABASE_URL": s.resolved_database_url}
    worker_proc = subprocess.Popen([sys.executable, "-m", "ckptlab.cli", "worker"], env=env)
    console.print(f"ckptlab is up: http://{s.host}:{s.port}  (database {s.resolved_database_url})")
    sys.stdout.flush()
    # uvicorn re-raises the SIGTERM it captured once it has shut down; make that an exit so
    # the finally below stops the worker instead of leaving it orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve_forever(s)
    finally:
        worker_proc.send_signal(signal.SIGTERM)
        try:
            # the worker gives a running experiment shutdown_grace_s, then requeues it
            worker_proc.wait(timeout=s.shutdown_grace_s + 10)
        except subprocess.TimeoutExpired:
            worker_proc.kill()


def main() -> None:
    """Console-script entry point."""
    app()
