"""``ckptlab.profile``: the engine on a model in hand, from a notebook or a script.

The run is the same as a queued experiment's (memory pass, timing pass, gradient check),
executed in the caller's process, and stored like ``ckptlab run`` stores one, so that it
appears in the dashboard beside the others. The stored spec names the model by its class
(``{"kind": "python", "target": "module:ClassName", "depth": blocks}``); nothing is
imported by that name: the model is handed to the engine
(:func:`ckptlab.worker.engine.run.run_experiment`'s ``model``), which trains deep copies of it.

The run is held by this process's in-process worker (``profile:host:pid``,
:func:`ckptlab.worker.service.heartbeat.in_process_owner`), which heartbeats while it runs: a dashboard's
reaper leaves it alone however long it takes, and fails it (never requeues it to a worker,
which could not build the model) once the process is gone.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from torch import nn

from ckptlab.db.queue import finish_experiment
from ckptlab.domain import Status
from ckptlab.spec.experiment import ExperimentSpec, PythonModelSpec
from ckptlab.strategies import BASELINE, strategy_names
from ckptlab.summary import RunSummary
from ckptlab.worker.models.user_model import find_blocks, prepare_model

__all__ = ["profile", "find_blocks", "ProfileResult"]

log = logging.getLogger("ckptlab.profile")


class ProfileResult(RunSummary):
    """What :func:`profile` returns: the run's summary (:class:`~ckptlab.summary.RunSummary`,
    as ``GET /api/experiments/{id}`` shows it, ``model`` and ``blocks`` included) and where
    the run is stored."""

    experiment_id: int = Field(description="the stored experiment's id (the dashboard's #id)")
    status: Status = Field(description="its final status")
    error: str | None = Field(None, description="the error text when it did not succeed")
    database_url: str = Field(description="where it is stored, password hidden")


def profile(
    model: nn.Module,
    sample: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    *,
    blocks: nn.Module | str | None = None,
    strategy: str = BASELINE,
    steps: int = 10,
    timed_steps: int = 20,
    optimizer: str = "adam",
    amp: str = "off",
    device: str = "cpu",
    loss_fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None,
    verify_gradients: bool = True,
    database_url: str | None = None,
    **checkpoint: Any,
) -> ProfileResult:
    """Run ckptlab's engine on ``model`` in this process, store the run, return its summary.

    Example usage::

        import tempfile
        import torch
        from torch import nn
        import ckptlab

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(4)])
                self.head = nn.Linear(64, 10)

            def forward(self, x):
                return self.head(self.blocks(x))

        url = f"sqlite:///{tempfile.mkdtemp()}/ckptlab.db"
        x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
        summary = ckptlab.profile(Net(), (x, y), strategy="sequential", segments=2, steps=3, timed_steps=2,
                                  database_url=url)
        assert summary.error is None and summary.gradients_match
        print(summary.blocks, summary.activation_bytes, summary.peak_explanation)

    Args:
        model: any ``nn.Module``; it is not changed (each run builds a deep copy).
        sample: the inputs of one micro-batch, ``(inputs, targets)``, or a mapping of the
            model's keyword arguments (``{"input_ids": ids, "labels": ids}``); the batch
            size is the (first) input's first dimension. Every step uses this batch.
        blocks: the container of repeated blocks to checkpoint (a submodule or its
            qualified name). Default: the model's own layout for ``transformers`` and
            torchvision models, else :func:`ckptlab.worker.models.user_model.find_blocks`.
            ``model.forward`` must apply them in order; they may take keyword arguments and
            return a tuple.
        strategy: a name of the strategy table (:data:`ckptlab.strategies.STRATEGIES`):
            {strategies};
            its options (``segments``, ``every``, ``policy``, ``use_reentrant``,
            ``preserve_rng_state``, ``budget_bytes``, ``activation_memory_budget``) as
            keyword arguments, as in the spec's ``checkpoint``.
        steps, timed_steps, optimizer, amp, device, verify_gradients: as in the
            experiment spec (defaults 10, 20, adam, off, cpu, True).
        loss_fn: ``(output, targets) -> scalar``. Default: the ``loss`` the model's output
            carries (a ``transformers`` ``ModelOutput`` given ``labels``); else, with
            targets, the engine's default loss on the output (or its ``logits``:
            cross-entropy for integer targets, else MSE); else the mean of the squared
            output.
        database_url: where to store the run. Default: the dashboard's database as the
            ckptlab settings name it (``CKPTLAB_DATABASE_URL``, else
            ``<CKPTLAB_DATA_DIR>/ckptlab.db``, ``./data/ckptlab.db`` by default: the file
            ``ckptlab up`` uses when started in the current folder). A SQLite file that does
            not exist yet is created with a ``UserWarning`` naming it.

    While the run goes on, this process heartbeats for it every ``lease_s / 3`` seconds
    (``CKPTLAB_LEASE_S``, default 60) as worker ``profile:host:pid``, so reapers leave it
    alone; if the process dies, a reaper fails it after the lease with
    :data:`ckptlab.db.queue.IN_PROCESS_LOST`. An exception that ends the run here
    (``KeyboardInterrupt`` included) is recorded (``cancelled`` for ``KeyboardInterrupt``,
    else ``failed``) and raised again.

    Returns:
        A :class:`ProfileResult`: the summary (memory in bytes, times in ms; it names the
        ``model`` by class and parameter count and the ``blocks`` chosen) with
        ``experiment_id``, ``status``, ``error`` and ``database_url``. ``dump()`` gives it
        as JSON.

    Raises:
        ValueError: before anything is stored, saying what to pass: no blocks found or
            given, blocks that are not run once each in order or do not return a tensor,
            a sample or output the loss cannot be taken from, or an invalid spec
            (pydantic's ``ValidationError`` is a ``ValueError``).
        sqlalchemy.exc.OperationalError: the database cannot be reached or migrated.

    Known limitations:
        - Every step trains on the one ``sample``: data-dependent memory (variable sequence
          lengths, dynamic shapes) is measured at that sample's shape only.
        - Only the blocks are checkpointed; what the model does around them (embeddings, a
          head, a loss over a large vocabulary) is measured but never recomputed.
        - On CPU the figures are the live tensors' bytes (exact, as ``MemTracker`` counts
          them); convolution backward scratch outside any tensor and the allocator's
          caching are not in them (docs/guide.md, "What CPU figures omit"). On CUDA they are
          the caching allocator's.
        - It runs in the caller's process, whose glibc heap keeps freed memory from then on
          (:func:`ckptlab.worker.measure.heap.keep_freed_heap`: timings without page faults
          a GPU run does not have; the resident size stays at its high-water mark).
        - The dashboard cannot re-run it (it names the model by class, and a server never
          imports code a request names): "Run the baseline" needs a ``python`` target the
          operator allowed, or another call of this function with ``strategy="none"``.
        - Cancelling it from the dashboard stops it at the next step (the cancel flag is
          read every 0.5 s while steps are written): it returns with status ``cancelled``,
          its steps so far kept. A step itself is not interrupted; ``KeyboardInterrupt``
          also records it as ``cancelled``.
    """
    from ckptlab.db.database import make_engine, make_sessionmaker, migrate
    from ckptlab.db.store import create_experiment, get_experiment
    from ckptlab.settings import get_settings
    from ckptlab.worker.service.heartbeat import in_process_owner
    from ckptlab.worker.service.slots import execute_experiment

    ready = prepare_model(model, sample, blocks=blocks, loss_fn=loss_fn)
    target = f"{type(model).__module__}:{type(model).__name__}"
    spec = ExperimentSpec.model_validate(
        {
            "model": PythonModelSpec(target=target, depth=ready.depth).model_dump(),
            "batch_size": ready.batch_size,
            "steps": steps,
            "timed_steps": timed_steps,
            "optimizer": optimizer,
            "amp": amp,
            "device": device,
            "verify_gradients": verify_gradients,
            "checkpoint": {"strategy": strategy, **checkpoint},
        }
    )
    settings = get_settings()
    url = database_url or settings.resolved_database_url
    _warn_if_new(url)
    engine = make_engine(url)
    try:
        migrate(engine)
        Session = make_sessionmaker(engine)
        with in_process_owner(url, settings) as worker_id:
            with Session() as session:
                exp = create_experiment(session, spec=spec, status=Status.RUNNING, worker_id=worker_id)
            try:
                # ours beats; the engine trains copies of the model in hand
                execute_experiment(url, exp.id, exp.attempt, heartbeat=False, model=ready.build())
            except BaseException as exc:  # KeyboardInterrupt included: record it, then raise
                _record_interrupted(Session, exp.id, exp.attempt, exc)
                raise
        _name_the_run(Session, exp.id, model=ready.model, blocks=ready.blocks)
        with Session() as session:
            exp = get_experiment(session, experiment_id=exp.id)
        return ProfileResult.model_validate(
            {
                **exp.run_summary.dump(),
                "experiment_id": exp.id,
                "status": Status(exp.status),
                "error": exp.error,
                "database_url": make_url(url).render_as_string(hide_password=True),
            }
        )
    finally:
        engine.dispose()


# The strategies named in the docstring are the table's, so it never falls behind it.
profile.__doc__ = (profile.__doc__ or "").replace("{strategies}", ", ".join(f"``{name}``" for name in strategy_names()))


def _warn_if_new(url: str) -> None:
    """Warn (``UserWarning``) when ``url`` is a SQLite file that does not exist yet: the
    run would land where no dashboard looks, unless one is started on it."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" or Path(path).exists():
        return
    warnings.warn(
        f"ckptlab.profile is creating a new database {Path(path).resolve()}; a dashboard shows this run only "
        "if it uses the same database (`ckptlab up` reads CKPTLAB_DATABASE_URL, else data/ckptlab.db under "
        "CKPTLAB_DATA_DIR, default the folder it starts in): set CKPTLAB_DATABASE_URL or pass database_url=",
        stacklevel=3,
    )


def _record_interrupted(Session: sessionmaker[Session], experiment_id: int, attempt: int, exc: BaseException) -> None:
    """Record a run that an exception ended in this process (``cancelled`` for Ctrl-C, else
    ``failed``) rather than leave it ``running`` for a reaper; best effort."""
    status = Status.CANCELLED if isinstance(exc, KeyboardInterrupt) else Status.FAILED
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error = f"interrupted in the process running ckptlab.profile ({why})"
    try:
        with Session() as session:
            finish_experiment(session, experiment_id=experiment_id, attempt=attempt, status=status, error=error)
    except Exception:  # noqa: BLE001 - the reaper fails it once our heartbeat has stopped
        log.warning("could not record experiment %s as %s", experiment_id, status, exc_info=True)


def _name_the_run(Session, experiment_id: int, **names: str) -> None:
    """Add ``names`` (the model's class and parameter count, the blocks chosen) to the stored
    summary, so the dashboard shows what was profiled."""
    from ckptlab.db.models import Experiment

    with Session() as session:
        exp = session.get(Experiment, experiment_id)
        if exp is not None and exp.summary is not None:
            exp.summary = RunSummary.model_validate({**exp.run_summary.dump(), **names}).dump()
            session.commit()
