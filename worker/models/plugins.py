"""Users' models: the ``custom`` kind (an entry point) and the ``python`` kind (a factory at a
dotted target), both called through :func:`_from_factory`.

Users' own models: an installed package registers a factory in the ``ckptlab.models``
entry-point group, e.g. in its ``pyproject.toml``::

    [project.entry-points."ckptlab.models"]
    my_model = "my_pkg.ckpt:factory"

``factory(**options)`` returns ``(module, blocks, make_batch)`` or ``(module, blocks,
make_batch, loss_fn)`` where ``make_batch(batch_size, generator) -> (inputs, targets)``.
The default loss: the output itself when it is a scalar, cross-entropy for integer
targets, else mean squared error.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from importlib.metadata import entry_points

from torch import nn

from ckptlab.spec.models import MODEL_ENTRY_POINT_GROUP, CustomModelSpec, PythonModelSpec
from ckptlab.worker.models.base import Built, default_loss

__all__ = ["ENTRY_POINT_GROUP", "build_custom", "build_python"]

ENTRY_POINT_GROUP = MODEL_ENTRY_POINT_GROUP


def build_custom(spec: CustomModelSpec) -> Built:
    """A model from the ``ckptlab.models`` entry-point group, looked up when the experiment
    is built (in the child of a claimed experiment), so a package installed while the worker
    runs is found without a restart. The factory is called as :func:`_from_factory` says.

    Raises:
        ValueError: no installed entry point has that name, or the factory's result is
            wrong (see :func:`_from_factory`).
    """
    _see_new_packages()
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.name]
    if not found:
        names = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise ValueError(
            f"no model {spec.name!r} in entry-point group {ENTRY_POINT_GROUP!r}; installed: {names or 'none'}"
        )
    return _from_factory(found[0].load(), spec.options, depth=spec.depth, label=spec.name)


def build_python(spec: PythonModelSpec) -> Built:
    """A model from the factory at ``spec.target`` (``package.module:factory``), imported
    here. Whether it may be imported is decided before: a worker checks its allow-list
    (:func:`ckptlab.worker.service.outcome.record_run`), the API never imports it.

    Raises:
        ValueError: the module or attribute does not exist, or the factory's result is
            wrong (see :func:`_from_factory`).
    """
    _see_new_packages()
    module_name, attr = spec.target.split(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"python target {spec.target!r} cannot be loaded: {exc}") from exc
    return _from_factory(factory, spec.kwargs, depth=spec.depth, label=spec.target)


def _from_factory(factory: Callable, options: dict, *, depth: int, label: str) -> Built:
    """Call a model factory: ``factory(depth=depth, **options)`` (``depth`` only when the
    factory takes it, by name or ``**kwargs``, and ``options`` does not set it). It returns
    ``(module, blocks, make_batch)`` or ``(module, blocks, make_batch, loss_fn)``.

    Raises:
        ValueError: the result has the wrong shape, ``blocks`` is not an
            ``nn.Sequential`` / ``nn.ModuleList``, or it holds other than ``depth`` blocks.
    """
    kwargs = dict(options)
    if "depth" not in kwargs and _takes(factory, "depth"):
        kwargs["depth"] = depth
    result = factory(**kwargs)
    if not isinstance(result, tuple) or len(result) not in (3, 4):
        raise ValueError(f"factory {label!r} must return (module, blocks, make_batch[, loss_fn])")
    module, blocks, make_batch = result[:3]
    loss_fn = result[3] if len(result) == 4 else default_loss
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"factory {label!r}: blocks must be nn.Sequential or nn.ModuleList")
    if len(blocks) != depth:
        raise ValueError(f"factory {label!r} returned {len(blocks)} blocks but model.depth is {depth}")
    return Built(module, blocks, make_batch, loss_fn)


def _see_new_packages() -> None:
    """Make packages installed since this process started importable: drop the import
    system's directory caches, and re-read the site directories' ``.pth`` files, which is
    where ``pip install -e`` puts a project's path (``site.addsitedir`` skips paths already
    on ``sys.path``). Runs in the disposable child of one experiment."""
    import site

    importlib.invalidate_caches()
    dirs = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    for d in dirs:
        if os.path.isdir(d):
            site.addsitedir(d)
    importlib.invalidate_caches()


def _takes(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts a keyword argument ``name`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
