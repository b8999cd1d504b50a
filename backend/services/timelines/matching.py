"""The predictions of a run's spec that have a memory timeline, for "compare with
prediction" (issue 34): matched by :func:`ckptlab.prediction.matching.prediction_key`."""

from __future__ import annotations

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from ckptlab.db.models import Experiment, Prediction, PredictionTimeline
from ckptlab.domain import Status
from ckptlab.prediction.matching import prediction_key
from ckptlab.spec.experiment import ExperimentSpec

__all__ = ["MATCH_CANDIDATES", "predictions_of"]

#: Predictions of the run's model kind and strategy looked at, newest first.
MATCH_CANDIDATES = 500


def _key(spec: ExperimentSpec | None) -> str | None:
    return prediction_key(spec.model_dump(mode="json")) if spec is not None else None


def predictions_of(session: Session, exp: Experiment, limit: int) -> list[Prediction]:
    """The predictions that succeeded with a memory timeline whose spec is ``exp``'s but for
    what a prediction does not read (:mod:`ckptlab.prediction.matching`), newest first, at
    most ``limit``, among the :data:`MATCH_CANDIDATES` newest of its model kind and strategy;
    none for a run whose stored spec no longer validates."""
    key = _key(exp.experiment_spec)
    if key is None:
        return []
    q = (
        select(Prediction)
        .where(
            Prediction.model_kind == exp.model_kind,
            Prediction.strategy == exp.strategy,
            Prediction.status == Status.SUCCEEDED,
            exists().where(PredictionTimeline.prediction_id == Prediction.id),
        )
        .order_by(Prediction.id.desc())
        .limit(MATCH_CANDIDATES)
    )
    return [p for p in session.scalars(q) if _key(p.experiment_spec) == key][:limit]
