"""The reaper thread: requeues experiments whose worker fell silent (see
:func:`ckptlab.db.store.reap_lost`). Every worker runs one, and so does the backend, so
that lost experiments are recovered while anything at all is running."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.store import reap_lost
from ckptlab.settings import Settings

__all__ = ["start_reaper_thread", "reap_once"]

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


def start_reaper_thread(
    Session: sessionmaker[Session], settings: Settings, stop_event: threading.Event
) -> threading.Thread:
    """Start a daemon thread that runs :func:`reap_once` now and every ``lease_s / 3`` seconds.

    Args:
        Session: session factory of the shared database.
        settings: ``lease_s`` and ``max_attempts`` are used.
        stop_event: set it to end the thread (then ``join`` the returned thread).

    Returns:
        The started thread (named ``ckptlab-reaper``).
    """

    def loop() -> None:
        while True:
            reap_once(Session, settings)
            if stop_event.wait(settings.heartbeat_interval_s):
                return

    thread = threading.Thread(target=loop, name="ckptlab-reaper", daemon=True)
    thread.start()
    return thread
