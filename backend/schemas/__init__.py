"""API schemas (``XCreate`` / ``XPublic``), kept apart from the ORM models.

``ExperimentCreate`` is the experiment spec itself (:class:`ckptlab.spec.experiment.ExperimentSpec`).
Every schema carries an example for ``/docs``. One module per resource; this package
re-exports them all.
"""

from ckptlab.backend.schemas.common import ErrorDetail, Format, Health, Message, Status
from ckptlab.backend.schemas.experiments import (
    AttemptPublic,
    AttemptsPublic,
    ComparisonPublic,
    EventPublic,
    EventsPublic,
    ExperimentCreate,
    ExperimentPublic,
    ExperimentsPublic,
    Metric,
    RunLogPublic,
    RunProgressPublic,
    SeriesPoint,
    SeriesPublic,
    StepPublic,
    StepsPublic,
)
from ckptlab.backend.schemas.meta import MetaPublic, StatusPublic
from ckptlab.backend.schemas.sweeps import (
    CHART_NAMES,
    ChartName,
    ChartPublic,
    InvalidCombination,
    PlannedRunPublic,
    ProgressPublic,
    RecommendationPublic,
    SweepCreate,
    SweepExperimentPublic,
    SweepPlanPublic,
    SweepPublic,
    SweepResultPublic,
    SweepResultsPublic,
    SweepsPublic,
    SweepSummaryPublic,
)
from ckptlab.backend.schemas.timelines import HolderPublic, PeakHoldersPublic, SpanPublic, TimelinePublic

__all__ = [
    "AttemptPublic",
    "AttemptsPublic",
    "ComparisonPublic",
    "CHART_NAMES",
    "ChartName",
    "ChartPublic",
    "ErrorDetail",
    "EventPublic",
    "EventsPublic",
    "ExperimentCreate",
    "ExperimentPublic",
    "RunLogPublic",
    "RunProgressPublic",
    "ExperimentsPublic",
    "Format",
    "Health",
    "HolderPublic",
    "InvalidCombination",
    "Message",
    "MetaPublic",
    "Metric",
    "PeakHoldersPublic",
    "PlannedRunPublic",
    "ProgressPublic",
    "RecommendationPublic",
    "SeriesPoint",
    "SeriesPublic",
    "SpanPublic",
    "StatusPublic",
    "Status",
    "StepPublic",
    "StepsPublic",
    "SweepCreate",
    "SweepExperimentPublic",
    "SweepPlanPublic",
    "SweepPublic",
    "SweepResultPublic",
    "SweepResultsPublic",
    "SweepsPublic",
    "SweepSummaryPublic",
    "TimelinePublic",
]
