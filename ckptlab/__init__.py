"""ckptlab: activation checkpointing experiments and their measurement.

``ckptlab.profile(model, sample, ...)`` runs the engine on a model in hand (see
:func:`ckptlab.worker.profile.profile`); ``ckptlab.predict(model_or_spec, ...)`` predicts
whether a spec or a model fits on a target device (see
:func:`ckptlab.worker.predict_api.predict`). They are loaded on first use (PEP 562), so
``import ckptlab`` stays free of torch and of the worker.
"""

from typing import Any

__all__ = ["predict", "profile"]


def __getattr__(name: str) -> Any:
    if name == "profile":
        from ckptlab.worker.profile import profile

        return profile
    if name == "predict":
        from ckptlab.worker.predict_api import predict

        return predict
    raise AttributeError(f"module 'ckptlab' has no attribute {name!r}")
