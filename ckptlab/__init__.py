"""ckptlab: activation checkpointing experiments and their measurement.

``ckptlab.profile(model, sample, ...)`` runs the engine on a model in hand (see
:func:`ckptlab.worker.profile.profile`). It is loaded on first use (PEP 562), so ``import ckptlab``
stays free of torch and of the worker.
"""

from typing import Any

__all__ = ["profile"]


def __getattr__(name: str) -> Any:
    if name == "profile":
        from ckptlab.worker.profile import profile

        return profile
    raise AttributeError(f"module 'ckptlab' has no attribute {name!r}")
