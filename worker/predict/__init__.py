"""The prediction mode of the engine ("will it fit?"): a spec's memory on a target device
from its own training steps run on fake tensors (:func:`ckptlab.worker.predict.run.predict_run`),
and the ``python -m ckptlab.worker.predict`` entry (:mod:`ckptlab.worker.predict.__main__`)."""

from ckptlab.prediction.budget import default_budget_bytes
from ckptlab.worker.predict.run import predict_run

__all__ = ["predict_run", "default_budget_bytes"]
