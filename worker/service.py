"""The worker: claim queued experiments, run each in a child process, store the outcome.

After procrastinate / rq, hardened for long unattended sweeps:

- **Isolation.** Each experiment runs in its own child process, so an out-of-memory kill, a
  segfault or a hang costs that experiment only. Children come from a ``forkserver`` that
  was started once (a fresh interpreter, like ``spawn``) and has imported torch and
  :mod:`worker.engine`; forking a clean child from it takes milliseconds where a ``spawn``
  child spends ~2.5 s of CPU importing torch. (Where ``forkserver`` is missing, ``spawn``.)
  Children ignore SIGINT and SIGTERM (the worker decides), and end at once when the worker
  dies, even by SIGKILL: they watch their job pipe for EOF.
- **Warm start.** The next child is started while the current experiment runs: it connects
  to the database and waits on a pipe for its experiment, so a claim reaches its first step
  in well under a second.
- **Heartbeats and recovery.** The worker registers in ``workers`` and heartbeats every
  ``lease_s / 3`` from a thread; every worker (and the backend) runs the reaper
  (:mod:`ckptlab.db.reaper`), which requeues experiments of silent workers. A worker whose
  own heartbeats fail for a lease kills its children: its experiments belong to others now.
- **Timeouts, cancels, shutdown.** While a child runs, its slot polls the experiment every
  0.25 s: ``cancel_requested`` kills the child and records ``cancelled``; ``timeout_s`` kills
  it and records ``timed_out``. On a stop request the slots claim nothing more and give the
  running experiments ``shutdown_grace_s`` to finish, then kill and requeue them; a kill
  request (a second signal) requeues them at once.
- **Many devices.** One slot thread per device (``cuda:0``, ``cuda:1``, ... and
  ``cpu_slots`` slots for ``cpu``), each with its own child; the slot's device is handed to
  :func:`worker.engine.run_experiment`.
- **Writes off the hot path.** The child buffers steps in a :class:`~ckptlab.db.writer.StepWriter`
  whose thread commits them every 0.2 s (retrying a locked or unreachable database).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ckptlab.db.engine import make_engine, make_sessionmaker, migrate
from ckptlab.db.models import Experiment
from ckptlab.db.reaper import start_reaper_thread
from ckptlab.db.retry import with_retry
from ckptlab.db.store import (
    claim_next,
    finish_experiment,
    get_experiment,
    get_run_state,
    heartbeat_worker,
    register_worker,
    requeue_experiment,
    stop_worker,
)
from ckptlab.db.writer import StepWriteError, StepWriter
from ckptlab.settings import Settings, get_settings
from ckptlab.spec import ExperimentSpec

__all__ = ["execute_experiment", "run_worker", "default_worker_id", "detect_devices", "slot_devices", "engine_device"]

log = logging.getLogger("ckptlab.worker")

#: How often a slot re-reads its running experiment (cancel flag, lease), seconds.
POLL_RUNNING_S = 0.25
#: How long a recorded outcome is retried against a failing database, seconds.
_RECORD_DEADLINE_S = 120.0


def default_worker_id() -> str:
    """``host:pid``, unique among live workers."""
    return f"{socket.gethostname()}:{os.getpid()}"


def detect_devices() -> list[str]:
    """The devices a worker uses by default: every visible CUDA device, else ``["cpu"]``.

    Counts GPUs with NVML (``nvidia-ml-py``) without importing torch, and honours
    ``CUDA_VISIBLE_DEVICES``.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    else:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                n = pynvml.nvmlDeviceGetCount()
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - no driver, no library: no GPU
            n = 0
    return [f"cuda:{i}" for i in range(n)] or ["cpu"]


def slot_devices(devices: Sequence[str] | None = None, *, cpu_slots: int = 1) -> list[str]:
    """One entry per slot: each device once, except ``cpu`` which gets ``cpu_slots`` slots.

    Args:
        devices: e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu"]``. Default: :func:`detect_devices`.
        cpu_slots: concurrent experiments on ``cpu`` (default 1).

    Raises:
        ValueError: ``cpu_slots`` < 1, no device, or a device other than ``cpu``,
            ``cuda`` or ``cuda:N``.
    """
    if cpu_slots < 1:
        raise ValueError(f"cpu_slots must be at least 1, got {cpu_slots}")
    names = [d.strip() for d in (detect_devices() if devices is None else devices) if d.strip()]
    if not names:
        raise ValueError("no device given")
    slots: list[str] = []
    for name in dict.fromkeys(names):
        kind, _, index = name.partition(":")
        if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
            raise ValueError(f"unknown device {name!r}; expected cpu, cuda or cuda:N")
        slots.extend([name] * (cpu_slots if name == "cpu" else 1))
    return slots


def _error_text(exc: BaseException) -> str:
    tb = traceback.format_exception(exc)
    return f"{type(exc).__name__}: {exc}\n\n{''.join(tb[-6:])}"


@dataclass(frozen=True)
class _Job:
    """What a slot hands its child: the claimed attempt and where to run it."""

    experiment_id: int
    attempt: int
    device: str | None
    snapshot_dir: str | None
    claimed_at: float  # time.time() at the claim, for the claim-to-first-step latency
    cpu_threads: int | None = None  # torch intra-op threads, when CPU slots share the cores


def engine_device(spec_device: str, slot_device: str | None) -> str | None:
    """The ``device`` a slot hands the engine for a spec (None: the spec's own).

    A CUDA slot runs ``auto`` and ``cuda`` specs on its GPU and ``cpu`` specs on the CPU; a
    CPU slot runs ``auto`` and ``cpu`` specs on the CPU and leaves a ``cuda`` spec to the
    engine, which fails it when CUDA is missing rather than measure it on the wrong device.
    """
    if slot_device is None or spec_device == "cpu":
        return None
    if slot_device == "cpu":
        return "cpu" if spec_device == "auto" else None
    return slot_device


def _execute(
    Session: sessionmaker[Session],
    *,
    experiment_id: int,
    attempt: int,
    device: str | None,
    snapshot_dir: str | None,
    claimed_at: float | None,
) -> str:
    """Run one claimed attempt with batched step writes and record its outcome."""
    from worker.engine import run_experiment  # imports torch: only where experiments run
    from worker.errors import RunError, RunOutOfMemory

    with Session() as session:
        exp = get_experiment(session, experiment_id=experiment_id)
        if exp is None:
            raise LookupError(f"experiment {experiment_id} does not exist")
        spec_json = exp.spec
    first_step_at: list[float] = []
    status, summary, error, warnings, snapshot = "failed", None, None, None, None
    writer = StepWriter(Session, experiment_id=experiment_id, attempt=attempt).start()
    try:
        spec = ExperimentSpec.model_validate(spec_json)
        if spec.memory_snapshot and snapshot_dir:
            Path(snapshot_dir).mkdir(parents=True, exist_ok=True)
            snapshot = str(Path(snapshot_dir) / f"experiment-{experiment_id}-attempt-{attempt}.pickle")

        def on_step(rec: dict[str, Any]) -> None:
            if not first_step_at:
                first_step_at.append(time.time())
            writer.put(rec)

        summary = dict(
            run_experiment(spec, on_step=on_step, device=engine_device(spec.device, device), snapshot_path=snapshot)
        )
        status = "succeeded"
        warnings = list(summary.setdefault("warnings", []))
        if claimed_at is not None and first_step_at:
            summary["claim_to_first_step_s"] = first_step_at[0] - claimed_at
    except RunError as exc:  # RunOutOfMemory included: status "oom"
        status, warnings, error = exc.status, exc.warnings, f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None and not isinstance(exc, RunOutOfMemory):  # where the model failed
            error += "\n\n" + "".join(traceback.format_exception(exc.__cause__)[-6:])
        if isinstance(exc, RunOutOfMemory):
            summary = {"oom": exc.details}
        elif exc.details:
            summary = {"failure": exc.details}
    except Exception as exc:  # noqa: BLE001 - any failure of the run is its outcome
        status, error = "failed", _error_text(exc)
    try:
        writer.close()  # every step is committed before the outcome is
    except StepWriteError as exc:
        status, summary, error = "failed", None, f"{type(exc).__name__}: {exc}"
    if snapshot is not None and not Path(snapshot).exists():
        snapshot = None
    with_retry(
        Session,
        lambda s: finish_experiment(
            s,
            experiment_id=experiment_id,
            attempt=attempt,
            status=status,
            summary=summary,
            error=error,
            warnings=warnings,
            snapshot_path=snapshot if status == "succeeded" else None,
        ),
        deadline_s=_RECORD_DEADLINE_S,
    )
    return status


class _Heartbeat:
    """Registers a worker and heartbeats it from a daemon thread every ``interval_s``."""

    def __init__(self, Session: sessionmaker[Session], *, worker_id: str, devices: Sequence[str], interval_s: float):
        self._Session = Session
        self.worker_id = worker_id
        self.interval_s = interval_s
        self._stop = threading.Event()
        with_retry(
            Session,
            lambda s: register_worker(
                s, worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(), devices=devices
            ),
        )
        #: time.monotonic() at the start of the last heartbeat that was committed; its
        #: database time is no earlier, so the lease runs out here no later than for reapers.
        self.last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="ckptlab-heartbeat", daemon=True)
        self._thread.start()

    def silent_for(self) -> float:
        """Seconds since the start of the last committed heartbeat."""
        return time.monotonic() - self.last_ok

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            began = time.monotonic()
            try:
                with self._Session() as s:
                    if not heartbeat_worker(s, worker_id=self.worker_id):
                        register_worker(
                            s, worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid(), devices=[]
                        )
                self.last_ok = began
            except Exception:  # noqa: BLE001 - keep beating; slots act on a lost lease
                log.warning("heartbeat of %s failed", self.worker_id, exc_info=True)

    def stop(self) -> None:
        """Stop beating and mark the worker stopped (best effort)."""
        self._stop.set()
        self._thread.join(5)
        try:
            with_retry(self._Session, lambda s: stop_worker(s, worker_id=self.worker_id), deadline_s=5)
        except Exception:  # noqa: BLE001 - the lease runs out by itself
            log.warning("could not mark worker %s stopped", self.worker_id, exc_info=True)


def execute_experiment(
    database_url: str,
    experiment_id: int,
    attempt: int,
    *,
    device: str | None = None,
    snapshot_dir: str | None = None,
    heartbeat: bool = True,
) -> str:
    """Run one claimed experiment in this process and record its steps and outcome.

    Steps are committed in batches every 0.2 s by a writer thread. The outcome is
    ``succeeded`` (summary from the engine, plus ``warnings``), ``oom`` or ``failed`` (from
    :class:`worker.errors.RunError`: its warnings, its details in the summary, its message
    as the error) or ``failed`` for any other exception (the error text with the traceback;
    the exception is not re-raised). Used by ``ckptlab run`` in-process.

    Args:
        database_url: SQLAlchemy URL of the database holding the experiment.
        experiment_id: the experiment, already ``running`` in ``attempt``.
        attempt: the attempt its steps are stored under.
        device: the device this runs on (e.g. ``cuda:1``), mapped with :func:`engine_device`.
            Default: the spec's ``device``.
        snapshot_dir: folder for CUDA memory snapshots. Default: ``<data_dir>/snapshots``.
        heartbeat: register the experiment's ``worker_id`` as a worker and heartbeat it while
            running, so that reapers do not take the experiment away (default True; worker
            children pass False: their parent heartbeats).

    Returns:
        The recorded status.

    Raises:
        LookupError: no experiment with this id.
    """
    settings = get_settings()
    engine = make_engine(database_url)
    Session = make_sessionmaker(engine)
    beat = None
    try:
        if heartbeat:
            with Session() as s:
                exp = get_experiment(s, experiment_id=experiment_id)
                wid = (exp.worker_id if exp else None) or default_worker_id()
            beat = _Heartbeat(
                Session, worker_id=wid, devices=[device or "auto"], interval_s=settings.heartbeat_interval_s
            )
        return _execute(
            Session,
            experiment_id=experiment_id,
            attempt=attempt,
            device=device,
            snapshot_dir=snapshot_dir or str(settings.data_dir.resolve() / "snapshots"),
            claimed_at=None,
        )
    finally:
        if beat is not None:
            beat.stop()
        engine.dispose()


# --- the child process ------------------------------------------------------------------


def _exit_when_parent_goes(conn: Any) -> None:
    """Wait on the job pipe: EOF means the worker died (even by SIGKILL), so this child
    ends at once instead of running its experiment next to the attempt that replaces it."""
    try:
        conn.recv()
    except (EOFError, OSError):
        os._exit(70)


def _child_main(conn: Any, database_url: str) -> None:
    """A pre-started child: warm up, wait for one job on ``conn``, run it, exit."""
    # The worker decides what a Ctrl-C or a SIGTERM sent to the whole process group (a
    # terminal, systemd's control-group kill) means: finish, or be killed and requeued.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import worker.engine  # noqa: F401 - imports torch; already imported under the forkserver

    # Connect to the database before any claim (no torch op: an idle child uses no CPU).
    engine = make_engine(database_url)
    Session = make_sessionmaker(engine)
    try:
        with Session() as s:
            get_experiment(s, experiment_id=0)
    except Exception:  # noqa: BLE001 - the job will retry and report
        pass
    try:
        job: _Job = conn.recv()
    except (EOFError, OSError):
        return  # the worker closed the pipe: not needed
    threading.Thread(target=_exit_when_parent_goes, args=(conn,), daemon=True).start()
    if job.cpu_threads:
        import torch

        torch.set_num_threads(job.cpu_threads)
    try:
        _execute(
            Session,
            experiment_id=job.experiment_id,
            attempt=job.attempt,
            device=job.device,
            snapshot_dir=job.snapshot_dir,
            claimed_at=job.claimed_at,
        )
    finally:
        engine.dispose()


#: Imported once by the forkserver, so that forked children start warm: ``__main__`` (a
#: script that starts workers is then not re-imported per child), torch._dynamo (torch
#: imports it lazily at the first op under a dispatch mode: ~3 s of CPU), the engine, this
#: module and the database drivers (psycopg: ~0.1 s). Only imports: no torch op runs and no
#: connection is opened before the fork. A module that is not installed is skipped.
_PRELOAD = [
    "__main__",
    "torch._dynamo",
    "worker.engine",
    "worker.service",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
]

_ctx_lock = threading.Lock()
_ctx: Any = None


def _mp_context() -> Any:
    """The start method for children: forkserver preloading torch and the engine, else spawn."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            if "forkserver" in mp.get_all_start_methods():
                _ctx = mp.get_context("forkserver")
                _ctx.set_forkserver_preload(_PRELOAD)
            else:
                _ctx = mp.get_context("spawn")
        return _ctx


class _Child:
    """A started child process and the parent's end of its job pipe."""

    def __init__(self, database_url: str):
        ctx = _mp_context()
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child_conn, database_url), daemon=True)
        self.proc.start()
        child_conn.close()

    def send(self, job: _Job) -> bool:
        """Hand over the job; False when the child is already gone."""
        try:
            self.conn.send(job)
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def close(self) -> None:
        """End an idle child (EOF on its pipe), killing it if it lingers."""
        self.conn.close()
        self.proc.join(5)
        if self.proc.is_alive():
            self.kill()


# --- the parent: slots -------------------------------------------------------------------


class _Worker:
    """State shared by a worker's slots: database, settings, stop requests, heartbeat."""

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
        beat: _Heartbeat,
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
        #: torch threads per CPU slot when several share the cores (None: torch's default).
        self.cpu_threads: int | None = None
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
        with self._lock:
            self.started -= 1

    def lease_ok(self) -> bool:
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
            with_retry(self.Session, fn, deadline_s=_RECORD_DEADLINE_S)
        except Exception:  # noqa: BLE001 - the reaper recovers what could not be recorded
            log.exception("could not record an outcome")


class _Slot(threading.Thread):
    """Runs one experiment at a time on one device, each in a fresh child process."""

    def __init__(self, w: _Worker, device: str, index: int):
        super().__init__(name=f"ckptlab-slot-{index}-{device}", daemon=True)
        self.w = w
        self.device = device
        self.ran = 0

    def run(self) -> None:
        try:
            self._loop()
        except Exception:  # noqa: BLE001 - a broken slot must not hang the worker
            log.exception("slot %s stopped on an error", self.name)

    def _loop(self) -> None:
        w = self.w
        child: _Child | None = _Child(w.database_url)
        try:
            while not w.stop.is_set():
                if not w.take_ticket():
                    return
                if not w.lease_ok():  # our heartbeats fail: claim nothing we might lose
                    w.return_ticket()
                    w.stop.wait(w.poll_interval_s)
                    continue
                try:
                    with w.Session() as s:
                        exp = claim_next(s, worker_id=w.worker_id)
                except Exception:  # noqa: BLE001 - database away: try again later
                    log.warning("claim failed", exc_info=True)
                    exp = None
                if exp is None:
                    w.return_ticket()
                    if w.exit_when_idle:
                        return
                    w.stop.wait(w.poll_interval_s)
                    continue
                if child is None or not child.proc.is_alive():
                    if child is not None:
                        child.close()
                    child = _Child(w.database_url)
                # Start the next child while this experiment runs, so that it is warm (and
                # connected) by the next claim.
                child = self._run(child, exp, prestart=not w.stop.is_set())
                self.ran += 1
        finally:
            if child is not None:
                child.close()

    def _run(self, child: _Child, exp: Experiment, *, prestart: bool) -> _Child | None:
        """Run ``exp`` in ``child`` and record what the child could not; returns the next
        child (started once the job is handed over) when ``prestart``."""
        w = self.w
        spec = exp.spec or {}
        timeout_s = spec.get("timeout_s") or w.settings.default_timeout_s
        job = _Job(
            experiment_id=exp.id,
            attempt=exp.attempt,
            device=self.device,
            snapshot_dir=str(w.settings.data_dir.resolve() / "snapshots"),
            claimed_at=time.time(),
            cpu_threads=w.cpu_threads if self.device == "cpu" else None,
        )
        log.info("running experiment %s (attempt %s) on %s", exp.id, exp.attempt, self.device)
        if not child.send(job):
            child.kill()
            child = _Child(w.database_url)
            child.send(job)
        deadline = time.monotonic() + timeout_s
        next_child = _Child(w.database_url) if prestart else None
        self._watch(child, exp, deadline=deadline, timeout_s=timeout_s)
        return next_child

    def _watch(self, child: _Child, exp: Experiment, *, deadline: float, timeout_s: float) -> None:
        """Wait for the child, polling for cancel, lease, timeout and shutdown."""
        w = self.w

        def finish(status: str, error: str) -> None:
            w.record(
                lambda s: finish_experiment(s, experiment_id=exp.id, attempt=exp.attempt, status=status, error=error)
            )

        while True:
            child.proc.join(POLL_RUNNING_S)
            if not child.proc.is_alive():
                break
            if not w.lease_ok():
                log.warning("lease lost (no heartbeat for %.1f s); killing experiment %s", w.beat.silent_for(), exp.id)
                child.kill()
                return
            try:
                with w.Session() as s:
                    state = get_run_state(s, experiment_id=exp.id)
            except Exception:  # noqa: BLE001 - the lease check below covers a lost database
                state = None
            if state is not None and (
                state.status == "queued" or state.attempt != exp.attempt or state.worker_id != w.worker_id
            ):
                log.warning("experiment %s attempt %s was taken away (%s); killing it", exp.id, exp.attempt, state)
                child.kill()
                return
            if state is not None and state.status != "running":  # the child recorded its outcome
                child.proc.join(10)
                child.kill()
                return
            if state is not None and state.cancel_requested:
                child.kill()
                finish("cancelled", f"cancelled while running (attempt {exp.attempt})")
                log.info("experiment %s cancelled", exp.id)
                return
            if time.monotonic() >= deadline:
                child.kill()
                finish("timed_out", f"timed out: killed after {timeout_s:g} s (timeout_s)")
                log.info("experiment %s timed out", exp.id)
                return
            if w.kill.is_set() or (w.stop.is_set() and w.grace_over()):
                child.kill()
                w.record(lambda s: requeue_experiment(s, experiment_id=exp.id, attempt=exp.attempt))
                log.info("experiment %s requeued at shutdown", exp.id)
                return
        code = child.proc.exitcode
        child.conn.close()
        if code != 0:
            # Died without recording an outcome (segfault, OOM killer, os._exit); a no-op
            # when the child did record one.
            finish("failed", f"the experiment's process exited with code {code} before finishing")


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
    cpu_slots: int = 1,
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
        cpu_slots: concurrent experiments on ``cpu`` (default 1). With more than one, each
            CPU experiment runs with ``cpu_count // cpu_slots`` torch threads.
        settings: lease, attempts, grace, default timeout and data folder. Default:
            :func:`ckptlab.settings.get_settings`.

    Raises:
        ValueError: bad ``devices`` or ``cpu_slots`` (see :func:`slot_devices`).
    """
    settings = settings or get_settings()
    slots = slot_devices(devices, cpu_slots=cpu_slots)
    stop = stop_event or threading.Event()
    kill = kill_event or threading.Event()
    wid = worker_id or default_worker_id()
    engine = make_engine(database_url)
    migrate(engine)
    Session = make_sessionmaker(engine)
    log.info("worker %s on %s polling %s", wid, ",".join(slots), engine.url.render_as_string(hide_password=True))
    beat = _Heartbeat(Session, worker_id=wid, devices=slots, interval_s=settings.heartbeat_interval_s)
    reaper_stop = threading.Event()
    reaper = start_reaper_thread(Session, settings, reaper_stop)
    w = _Worker(
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
    if slots.count("cpu") > 1:  # CPU slots share the cores instead of oversubscribing them
        w.cpu_threads = max(1, (os.cpu_count() or 1) // slots.count("cpu"))
    threads = [_Slot(w, device, i) for i, device in enumerate(slots)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # short joins keep the main thread responsive to signals
                t.join(0.5)
    finally:
        stop.set()
        reaper_stop.set()
        for t in threads:
            t.join(60)
        reaper.join(5)
        beat.stop()
        engine.dispose()
    return sum(t.ran for t in threads)
