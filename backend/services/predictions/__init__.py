"""Predictions ("will it fit?"): the prediction process (:mod:`.child`) and the requests,
rows and export records around it (:mod:`.records`). A package of its own, so that
``backend/services`` keeps a dozen modules."""

from ckptlab.backend.services.predictions.child import CHILD_MODULE, ChildRun, Outcome, child_argv, outcomes, run_child
from ckptlab.backend.services.predictions.records import (
    PREDICTION_COLUMNS,
    RETRY_AFTER_S,
    PredictionSlots,
    SlotsBusy,
    predict,
    prediction_record,
    store_outcomes,
)

__all__ = [
    "CHILD_MODULE",
    "ChildRun",
    "Outcome",
    "child_argv",
    "outcomes",
    "run_child",
    "PREDICTION_COLUMNS",
    "RETRY_AFTER_S",
    "PredictionSlots",
    "SlotsBusy",
    "predict",
    "prediction_record",
    "store_outcomes",
]
