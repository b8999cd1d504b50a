"""Batched step writes off the training loop's hot path.

:class:`StepWriter` buffers step records in memory and a background thread inserts them in
batches (every ``flush_interval_s`` or as soon as ``batch_rows`` are waiting), so
``put`` never waits for the database. A locked or unreachable database is retried with
back-off (tenacity) and the records stay buffered meanwhile: none is dropped. After a try
whose commit outcome is unknown, inserts skip rows already stored, so the batch can be sent
again; otherwise they are plain inserts (no look-up of stored steps for the rollup).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.queue import get_run_state
from ckptlab.db.retry import with_retry
from ckptlab.db.store import add_steps
from ckptlab.worker.errors import RunCancelled

__all__ = ["StepWriter", "StepWriteError"]

log = logging.getLogger("ckptlab.db")

#: Most rows sent in one INSERT transaction.
_MAX_CHUNK = 4096
#: How often a writer with ``watch_cancel`` reads the cancel flag, seconds.
CANCEL_POLL_S = 0.5


class StepWriteError(RuntimeError):
    """Buffered steps could not be written before :meth:`StepWriter.close`'s timeout."""


class StepWriter:
    """Buffers step records of one attempt and inserts them in batches from a thread.

    Args:
        Session: session factory of the database.
        experiment_id: the experiment the steps belong to.
        attempt: the attempt they belong to.
        flush_interval_s: insert what is buffered at least this often, seconds (default 0.2).
        batch_rows: insert at once when this many records wait (default 256).
        retry_s: how long one batch is retried on a transient error before the thread
            backs off and tries again later, seconds (default 30). Records are kept.
        watch_cancel: the thread also reads the experiment's cancel flag, at most every
            :data:`CANCEL_POLL_S`, and the next :meth:`put` after it is set raises
            :class:`ckptlab.worker.errors.RunCancelled` (a run in its caller's process:
            ``ckptlab run``, ``ckptlab.profile``; default False).

    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        Session: sessionmaker[Session],
        *,
        experiment_id: int,
        attempt: int,
        flush_interval_s: float = 0.2,
        batch_rows: int = 256,
        retry_s: float = 30.0,
        watch_cancel: bool = False,
    ):
        self._Session = Session
        self.experiment_id = experiment_id
        self.attempt = attempt
        self.flush_interval_s = flush_interval_s
        self.batch_rows = batch_rows
        self.retry_s = retry_s
        self.written = 0
        self._pending: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._unsure = False  # a write failed and may have committed: skip stored steps next time
        self.watch_cancel = watch_cancel
        self._cancel_seen = threading.Event()
        self._cancel_read_at = 0.0
        self._thread = threading.Thread(target=self._run, name=f"ckptlab-steps-{experiment_id}", daemon=True)

    def start(self) -> StepWriter:
        """Start the writer thread; returns self."""
        self._thread.start()
        return self

    def put(self, record: Mapping[str, Any]) -> None:
        """Buffer one step record (see :func:`ckptlab.db.store.add_steps`); never blocks on I/O.

        Raises:
            RunCancelled: with ``watch_cancel``, the experiment's cancel flag was seen set
                (this record is buffered first: the steps that ran are kept).
        """
        with self._lock:
            self._pending.append(record)
            full = len(self._pending) >= self.batch_rows
        if full:
            self._wake.set()
        if self._cancel_seen.is_set():
            raise RunCancelled(f"cancelled while running (attempt {self.attempt})")

    @property
    def pending(self) -> int:
        """Records buffered and not yet committed."""
        with self._lock:
            return len(self._pending)

    def close(self, *, timeout_s: float = 120.0) -> int:
        """Write everything buffered, stop the thread; returns the number of rows written.

        Args:
            timeout_s: keep retrying a failing database for at most this long (default 120 s).

        Raises:
            StepWriteError: records were still unwritten after ``timeout_s``.
        """
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s + 5)
        left = self.pending
        if left:
            raise StepWriteError(
                f"{left} step record(s) of experiment {self.experiment_id} attempt {self.attempt} "
                f"could not be written within {timeout_s:.0f} s"
            )
        return self.written

    def __enter__(self) -> StepWriter:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            closing = self._closing.is_set()
            ok = self._flush()
            if self.watch_cancel and not closing:
                self._read_cancel()
            if closing and (not self.pending or time.monotonic() >= self._deadline):
                return
            if not ok:  # back off before the next round of retries; records stay buffered
                self._closing.wait(min(1.0, self.flush_interval_s * 5))

    def _read_cancel(self) -> None:
        """Read the cancel flag (at most every :data:`CANCEL_POLL_S`); a failed read is retried
        at the next round."""
        now = time.monotonic()
        if now - self._cancel_read_at < CANCEL_POLL_S:
            return
        self._cancel_read_at = now
        try:
            with self._Session() as s:
                state = get_run_state(s, experiment_id=self.experiment_id)
        except Exception:  # noqa: BLE001 - the next round reads again
            log.debug("reading the cancel flag of experiment %s failed", self.experiment_id, exc_info=True)
            return
        if state is not None and state.cancel_requested:
            self._cancel_seen.set()

    def _flush(self) -> bool:
        """Insert buffered records in chunks; returns False when the database kept failing."""
        while True:
            with self._lock:
                chunk = self._pending[:_MAX_CHUNK]
            if not chunk:
                return True
            deadline_s = min(self.retry_s, max(0.0, self._deadline - time.monotonic()))
            tries = itertools.count()

            def write(s: Session, chunk: list = chunk, tries: itertools.count = tries) -> int:
                # Only a try after one whose outcome is unknown can meet steps already
                # stored: it skips them (a look-up per batch); a first try after writes that
                # all committed is a plain insert.
                unsure = self._unsure or next(tries) > 0
                return add_steps(
                    s, experiment_id=self.experiment_id, attempt=self.attempt, records=chunk, skip_existing=unsure
                )

            try:
                with_retry(self._Session, write, deadline_s=deadline_s)
            except Exception:  # noqa: BLE001 - keep the records and try again later
                self._unsure = True
                log.warning("writing %d step(s) failed; keeping them buffered", len(chunk), exc_info=True)
                return False
            self._unsure = False  # this chunk holds every record tried before: all stored now
            with self._lock:
                del self._pending[: len(chunk)]
            self.written += len(chunk)
