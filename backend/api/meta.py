"""Routes about the server itself: liveness and the vocabulary (``/api/meta``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from ckptlab.backend.deps import SessionDep, SettingsDep
from ckptlab.backend.schemas import CHART_NAMES, Health, MetaPublic, StatusPublic
from ckptlab.domain import SERIES_METRICS, MemoryCategory, Status
from ckptlab.prediction.targets import TARGETS, target_names
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
from ckptlab.spec.kinds import MODEL_KIND_TABLE, model_kind_names
from ckptlab.spec.presets import PRESETS
from ckptlab.spec.sweeps import AXIS_NAMES
from ckptlab.spec.torchvision_model import TORCHVISION_ARCHITECTURES
from ckptlab.strategies import STRATEGIES, SelectivePolicy, strategy_names

router = APIRouter(tags=["meta"])


@router.get("/health", response_model=Health, summary="Liveness and database check")
def health(session: SessionDep, request: Request) -> Health:
    """``ok`` and the database dialect once a ``SELECT 1`` has answered."""
    session.execute(text("SELECT 1"))
    return Health(database=session.get_bind().dialect.name, version=request.app.version)


@router.get("/meta", response_model=MetaPublic, summary="Statuses, spec choices and limits for clients")
def meta(settings: SettingsDep) -> MetaPublic:
    """The vocabulary defined once in :mod:`ckptlab.domain`, :mod:`ckptlab.strategies`, the
    model-kind table (:mod:`ckptlab.spec.kinds`), the prediction targets
    (:mod:`ckptlab.prediction.targets`) and :mod:`ckptlab.spec.experiment`, so the
    frontend never spells a status, a strategy, a model kind, an axis or a field bound of its
    own. The tables are read when asked: a kind or strategy registered since start-up is in it."""
    return MetaPublic(
        statuses=[StatusPublic(name=s, finished=s.finished) for s in Status],
        memory_categories=[c.value for c in MemoryCategory],
        model_kinds=model_kind_names(),
        model_kind_table=[MODEL_KIND_TABLE[name].public() for name in model_kind_names()],
        strategies=strategy_names(),
        strategy_table=[STRATEGIES[name].public() for name in strategy_names()],
        policies=[p.value for p in SelectivePolicy],
        sweep_axes={path: list(names) for path, names in AXIS_NAMES.items()},
        presets=PRESETS,
        series_metrics=list(SERIES_METRICS),
        chart_names=list(CHART_NAMES),
        max_sweep_size=settings.max_sweep_size,
        write_token_required=settings.api_token is not None,
        spec_schema=ExperimentSpec.model_json_schema(),
        torchvision_architectures=dict(TORCHVISION_ARCHITECTURES),
        hf_architectures={name: arch.public() for name, arch in HF_ARCHITECTURES.items()},
        targets=[TARGETS[name].public() for name in target_names()],
    )
