"""A worker's registration and heartbeat (a watched side task), and the shared one of a
process that runs its own experiments (:func:`in_process_owner`, for ``ckptlab.profile``)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db import queue
from ckptlab.db.database import make_engine, make_sessionmaker
from ckptlab.db.retry import with_retry
from ckptlab.settings import Settings
from ckptlab.side_tasks import SideTask

__all__ = ["Heartbeat", "in_process_owner", "in_process_worker_id"]

log = logging.getLogger("ckptlab.worker")


class _Stopping(Exception):
    """Raised inside a retrying beat once :meth:`Heartbeat.stop` was called."""


class Heartbeat:
    """Registers a worker in ``workers`` and heartbeats it every ``interval_s`` seconds from
    a :class:`~ckptlab.side_tasks.SideTask` named ``heartbeat``.

    A heartbeat that fails for a passing reason (database locked, unreachable) is retried
    with back-off (:func:`ckptlab.db.retry.with_retry`) until :attr:`retry_margin_s` before
    the lease would run out, counted from the last committed heartbeat; so a stall shorter
    than ``lease_s - interval_s`` (40 s with the default 60 s lease) always ends in a
    committed heartbeat before any reaper may requeue this worker's experiments. A beat
    that still fails is logged and the next one tries again; the slots act on
    :meth:`silent_for` against the lease. Anything else that escapes a beat ends the task
    and calls ``on_death``.

    Args:
        Session: session factory of the shared database.
        worker_id: the worker's id (``host:pid``).
        devices: recorded in ``workers.devices``.
        interval_s: seconds between heartbeats (``lease_s / 3`` by default settings).
        lease_s: the lease the beats keep (seconds); default ``3 * interval_s``.
        on_death: called with ``(task, exception)`` if the task dies.

    Raises:
        sqlalchemy.exc.OperationalError: the registration failed for longer than its retry
            deadline.
    """

    def __init__(
        self,
        Session: sessionmaker[Session],
        *,
        worker_id: str,
        devices: Sequence[str],
        interval_s: float,
        lease_s: float | None = None,
        on_death: Callable[[SideTask, BaseException], None] | None = None,
    ):
        self._Session = Session
        self.worker_id = worker_id
        self.lease_s = lease_s if lease_s is not None else 3 * interval_s
        #: a failing beat stops retrying this long before the lease would run out (seconds):
        #: one more try may block for the SQLite busy timeout, and must not outlive the lease.
        self.retry_margin_s = self.lease_s / 12
        self._stopping = False
        with_retry(Session, lambda s: queue.register_worker(s, worker_id=worker_id, **self._where(devices)))
        #: time.monotonic() at the start of the last heartbeat that was committed; its
        #: database time is no earlier, so the lease runs out here no later than for reapers.
        self.last_ok = time.monotonic()
        self.task = SideTask("heartbeat", self._beat, interval_s=interval_s, run_first=False, on_death=on_death)
        self.task.start()

    @staticmethod
    def _where(devices: Sequence[str]) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "devices": list(devices)}

    def silent_for(self) -> float:
        """Seconds since the start of the last committed heartbeat."""
        return time.monotonic() - self.last_ok

    def retry_deadline_s(self) -> float:
        """How long the next beat may retry: until :attr:`retry_margin_s` before the lease
        (counted from the last committed heartbeat) runs out; 0 (one try) once it has."""
        return max(0.0, self.last_ok + self.lease_s - self.retry_margin_s - time.monotonic())

    def _beat(self) -> None:
        tries: list[float] = []

        def beat(s: Session) -> None:
            if self._stopping:  # not transient: with_retry gives up at once
                raise _Stopping
            tries.append(time.monotonic())
            if not queue.heartbeat_worker(s, worker_id=self.worker_id):
                queue.register_worker(s, worker_id=self.worker_id, **self._where([]))

        try:
            with_retry(self._Session, beat, deadline_s=self.retry_deadline_s())
            # The start of the try that committed: its database time is no earlier.
            self.last_ok = tries[-1]
        except _Stopping:
            return
        except Exception:  # noqa: BLE001 - keep beating; slots act on a lost lease
            log.warning("heartbeat of %s failed (silent for %.1f s)", self.worker_id, self.silent_for(), exc_info=True)

    def stop(self) -> None:
        """Stop beating (a beat that is retrying gives up) and mark the worker stopped (best
        effort)."""
        self._stopping = True
        self.task.stop()
        try:
            with_retry(self._Session, lambda s: queue.stop_worker(s, worker_id=self.worker_id), deadline_s=5)
        except Exception:  # noqa: BLE001 - the lease runs out by itself
            log.warning("could not mark worker %s stopped", self.worker_id, exc_info=True)


def in_process_worker_id() -> str:
    """``profile:host:pid``: the worker id of this process's own runs
    (:data:`ckptlab.db.queue.IN_PROCESS_PREFIX`; reapers fail such a run once it is lost
    instead of requeueing it)."""
    return f"{queue.IN_PROCESS_PREFIX}{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Held:
    """An in-process worker that holds runs now: its heartbeat, the heartbeat's engine and
    how many runs use it."""

    beat: Heartbeat
    engine: Engine
    runs: int = 0


#: The in-process workers that hold runs now, by (database URL, pid).
_held: dict[tuple[str, int], _Held] = {}
_held_lock = threading.Lock()


@contextmanager
def in_process_owner(database_url: str, settings: Settings) -> Iterator[str]:
    """Hold this process's in-process worker on ``database_url`` while a run of its own
    goes on; yields its id (:func:`in_process_worker_id`) for the run's ``worker_id``.

    The first holder registers the worker and starts a :class:`Heartbeat` every
    ``settings.heartbeat_interval_s`` seconds, for ``settings.lease_s``; concurrent holders
    (threads) share it, and the last one to leave stops it and marks the worker stopped,
    so no run still going is left with a stopped worker. A run whose process dies stops
    heartbeating: reapers fail it after the lease (:func:`ckptlab.db.queue.reap_lost`).

    Raises:
        sqlalchemy.exc.OperationalError: the registration failed for longer than its retry
            deadline.
    """
    key = (database_url, os.getpid())  # a forked child has no heartbeat thread: its own
    with _held_lock:
        held = _held.get(key)
        if held is None:
            engine = make_engine(database_url)
            try:
                beat = Heartbeat(
                    make_sessionmaker(engine),
                    worker_id=in_process_worker_id(),
                    devices=[],
                    interval_s=settings.heartbeat_interval_s,
                    lease_s=settings.lease_s,
                )
            except BaseException:
                engine.dispose()
                raise
            held = _held[key] = _Held(beat, engine)
        held.runs += 1
    try:
        yield held.beat.worker_id
    finally:
        with _held_lock:
            held.runs -= 1
            if held.runs == 0:
                del _held[key]
                held.beat.stop()
                held.engine.dispose()
