"""The reaper (a side task): requeues experiments whose worker fell silent, and fails the
in-process ``ckptlab.profile`` runs whose process did (see
:func:`ckptlab.db.queue.reap_lost`). Every worker runs one, and so does the backend, so
that lost experiments are recovered while anything at all is running."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.queue import reap_lost
from ckptlab.settings import Settings
from ckptlab.side_tasks import SideTask

__all__ = ["reaper_task", "reap_once"]

log = logging.getLogger("ckptlab.reaper")


def reap_once(Session: sessionmaker[Session], settings: Settings) -> int:
    """One reaper pass with the lease and attempt limit of ``settings``; returns how many
    experiments were requeued, failed or cancelled. Database errors are logged, not raised
    (the next pass tries again) and count as 0."""
    try:
        with Session() as session:
            n = reap_lost(session, lease_s=settings.lease_s, max_attempts=settings.max_attempts)
    except Exception:  # noqa: BLE001 - a reaper pass must never end its thread
        log.warning("reaper pass failed; retrying in %.1f s", settings.heartbeat_interval_s, exc_info=True)
        return 0
    if n:
        log.info("requeued or failed %d experiment(s) whose worker was lost", n)
    return n


def reaper_task(
    Session: sessionmaker[Session],
    settings: Settings,
    *,
    restart: bool = False,
    on_death: Callable[[SideTask, BaseException], None] | None = None,
) -> SideTask:
    """A side task named ``reaper`` running :func:`reap_once` now and every
    ``heartbeat_interval_s`` (``lease_s / 3`` by default) seconds; call ``start()`` on it.

    Args:
        Session: session factory of the shared database.
        settings: ``lease_s``, ``max_attempts`` and ``heartbeat_interval_s`` are used.
        restart: go on after a pass that raised (the backend); default False (the worker
            stops on ``on_death``).
        on_death: see :class:`ckptlab.side_tasks.SideTask`.
    """
    return SideTask(
        "reaper",
        lambda: reap_once(Session, settings),
        interval_s=settings.heartbeat_interval_s,
        restart=restart,
        on_death=on_death,
    )
