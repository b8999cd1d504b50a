"""Named background loops that are watched (after procrastinate's ``worker.py``
``_start_side_tasks`` / ``_monitor_side_tasks``).

A :class:`SideTask` runs one pass (a callable) now and then every ``interval_s`` seconds in
a daemon thread. A pass that raises ends the loop: the exception is kept, logged at ERROR
with its traceback, and the owner is told through ``on_death``. The worker stops itself
then (its heartbeat, reaper or writer is gone, so it must not go on claiming); the
backend restarts the loop (``restart=True``), logging each restart. Transient errors a
pass expects (a locked database) are for the pass to catch; what escapes it is a bug or a
lasting failure, never silently swallowed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

__all__ = ["SideTask", "first_dead"]

log = logging.getLogger("ckptlab.side_tasks")


class SideTask:
    """A named loop calling ``step()`` every ``interval_s`` seconds until :meth:`stop`.

    Args:
        name: shown in logs and as the thread name (``ckptlab-<name>``).
        step: one pass; its exceptions end the loop (or restart it, see ``restart``).
        interval_s: seconds between the end of a pass and the start of the next (> 0).
        run_first: run a pass at once on :meth:`start` (default True) rather than after
            the first interval.
        restart: after a pass raised, log it and go on with the next pass (default False:
            the loop ends and :attr:`error` holds the exception).
        on_death: called with ``(task, exception)`` from the loop's thread when the loop
            ends because a pass raised (not on :meth:`stop`). Default: nothing more than
            the log line.

    Attributes:
        error: the exception that ended the loop, or None.
        restarts: passes that raised when ``restart`` is set.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        *,
        interval_s: float,
        run_first: bool = True,
        restart: bool = False,
        on_death: Callable[[SideTask, BaseException], None] | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.name = name
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self.restarts = 0
        self._step = step
        self._run_first = run_first
        self._restart = restart
        self._on_death = on_death
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"ckptlab-{name}", daemon=True)

    def start(self) -> SideTask:
        """Start the loop's thread; returns self."""
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the loop's thread is running."""
        return self._thread.is_alive()

    @property
    def dead(self) -> bool:
        """Whether the loop ended because a pass raised."""
        return self.error is not None and not self.alive

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the loop to end after its current pass and wait up to ``timeout_s`` for it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        if not self._run_first and self._stop.wait(self.interval_s):
            return
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - reported, never swallowed
                if self._restart:
                    self.restarts += 1
                    log.error("side task %s raised; restarting it (restart %d)", self.name, self.restarts, exc_info=exc)
                else:
                    self.error = exc
                    log.error("side task %s died: %s: %s", self.name, type(exc).__name__, exc, exc_info=exc)
                    if self._on_death is not None:
                        self._on_death(self, exc)
                    return
            if self._stop.wait(self.interval_s):
                return


def first_dead(tasks: Iterable[SideTask]) -> SideTask | None:
    """The first of ``tasks`` whose loop ended on an exception, or None (for a monitor that
    polls, such as the worker's main thread)."""
    return next((t for t in tasks if t.dead), None)
