"""``ckptlab run``'s progress bar: how far along its fixed total of steps the run is, which pass
and step it is at and about how long is left, read from the steps the run has stored so far
(issues 23, 32). The arithmetic is :func:`ckptlab.analysis.progress.run_progress`, the same the
API answers for a running experiment.

Example usage::

    with RunProgressBar(Session, experiment_id, spec, console):
        execute_experiment(url, experiment_id, attempt)   # the bar follows its stored steps

Known Limitations:
    The bar reads the database every ``interval_s`` (0.5 s), so it trails the run by up to
    that; the estimate is the steps left times their pass's measured step time, and says
    "estimating" while the memory pass runs with timed steps to come (see
    :mod:`ckptlab.analysis.progress`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy.orm import Session, sessionmaker

from ckptlab.analysis.progress import RunProgress, run_progress
from ckptlab.db.store import latest_step_record

__all__ = ["RunProgressBar"]


class RunProgressBar:
    """A rich progress bar of one experiment's stored steps, updated from a thread.

    Args:
        Session: session factory of the database the run writes its steps to.
        experiment_id, attempt: the run.
        spec: its stored spec (a dict: ``steps``, ``timed_steps``).
        console: where to draw (rich draws nothing live when it is not a terminal).
        interval_s: seconds between reads (default 0.5).
    """

    def __init__(
        self,
        Session: sessionmaker[Session],
        experiment_id: int,
        attempt: int,
        spec: dict[str, Any],
        console: Console,
        interval_s: float = 0.5,
    ):
        self.Session, self.experiment_id, self.attempt, self.spec = Session, experiment_id, attempt, spec
        self.interval_s = interval_s
        self.progress = Progress(
            TextColumn("[bold]experiment {task.fields[id]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=console,
            transient=True,
        )
        self.task = self.progress.add_task("run", total=None, id=experiment_id, left="")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ckptlab-progress", daemon=True)
        self._t0 = time.monotonic()
        self.last: RunProgress | None = None

    def poll(self) -> RunProgress:
        """Read the latest step once and update the bar; returns what it shows."""
        with self.Session() as session:
            last = latest_step_record(session, experiment_id=self.experiment_id, attempt=self.attempt)
        p = run_progress(
            spec=self.spec,
            last_step=last[0] if last else None,
            last_extra=last[1] if last else None,
            elapsed_s=time.monotonic() - self._t0,
        )
        self.progress.update(self.task, completed=p.done_steps or 0, total=p.total_steps, left=p.words())
        self.last = p
        return p

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a missed read only delays the bar
                continue

    def __enter__(self) -> RunProgressBar:
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.progress.stop()
