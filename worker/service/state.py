"""What a worker's slots share: the database, settings, stop requests and heartbeat."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.retry import with_retry
from ckptlab.settings import Settings
from ckptlab.worker.service.heartbeat import Heartbeat
from ckptlab.worker.service.outcome import RECORD_DEADLINE_S

__all__ = ["WorkerState"]

log = logging.getLogger("ckptlab.worker")


class WorkerState:
    """State shared by a worker's slots: database, settings, stop requests, heartbeat.

    ``stop`` set: claim nothing more; running experiments get ``shutdown_grace_s`` to
    finish, then are killed and requeued (rq's ``request_stop``). ``kill`` set: kill and
    requeue them now (rq's ``request_force_stop``).
    """

    def __init__(
        self,
        *,
        database_url: str,
        Session: sessionmaker[Session],
        settings: Settings,
        worker_id: str,
        stop: threading.Event,
        kill: threading.Event,
        poll_interval_s: float,
        max_experiments: int | None,
        exit_when_idle: bool,
        beat: Heartbeat,
    ):
        self.database_url = database_url
        self.Session = Session
        self.settings = settings
        self.worker_id = worker_id
        self.stop = stop
        self.kill = kill
        self.poll_interval_s = poll_interval_s
        self.max_experiments = max_experiments
        self.exit_when_idle = exit_when_idle
        self.beat = beat
        #: torch threads per CPU slot (the cores split between the CPU slots); None: torch's default.
        self.cpu_threads: int | None = None
        #: At most this many CPU experiments run at once (None: no limit); see run_worker.
        self.cpu_gate: threading.BoundedSemaphore | None = None
        self.started = 0
        self._lock = threading.Lock()
        self._stop_seen: float | None = None

    def take_ticket(self) -> bool:
        """Reserve one of ``max_experiments``; False when all are taken."""
        with self._lock:
            if self.max_experiments is not None and self.started >= self.max_experiments:
                return False
            self.started += 1
            return True

    def return_ticket(self) -> None:
        """Give back a ticket taken for a claim that found nothing."""
        with self._lock:
            self.started -= 1

    def lease_ok(self) -> bool:
        """Whether the last committed heartbeat is younger than the lease."""
        return self.beat.silent_for() < self.settings.lease_s

    def grace_over(self) -> bool:
        """After a stop request: whether ``shutdown_grace_s`` has passed since it was seen."""
        with self._lock:
            if self._stop_seen is None:
                self._stop_seen = time.monotonic()
            return time.monotonic() - self._stop_seen >= self.settings.shutdown_grace_s

    def record(self, fn: Any) -> None:
        """Run a store call with retries; log (not raise) when the database stays away."""
        try:
            with_retry(self.Session, fn, deadline_s=RECORD_DEADLINE_S)
        except Exception:  # noqa: BLE001 - the reaper recovers what could not be recorded
            log.exception("could not record an outcome")
