"""Two ways to run a claimed attempt behind one ``execute(job)`` (after rq's ``Worker`` /
``SimpleWorker``), both recording through :func:`ckptlab.worker.service.outcome.record_run`:

- :class:`InProcessRunner`: in this process (``ckptlab run``, ``execute_experiment``);
- :class:`ChildRunner`: in a pre-started child process (a worker slot), watched for
  cancel, timeout, lost lease and shutdown; what the child could not record (it was
  killed, or died) the runner records.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.queue import RunState, finish_experiment, get_run_state, requeue_experiment
from ckptlab.db.store import get_experiment, last_step
from ckptlab.domain import Status
from ckptlab.settings import Settings
from ckptlab.summary import RunSummary
from ckptlab.worker.measure.hostmem import killed_for_memory, proc_status_bytes
from ckptlab.worker.service.child import Child
from ckptlab.worker.service.devices import default_worker_id
from ckptlab.worker.service.heartbeat import Heartbeat
from ckptlab.worker.service.outcome import Job, record_run
from ckptlab.worker.service.state import WorkerState

__all__ = ["InProcessRunner", "ChildRunner", "POLL_RUNNING_S"]

log = logging.getLogger("ckptlab.worker")

#: How often a slot re-reads its running experiment (cancel flag, lease), seconds.
POLL_RUNNING_S = 0.25


class InProcessRunner:
    """Runs a job in the calling process, heartbeating for it unless told not to.

    Args:
        Session: session factory of the database holding the experiment.
        settings: ``heartbeat_interval_s`` and ``lease_s`` are used.
        heartbeat: register the experiment's ``worker_id`` as a worker and heartbeat it
            while running, so that reapers do not take the experiment away (default True).
    """

    def __init__(self, Session: sessionmaker[Session], settings: Settings, *, heartbeat: bool = True):
        self.Session = Session
        self.settings = settings
        self.heartbeat = heartbeat

    def execute(self, job: Job) -> Status:
        """Run ``job`` to its end and return the recorded status.

        Raises:
            LookupError: no experiment with this id.
        """
        beat = None
        try:
            if self.heartbeat:
                with self.Session() as s:
                    exp = get_experiment(s, experiment_id=job.experiment_id)
                    wid = (exp.worker_id if exp else None) or default_worker_id()
                beat = Heartbeat(
                    self.Session,
                    worker_id=wid,
                    devices=[job.device or "auto"],
                    interval_s=self.settings.heartbeat_interval_s,
                    lease_s=self.settings.lease_s,
                )
            return record_run(self.Session, dataclasses.replace(job, watch_cancel=True))  # no slot to kill it
        finally:
            if beat is not None:
                beat.stop()


class ChildRunner:
    """Runs one job at a time in a warm child process for a worker slot.

    The next child is started while the current experiment runs, so it is connected and
    waiting by the next claim (a claim reaches its first step in well under a second).

    Args:
        w: the worker's shared state (database, stop requests, lease).
    """

    def __init__(self, w: WorkerState):
        self.w = w
        self.child: Child | None = Child(w.database_url)

    def execute(self, job: Job, *, timeout_s: float, prestart: bool = True) -> Status | None:
        """Run ``job`` in the warm child and wait for it, polling every ``POLL_RUNNING_S``.

        Args:
            job: the claimed attempt.
            timeout_s: kill it and record ``timed_out`` after this many seconds.
            prestart: start the next child once this one has its job (default True).

        Returns:
            The status this runner recorded (``cancelled``, ``timed_out``, ``oom`` for a
            child killed by SIGKILL near its memory limit, with ``phase`` None, ``step`` the
            last stored step, ``rss_bytes`` its peak RSS as last read every
            ``POLL_RUNNING_S`` and ``limit_bytes``; ``failed`` for a child that died
            otherwise), or None when the child recorded its own outcome or the
            attempt was requeued or taken away.
        """
        w = self.w
        child = self.child
        if child is None or not child.proc.is_alive():
            if child is not None:
                child.close()
            child = Child(w.database_url)
        if not child.send(job):
            child.kill()
            child = Child(w.database_url)
            child.send(job)
        deadline = time.monotonic() + timeout_s
        self.child = Child(w.database_url) if prestart else None
        return self._watch(child, job, deadline=deadline, timeout_s=timeout_s)

    def close(self) -> None:
        """End the idle warm child."""
        if self.child is not None:
            self.child.close()
            self.child = None

    def _finish(self, job: Job, status: Status, error: str, summary: RunSummary | None = None) -> Status:
        exp_id, attempt = job.experiment_id, job.attempt
        self.w.record(
            lambda s: finish_experiment(
                s, experiment_id=exp_id, attempt=attempt, status=status, error=error, summary=summary
            )
        )
        return status

    def _killed_for_memory(self, job: Job, code: int | None, rss: int | None) -> Status:
        """Record a child the kernel killed near its memory limit as ``oom`` (a no-op when
        the child did record an outcome)."""
        exp_id, attempt = job.experiment_id, job.attempt
        try:
            with self.w.Session() as s:
                steps = last_step(s, experiment_id=exp_id, attempt=attempt)
        except Exception:  # noqa: BLE001 - the step is a detail; the outcome matters
            steps = None
        details = {"phase": None, "step": steps, "rss_bytes": rss, "limit_bytes": job.memory_limit_bytes}
        error = (
            f"RunOutOfMemory: the experiment's process was killed (exit code {code}) at a peak "
            f"RSS of {rss} bytes, near its memory limit of {job.memory_limit_bytes} bytes"
        )
        log.warning("experiment %s was killed out of memory (peak RSS %s bytes)", exp_id, rss)
        return self._finish(job, Status.OOM, error, RunSummary(oom=details))

    def _watch(self, child: Child, job: Job, *, deadline: float, timeout_s: float) -> Status | None:
        """Wait for the child, polling for cancel, lease, timeout and shutdown."""
        rss: int | None = None  # the child's peak RSS (VmHWM) as last read, bytes
        while True:
            # Read before waiting: a child killed within its first poll still has a reading.
            rss = _higher(rss, proc_status_bytes("VmHWM", child.proc.pid))
            child.proc.join(POLL_RUNNING_S)
            if not child.proc.is_alive():
                return self._exited(child, job, rss)
            stop, status = self._poll(child, job, deadline=deadline, timeout_s=timeout_s)
            if stop:
                return status

    def _poll(self, child: Child, job: Job, *, deadline: float, timeout_s: float) -> tuple[bool, Status | None]:
        """One look at a running child: ``(stop watching, the status recorded)``; the child
        is killed when watching stops."""
        if not self.w.lease_ok():
            log.warning(
                "lease lost (no heartbeat for %.1f s); killing experiment %s",
                self.w.beat.silent_for(),
                job.experiment_id,
            )
            child.kill()
            return True, None
        state = self._run_state(job)
        if state is not None:
            stop, status = self._judge_state(child, job, state)
            if stop:
                return stop, status
        if time.monotonic() >= deadline:
            child.kill()
            log.info("experiment %s timed out", job.experiment_id)
            return True, self._finish(job, Status.TIMED_OUT, f"timed out: killed after {timeout_s:g} s (timeout_s)")
        if self.w.kill.is_set() or (self.w.stop.is_set() and self.w.grace_over()):
            self._requeue(child, job)
            return True, None
        return False, None

    def _run_state(self, job: Job) -> RunState | None:
        """The experiment's run state as stored, or None when it cannot be read."""
        try:
            with self.w.Session() as s:
                return get_run_state(s, experiment_id=job.experiment_id)
        except Exception:  # noqa: BLE001 - the lease check covers a lost database
            return None

    def _judge_state(self, child: Child, job: Job, state: RunState) -> tuple[bool, Status | None]:
        """Act on the stored run state: ``(stop watching, the status recorded)``. Stops when
        the attempt was taken away, the child recorded its outcome, or a cancel was asked."""
        exp_id, attempt = job.experiment_id, job.attempt
        if state.status == Status.QUEUED or state.attempt != attempt or state.worker_id != self.w.worker_id:
            log.warning("experiment %s attempt %s was taken away (%s); killing it", exp_id, attempt, state)
            child.kill()
            return True, None
        if state.status != Status.RUNNING:  # the child recorded its outcome
            child.proc.join(10)
            child.kill()
            return True, None
        if state.cancel_requested:
            child.kill()
            log.info("experiment %s cancelled", exp_id)
            return True, self._finish(job, Status.CANCELLED, f"cancelled while running (attempt {attempt})")
        return False, None

    def _requeue(self, child: Child, job: Job) -> None:
        """Kill the child and queue its attempt again (the worker is shutting down)."""
        exp_id, attempt = job.experiment_id, job.attempt
        child.kill()
        self.w.record(lambda s: requeue_experiment(s, experiment_id=exp_id, attempt=attempt))
        log.info("experiment %s requeued at shutdown", exp_id)

    def _exited(self, child: Child, job: Job, rss: int | None) -> Status | None:
        """Record what an exited child could not: ``oom`` when killed near its memory limit,
        ``failed`` for another nonzero exit code; None when it exited cleanly."""
        code = child.proc.exitcode
        child.conn.close()
        if killed_for_memory(code, rss, job.memory_limit_bytes):
            return self._killed_for_memory(job, code, rss)
        if code != 0:
            # Died without recording an outcome (segfault, OOM killer, os._exit); a no-op
            # when the child did record one.
            error = f"the experiment's process exited with code {code} before finishing"
            return self._finish(job, Status.FAILED, error)
        return None


def _higher(peak: int | None, reading: int | None) -> int | None:
    """The higher of a peak so far and a new reading (either may be None: not read)."""
    return reading if peak is None or (reading is not None and reading > peak) else peak
