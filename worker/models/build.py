"""Build the model an experiment spec describes: dispatch on ``spec.kind`` through the
model-kind table (:mod:`ckptlab.spec.kinds`) to the entry's ``builder``, a ``"module:function"``
imported here when first used (:mod:`~ckptlab.worker.models.builtin`,
:mod:`~ckptlab.worker.models.plugins`, :mod:`~ckptlab.worker.models.hf_models`,
:mod:`~ckptlab.worker.models.torchvision_models`, or a module of the code that registered a
kind), so a kind's heavy imports (transformers, torchvision) load only for its runs."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from ckptlab.spec.experiment import ModelSpec  # importing it registers the built-in kinds
from ckptlab.spec.kinds import get_model_kind
from ckptlab.worker.models.base import Built

__all__ = ["build_model", "builder_of"]


@functools.cache
def builder_of(target: str) -> Callable[[Any], Built]:
    """The builder function at ``target`` (``"package.module:function"``), imported once per
    process (cached).

    Raises:
        ImportError: the module does not import.
        AttributeError: the module has no such function.
    """
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def build_model(spec: ModelSpec) -> Built:
    """Build the model a spec describes (``ExperimentSpec.model``): its kind's builder from
    the model-kind table, called with the spec.

    Raises:
        ValueError: the kind is not registered in this process, or its builder refuses the
            spec (a custom model that cannot be loaded, torchvision that does not import).
    """
    return builder_of(get_model_kind(spec.kind).builder)(spec)
