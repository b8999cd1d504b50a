"""``ckptlab.predict``: will it fit? A spec, or a model in hand, predicted for a target
device from a notebook or a script, in the caller's process, and stored like ``ckptlab
predict`` stores one (the dashboard's ``GET /api/predictions`` lists it).

The prediction is :func:`ckptlab.worker.predict.predict_run`'s: one training step with fake
tensors (no real memory, no GPU) under the live-tensor tracker, the target's differences
(the CUDA caching allocator, the attention backend, the context) modelled on top. A model in
hand is prepared as :func:`ckptlab.profile` prepares one (its blocks found, its sample
checked) and handed to the predictor; the stored spec names it by its class.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from pydantic import Field
from sqlalchemy.engine import make_url
from torch import nn

from ckptlab.domain import Status
from ckptlab.prediction.budget import with_default_budget
from ckptlab.prediction.targets import MAX_CAPACITY_BYTES, Target, get_target
from ckptlab.spec.experiment import CheckpointSpec, ExperimentSpec, PythonModelSpec
from ckptlab.summary import RunSummary

__all__ = ["predict", "predict_and_store", "PredictionResult"]


class PredictionResult(RunSummary):
    """What :func:`predict` returns: the predicted summary (:class:`~ckptlab.summary.RunSummary`,
    as ``GET /api/predictions/{id}`` shows it: bytes, ``prediction`` with the verdict) and
    where the prediction is stored."""

    id: int = Field(description="the stored prediction's id")
    target: str = Field(description="the target's name")
    status: Status = Field(description="succeeded or failed")
    error: str | None = Field(None, description="one sentence, when it did not succeed")
    database_url: str = Field(description="where it is stored, password hidden")


def predict(
    model_or_spec: nn.Module | ExperimentSpec | Mapping[str, Any],
    sample: torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    *,
    target: str = "cpu",
    capacity_bytes: int | None = None,
    database_url: str | None = None,
    blocks: nn.Module | str | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None,
    **spec_fields: Any,
) -> PredictionResult:
    """Predict one training step's memory on ``target`` (will it fit?), store it, return it.

    Example usage::

        import tempfile
        import torch
        from torch import nn
        import ckptlab

        url = f"sqlite:///{tempfile.mkdtemp()}/ckptlab.db"
        spec = {"model": {"kind": "mlp", "depth": 4, "width": 64}, "batch_size": 8, "device": "cpu"}
        result = ckptlab.predict(spec, target="cpu", database_url=url)
        assert result.error is None
        print(result.peak_allocated_bytes, result.prediction.method)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(4)])
                self.head = nn.Linear(64, 10)

            def forward(self, x):
                return self.head(self.blocks(x))

        x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
        result = ckptlab.predict(Net(), (x, y), target="h100-80gb", strategy="per_block", database_url=url)
        assert result.error is None
        print(result.prediction.fits, result.prediction.device_used_bytes, result.prediction.notes)

    Args:
        model_or_spec: an experiment spec (:class:`~ckptlab.spec.experiment.ExperimentSpec`
            or its JSON as a dict), or any ``nn.Module`` (not changed) with ``sample``.
        sample: for a module only: the inputs of one micro-batch, ``(inputs, targets)`` or a
            mapping of keyword arguments, as :func:`ckptlab.profile` takes them.
        target: a name of the targets table (:func:`ckptlab.prediction.targets.target_names`):
            ``cpu`` (exact: the live tensors' bytes) or a GPU (modelled).
        capacity_bytes: the device's memory instead of the target's (bytes, above 0).
        database_url: where to store it. Default: the dashboard's database as the ckptlab
            settings name it (``CKPTLAB_DATABASE_URL``, else ``<CKPTLAB_DATA_DIR>/ckptlab.db``).
        blocks, loss_fn: for a module only, as :func:`ckptlab.profile` takes them.
        **spec_fields: spec fields set over the spec's (``batch_size=32``, ``amp="bf16"``,
            ``optimizer="adamw"``); the checkpoint's (``strategy``, ``segments``, ``every``,
            ``policy``, ``budget_bytes``, ...) by name too. For a module the spec's
            ``device`` defaults to the target's.

    Returns:
        A :class:`PredictionResult`: the predicted summary (bytes; ``prediction`` holds the
        target, method, error bound, reserved and device-used bytes, ``fits`` and
        ``margin_bytes``) with ``id``, ``target``, ``status``, ``error`` and
        ``database_url``. A prediction that failed (an operation the fake tensors cannot
        run, say) is stored and returned with ``status`` failed and ``error`` saying why.

    Raises:
        ValueError: before anything is stored: an unknown target (naming the known ones), a
            ``capacity_bytes`` that is not a whole number above 0, an invalid spec
            (pydantic's ``ValidationError`` is a ``ValueError``), a ``sample`` with a spec or
            none with a module, or a module whose blocks or loss cannot be found.
        TypeError: ``model_or_spec`` is neither a spec nor an ``nn.Module``.
        sqlalchemy.exc.OperationalError: the database cannot be reached or migrated.

    Known limitations:
        - CUDA figures are modelled, not measured: they say they are unverified until
          ``scripts/gpu-check`` has measured that card (docs/benchmarks.md).
        - One training step at the sample's (or the spec's) shapes: data-dependent memory
          (variable sequence lengths) is predicted at that shape only.
        - An operation without a fake-tensor kernel (some custom ops) fails the prediction.
        - It runs in the caller's process, without the API's time limit or memory cap.
    """
    chosen = get_target(target)
    capacity = _capacity(capacity_bytes)
    spec, model, names = _spec_and_model(model_or_spec, sample, chosen, capacity, blocks, loss_fn, spec_fields)
    return predict_and_store(spec, chosen, capacity_bytes=capacity, model=model, names=names, database_url=database_url)


def predict_and_store(
    spec: ExperimentSpec,
    target: Target,
    *,
    capacity_bytes: int | None = None,
    model: Any = None,
    names: Mapping[str, str] | None = None,
    database_url: str | None = None,
) -> PredictionResult:
    """Predict ``spec`` on ``target`` in this process, store the prediction (succeeded, or
    failed with its first line) and return it; what :func:`predict` and ``ckptlab predict``
    share.

    Args:
        spec: a validated spec (a planned strategy with its budget).
        target: the device.
        capacity_bytes: the device's memory instead of the target's (bytes, checked).
        model: a built model in hand (:func:`ckptlab.worker.predict.predict_run`'s ``model``).
        names: summary fields to set over the prediction's (a module's ``model`` and
            ``blocks`` names).
        database_url: where to store it (default: the settings').

    Raises:
        sqlalchemy.exc.OperationalError: the database cannot be reached or migrated.
    """
    from ckptlab.analysis.timeline_rows import timeline_row
    from ckptlab.db.models import utcnow
    from ckptlab.worker.predict import predict_run

    started, clock = utcnow(), time.perf_counter()
    timelines: list[dict[str, Any]] = []
    try:
        summary, status, error = (
            predict_run(
                spec,
                target,
                capacity_bytes=capacity_bytes,
                model=model,
                on_timeline=lambda tl, is_peak: timelines.append(timeline_row(tl, is_peak)),
            ),
            Status.SUCCEEDED,
            None,
        )
    except Exception as exc:  # noqa: BLE001 - a failed prediction is stored and returned, as the API's
        summary, status, error = None, Status.FAILED, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if summary is not None and names:
        summary = RunSummary.model_validate({**summary.dump(), **names})
    elapsed = round(time.perf_counter() - clock, 3)
    outcome = (status, summary, error, timelines)
    return _store(database_url, spec, target, capacity_bytes, outcome, started, elapsed)


def _capacity(capacity_bytes: Any) -> int | None:
    """``capacity_bytes`` checked. Raises ValueError naming it unless None or a whole number
    in 1 .. :data:`MAX_CAPACITY_BYTES`."""
    if capacity_bytes is None:
        return None
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
        raise ValueError(f"capacity_bytes: expected a whole number of bytes, got {capacity_bytes!r}")
    if not 0 < capacity_bytes <= MAX_CAPACITY_BYTES:
        raise ValueError(f"capacity_bytes: must be above 0 and at most 2**50, got {capacity_bytes}")
    return capacity_bytes


def _with_fields(base: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a spec's JSON) with ``fields`` set over it; checkpoint field names go into
    ``checkpoint``."""
    checkpoint_names = set(CheckpointSpec.model_fields)
    out = {**base, **{k: v for k, v in fields.items() if k not in checkpoint_names}}
    checkpoint = {k: v for k, v in fields.items() if k in checkpoint_names}
    if checkpoint:
        out["checkpoint"] = {**dict(out.get("checkpoint") or {}), **checkpoint}
    return out


def _spec_and_model(
    model_or_spec: Any,
    sample: Any,
    target: Target,
    capacity_bytes: int | None,
    blocks: Any,
    loss_fn: Any,
    fields: Mapping[str, Any],
) -> tuple[ExperimentSpec, Any, dict[str, str]]:
    """The spec to predict, the built model to hand the predictor (None for a spec) and the
    names to add to the summary (a module's class and blocks). A planned strategy without a
    budget gets the target's default (:func:`ckptlab.prediction.budget.with_default_budget`)."""
    if isinstance(model_or_spec, ExperimentSpec | Mapping):
        if sample is not None or blocks is not None or loss_fn is not None:
            raise ValueError("sample, blocks and loss_fn are for an nn.Module, not a spec")
        base = model_or_spec.model_dump() if isinstance(model_or_spec, ExperimentSpec) else dict(model_or_spec)
        spec = with_default_budget(_with_fields(base, fields), target, capacity_bytes)
        return ExperimentSpec.model_validate(spec), None, {}
    if not isinstance(model_or_spec, nn.Module):
        raise TypeError(f"expected an ExperimentSpec, a spec dict or an nn.Module, got {type(model_or_spec).__name__}")
    if sample is None:
        raise ValueError("sample: a module is predicted on one micro-batch; pass (inputs, targets)")
    from ckptlab.worker.models.user_model import prepare_model

    ready = prepare_model(model_or_spec, sample, blocks=blocks, loss_fn=loss_fn)
    name = f"{type(model_or_spec).__module__}:{type(model_or_spec).__name__}"
    base = {
        "model": PythonModelSpec(target=name, depth=ready.depth).model_dump(),
        "batch_size": ready.batch_size,
        "device": target.device,
    }
    spec = ExperimentSpec.model_validate(with_default_budget(_with_fields(base, fields), target, capacity_bytes))
    return spec, ready.build(), {"model": ready.model, "blocks": ready.blocks}


def _store(
    database_url: str | None,
    spec: ExperimentSpec,
    target: Target,
    capacity_bytes: int | None,
    outcome: tuple[Status, RunSummary | None, str | None, list[dict[str, Any]]],
    started: Any,
    elapsed_s: float,
) -> PredictionResult:
    """Store the prediction (``outcome``: its status, summary, error and memory timelines'
    rows), migrating the database first, and return it as a result."""
    from ckptlab.db.database import make_engine, make_sessionmaker, migrate
    from ckptlab.db.store import create_prediction
    from ckptlab.settings import get_settings

    status, summary, error, timelines = outcome
    url = database_url or get_settings().resolved_database_url
    engine = make_engine(url)
    try:
        migrate(engine)
        with make_sessionmaker(engine)() as session:
            row = create_prediction(
                session,
                spec=spec,
                target=target.name,
                capacity_bytes=capacity_bytes,
                status=status,
                summary=summary,
                error=error,
                created_at=started,
                elapsed_s=elapsed_s,
                timelines=timelines,
            )
    finally:
        engine.dispose()
    return PredictionResult.model_validate(
        {
            **row.run_summary.dump(),
            "id": row.id,
            "target": row.target,
            "status": Status(row.status),
            "error": row.error,
            "database_url": make_url(url).render_as_string(hide_password=True),
        }
    )
