"""Helpers for tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1):
    """Poll ``predicate()`` until it returns a truthy value; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s")


def age_lease(
    session: Session, *, experiment_id: int | None = None, worker_id: str | None = None, seconds: float
) -> None:
    """Move an experiment's claim (``started_at``) and/or a worker's last heartbeat
    ``seconds`` into the past, and commit: a lease runs out now instead of after a wait.
    (Imports the database layer only when called: this module is imported everywhere.)"""
    from sqlalchemy import update

    from ckptlab.db.models import Experiment, Worker, utcnow

    past = utcnow() - timedelta(seconds=seconds)
    if experiment_id is not None:
        session.execute(update(Experiment).where(Experiment.id == experiment_id).values(started_at=past))
    if worker_id is not None:
        session.execute(update(Worker).where(Worker.id == worker_id).values(heartbeat_at=past))
    session.commit()


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``proc`` and wait up to ``timeout`` s for it, then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def install_python_target(directory: Path, monkeypatch, *, module: str, source: str) -> str:
    """Write ``source`` as ``module`` in ``directory`` (put on ``sys.path`` by ``monkeypatch``,
    so forkserver children import it too); returns the ``python`` target ``module:factory``.
    Pop ``module`` from ``sys.modules`` when done."""
    (directory / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop(module, None)
    return f"{module}:factory"


def install_model_plugin(directory: Path, monkeypatch, *, name: str, module: str, source: str) -> str:
    """Install a distribution in ``directory`` (put on ``sys.path`` by ``monkeypatch``) whose
    ``ckptlab.models`` entry point ``name`` is ``module:factory`` with ``source`` as the
    module; returns ``name``. Pop ``module`` from ``sys.modules`` when done."""
    dist = directory / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[ckptlab.models]\n{name} = {module}:factory\n")
    install_python_target(directory, monkeypatch, module=module, source=source)
    return name


@contextmanager
def in_process_worker(settings, **run_kw) -> Iterator[tuple[threading.Event, threading.Event]]:
    """``ckptlab.worker.service.slots.run_worker`` on ``settings`` in a thread, on the CPU, polling every
    50 ms; yields its (stop, kill) events, and at the end sets both and joins it (60 s).

    ``run_kw`` go to ``run_worker`` (``cpu_slots``, ``max_experiments``, ``exit_when_idle`` ...).
    """
    from ckptlab.worker.service.slots import run_worker  # the worker's imports only where a worker runs

    stop, kill = threading.Event(), threading.Event()
    kwargs = dict(database_url=settings.database_url, settings=settings, poll_interval_s=0.05, devices=["cpu"])
    thread = threading.Thread(target=run_worker, kwargs={**kwargs, **run_kw, "stop_event": stop, "kill_event": kill})
    thread.start()
    try:
        yield stop, kill
    finally:
        stop.set()
        kill.set()
        thread.join(60)
    assert not thread.is_alive()


def alembic_to(engine: Any, revision: str, *, down: bool) -> None:
    """Move ``engine``'s schema to ``revision`` with Alembic (``down``: downgrade to it, else
    upgrade, e.g. to ``"head"``), in one transaction, as ``ckptlab.db.database.migrate`` does."""
    from alembic import command

    from ckptlab.db.database import _alembic_config

    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
