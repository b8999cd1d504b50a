"""The worker: claim queued experiments, run each in a child process, store the outcome.

After procrastinate / rq, hardened for long unattended sweeps:

- **Isolation.** Each experiment runs in its own child process (:mod:`ckptlab.worker.service.child`,
  :class:`ckptlab.worker.service.runners.ChildRunner`), so an out-of-memory kill, a segfault or a hang
  costs that experiment only; the next child is started warm while the current one runs.
- **Heartbeats and recovery.** The worker registers in ``workers`` and heartbeats every
  ``lease_s / 3``, retrying a failed heartbeat until shortly before the lease runs out
  (:mod:`ckptlab.worker.service.heartbeat`): a database stall shorter than ``lease_s - lease_s / 3`` (40 s
  by default) costs nothing, since the children's step writes and outcomes retry longer.
  Every worker (and the backend) runs the reaper (:mod:`ckptlab.db.reaper`), which
  requeues experiments of workers silent for a lease, counted from their last committed
  heartbeat. A worker whose own heartbeats fail for a lease kills its children (its
  experiments belong to others now); until then they run on.
- **Memory.** Each child runs under a host-memory cap a little above ``worker_memory_bytes``
  (or a CPU spec's lower ``memory_limit_bytes``; :mod:`ckptlab.worker.measure.hostmem`): a run that
  exhausts it, or that the kernel kills near it, is recorded ``oom`` with the bytes it
  reached, and the slot goes on with the next experiment.
- **Timeouts, cancels, shutdown.** While a child runs, its slot polls the experiment every
  0.25 s: ``cancel_requested`` kills the child and records ``cancelled``; ``timeout_s`` kills
  it and records ``timed_out``. On a stop request the slots claim nothing more and give the
  running experiments ``shutdown_grace_s`` to finish, then kill and requeue them; a kill
  request (a second signal) requeues them at once.
- **Many devices.** One slot thread per device (``cuda:0``, ``cuda:1``, ... and
  ``cpu_slots`` slots for ``cpu``, by default one per 4 cores), each with its own child; the
  slot's device is handed to :func:`ckptlab.worker.engine.run.run_experiment`. CPU slots split the
  host's cores: each CPU child runs ``torch.set_num_threads(cpu_count // cpu_slots)``, and
  no more CPU experiments run at once than the cores hold (``cpu_count // threads``): extra
  slots wait for a free core rather than contend for it.
- **Writes off the hot path.** The child buffers steps in a :class:`~ckptlab.worker.service.writer.StepWriter`
  whose thread commits them every 0.2 s (retrying a locked or unreachable database).
- **Watched side tasks.** The heartbeat and the reaper are
  :class:`~ckptlab.side_tasks.SideTask` loops; one that dies stops the worker, with the
  reason logged (after procrastinate's ``_monitor_side_tasks``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ckptlab.db.database import make_engine, make_sessionmaker, migrate
from ckptlab.db.queue import claim_next
from ckptlab.db.reaper import reaper_task
from ckptlab.domain import Status
from ckptlab.settings import Settings, get_settings
from ckptlab.side_tasks import SideTask, first_dead
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.measure.hostmem import run_memory_limit
from ckptlab.worker.service.devices import cpu_threads_per_slot, default_cpu_slots, default_worker_id, slot_devices
from ckptlab.worker.service.heartbeat import Heartbeat
from ckptlab.worker.service.outcome import Job
from ckptlab.worker.service.runners import ChildRunner, InProcessRunner
from ckptlab.worker.service.state import WorkerState

__all__ = ["execute_experiment", "run_worker"]

log = logging.getLogger("ckptlab.worker")


def execute_experiment(
    database_url: str,
    experiment_id: int,
    attempt: int,
    *,
    device: str | None = None,
    snapshot_dir: str | None = None,
    heartbeat: bool = True,
    model: Any = None,
) -> Status:
    """Run one claimed experiment in this process and record its steps and outcome.

    The :class:`~ckptlab.worker.service.runners.InProcessRunner` behind ``ckptlab run``; see
    :func:`ckptlab.worker.service.outcome.record_run` for what is recorded.

    Args:
        database_url: SQLAlchemy URL of the database holding the experiment.
        experiment_id: the experiment, already ``running`` in ``attempt``.
        attempt: the attempt its steps are stored under.
        device: the device this runs on (e.g. ``cuda:1``), mapped with
            :func:`ckptlab.worker.service.devices.engine_device`. Default: the spec's ``device``.
        snapshot_dir: folder for CUDA memory snapshots. Default: ``<data_dir>/snapshots``.
        heartbeat: heartbeat the experiment's ``worker_id`` while running (default True).
        model: a model already built in this process (a ``ckptlab.worker.models.build.Built``), trained
            instead of building the spec's (``ckptlab.profile``). Default: None.

    Returns:
        The recorded status.

    Raises:
        LookupError: no experiment with this id.
    """
    settings = get_settings()
    engine = make_engine(database_url)
    try:
        runner = InProcessRunner(make_sessionmaker(engine), settings, heartbeat=heartbeat)
        job = Job(
            experiment_id=experiment_id,
            attempt=attempt,
            device=device,
            snapshot_dir=snapshot_dir or str(settings.data_dir.resolve() / "snapshots"),
            model=model,
        )
        return runner.execute(job)
    finally:
        engine.dispose()


def _validated(raw: object) -> ExperimentSpec | None:
    """The stored spec as a model, validated once here for the slot and its child; None when
    it no longer validates (the child then records the validation error as ``failed``)."""
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError:
        return None


class _SlotDone(Exception):
    """A slot has nothing more to do."""


class _Slot(threading.Thread):
    """Claims and runs one experiment at a time on one device, each in a fresh child."""

    def __init__(self, w: WorkerState, device: str, index: int):
        super().__init__(name=f"ckptlab-slot-{index}-{device}", daemon=True)
        self.w = w
        self.device = device
        self.ran = 0

    def run(self) -> None:
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - a broken slot must not hang the worker
            log.exception("slot %s stopped on an error", self.name)

    def _claim(self) -> object | None:
        try:
            with self.w.Session() as s:
                return claim_next(s, worker_id=self.w.worker_id)
        except Exception:  # noqa: BLE001 - database away: try again later
            log.warning("claim failed", exc_info=True)
            return None

    def _gate(self) -> bool:
        """On ``cpu``, wait for a free core (:attr:`WorkerState.cpu_gate`); False on stop."""
        gate = self.w.cpu_gate if self.device == "cpu" else None
        while gate is not None and not gate.acquire(timeout=self.w.poll_interval_s):
            if self.w.stop.is_set():
                return False
        return True

    def _ungate(self) -> None:
        if self.device == "cpu" and self.w.cpu_gate is not None:
            self.w.cpu_gate.release()

    def _loop(self) -> None:
        w = self.w
        runner = ChildRunner(w)
        try:
            while not w.stop.is_set():
                if not self._gate():
                    return
                try:
                    self._claim_and_run(runner)
                except _SlotDone:
                    return
                finally:
                    self._ungate()
        finally:
            runner.close()

    def _claim_and_run(self, runner: ChildRunner) -> None:
        """Claim one experiment and run it to its end; nothing when the queue is empty or the
        lease is in doubt (after a poll interval). Raises :class:`_SlotDone` when the slot
        is done (its ticket quota is spent, or the queue is empty under ``exit_when_idle``)."""
        w = self.w
        if not w.take_ticket():
            raise _SlotDone
        if not w.lease_ok():  # our heartbeats fail: claim nothing we might lose
            w.return_ticket()
            w.stop.wait(w.poll_interval_s)
            return
        exp = self._claim()
        if exp is None:
            w.return_ticket()
            if w.exit_when_idle:
                raise _SlotDone
            w.stop.wait(w.poll_interval_s)
            return
        spec = _validated(exp.spec)
        job = Job(
            experiment_id=exp.id,
            attempt=exp.attempt,
            device=self.device,
            snapshot_dir=str(w.settings.data_dir.resolve() / "snapshots"),
            claimed_at=time.time(),
            cpu_threads=w.cpu_threads if self.device == "cpu" else None,
            spec=spec,
            memory_limit_bytes=run_memory_limit(spec, self.device, w.settings.worker_memory_bytes),
            allowed_model_targets=tuple(w.settings.allowed_model_targets),
            max_attempts=w.settings.max_attempts,
        )
        timeout_s = (spec.timeout_s if spec else None) or w.settings.default_timeout_s
        log.info("running experiment %s (attempt %s) on %s", exp.id, exp.attempt, self.device)
        runner.execute(job, timeout_s=timeout_s, prestart=not w.stop.is_set())
        self.ran += 1


def run_worker(
    *,
    database_url: str,
    stop_event: threading.Event | None = None,
    kill_event: threading.Event | None = None,
    poll_interval_s: float = 0.5,
    max_experiments: int | None = None,
    exit_when_idle: bool = False,
    worker_id: str | None = None,
    devices: Sequence[str] | None = None,
    cpu_slots: int | None = None,
    cpu_threads: int | None = None,
    settings: Settings | None = None,
) -> int:
    """Claim and run experiments until stopped; returns how many were claimed.

    Args:
        database_url: SQLAlchemy URL of the shared database (migrated on start).
        stop_event: set it to stop claiming; running experiments get
            ``settings.shutdown_grace_s`` to finish, then are killed and requeued.
            Default: a fresh event.
        kill_event: set it to kill and requeue running experiments at once (a second
            signal). Default: a fresh event.
        poll_interval_s: sleep between claims when the queue is empty (s). Default 0.5.
        max_experiments: stop after claiming this many. Default: no limit.
        exit_when_idle: a slot ends as soon as it finds the queue empty. Default: False.
        worker_id: recorded on claimed experiments and in ``workers``. Default: ``host:pid``.
        devices: one slot per device; ``cpu`` gets ``cpu_slots`` slots. Default:
            :func:`detect_devices`.
        cpu_slots: concurrent experiments on ``cpu``. Default:
            :func:`ckptlab.worker.service.devices.default_cpu_slots` (``max(1, cpu_count // 4)``).
        cpu_threads: torch threads of each CPU experiment (``torch.set_num_threads`` in its
            child; reported as ``environment.cpu_threads`` in its summary). Default:
            ``settings.worker_cpu_threads``, else the cores split between the CPU slots,
            ``max(1, cpu_count // cpu_slots)`` (:func:`ckptlab.worker.service.devices.cpu_threads_per_slot`).
        settings: lease, attempts, grace, default timeout and data folder. Default:
            :func:`ckptlab.settings.get_settings`.

    Raises:
        ValueError: bad ``devices``, ``cpu_slots`` (see :func:`slot_devices`) or
            ``cpu_threads`` (less than 1).
    """
    settings = settings or get_settings()
    slots = slot_devices(devices, cpu_slots=default_cpu_slots() if cpu_slots is None else cpu_slots)
    threads_each = cpu_threads if cpu_threads is not None else settings.worker_cpu_threads
    if threads_each is None:
        threads_each = cpu_threads_per_slot(slots.count("cpu"))
    if threads_each < 1:
        raise ValueError(f"cpu_threads must be at least 1, got {threads_each}")
    stop = stop_event or threading.Event()
    kill = kill_event or threading.Event()
    wid = worker_id or default_worker_id()
    engine = make_engine(database_url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    log.info("worker %s on %s polling %s", wid, ",".join(slots), engine.url.render_as_string(hide_password=True))

    def on_death(task: SideTask, exc: BaseException) -> None:
        log.error("side task %s died (%s: %s): stopping worker %s", task.name, type(exc).__name__, exc, wid)
        stop.set()

    beat = Heartbeat(
        Session,
        worker_id=wid,
        devices=slots,
        interval_s=settings.heartbeat_interval_s,
        lease_s=settings.lease_s,
        on_death=on_death,
    )
    reaper = reaper_task(Session, settings, on_death=on_death).start()
    w = WorkerState(
        database_url=database_url,
        Session=Session,
        settings=settings,
        worker_id=wid,
        stop=stop,
        kill=kill,
        poll_interval_s=poll_interval_s,
        max_experiments=max_experiments,
        exit_when_idle=exit_when_idle,
        beat=beat,
    )
    w.cpu_threads = threads_each  # CPU slots share the cores instead of oversubscribing them
    cores_fit = max(1, (os.cpu_count() or 1) // threads_each)
    if slots.count("cpu") > cores_fit:
        # More CPU children than cores only contend (measured: 4 slots on 2 cores ran a sweep
        # 43% slower than 2; docs/benchmarks.md): the extra slots wait for a free core.
        w.cpu_gate = threading.BoundedSemaphore(cores_fit)
        log.warning(
            "%d CPU slots of %d torch threads on %d cores: at most %d CPU experiments run at once",
            slots.count("cpu"),
            threads_each,
            os.cpu_count() or 1,
            cores_fit,
        )
    threads = [_Slot(w, device, i) for i, device in enumerate(slots)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # short joins keep the main thread responsive to signals
                t.join(0.5)
                dead = first_dead([beat.task, reaper])
                if dead is not None and not stop.is_set():
                    log.error("side task %s is dead: stopping worker %s", dead.name, wid)
                    stop.set()
    finally:
        stop.set()
        reaper.stop()
        for t in threads:
            t.join(60)
        beat.stop()
        engine.dispose()
    return sum(t.ran for t in threads)
