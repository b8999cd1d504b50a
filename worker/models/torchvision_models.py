"""torchvision classification models for the ``torchvision`` model kind, built with
``torchvision.models.get_model(name, weights=None)`` (random weights, nothing downloaded),
and their blocks in forward order.

- ResNets: the blocks of ``layer1`` … ``layer4`` in one ``nn.Sequential`` that replaces
  ``layer1`` (``layer2`` … ``layer4`` become ``nn.Identity``), so a segment may span stages;
- ConvNeXt and Swin: ``features[1:]`` (stages and the downsampling layers between them)
  flattened the same way, the stem (``features[0]``) kept in front;
- ViT: ``encoder.layers``.
The parameters are the same objects: the model computes exactly what it did.

Only where torchvision imports (see :mod:`ckptlab.spec.torchvision_model`); the API refuses the kind
elsewhere, and this module raises ``ValueError`` with the same reason.
"""

from __future__ import annotations

import torch
from torch import nn

from ckptlab.spec.torchvision_model import TorchvisionModelSpec, torchvision_problem

__all__ = ["build_torchvision", "torchvision_blocks"]


def _flat(modules) -> nn.Sequential:
    """Modules in order, a stage (a ``Sequential`` of blocks of one class) replaced by its
    blocks; a ``Sequential`` of mixed layers (ConvNeXt's LayerNorm + Conv2d downsampling)
    stays one block."""
    out: list[nn.Module] = []
    for m in modules:
        stage = isinstance(m, nn.Sequential) and len({type(c) for c in m}) == 1
        out.extend(m if stage else [m])
    return nn.Sequential(*out)


def torchvision_blocks(model: nn.Module) -> nn.Sequential:
    """Regroup ``model``'s repeated blocks into one ``nn.Sequential`` inside it (see the
    module's docstring) and return it.

    Raises:
        ValueError: a model of another family.
    """
    if all(hasattr(model, f"layer{i}") for i in range(1, 5)):  # ResNet
        blocks = _flat(getattr(model, f"layer{i}") for i in range(1, 5))
        model.layer1 = blocks
        for i in range(2, 5):
            setattr(model, f"layer{i}", nn.Identity())
        return blocks
    if isinstance(getattr(model, "features", None), nn.Sequential):  # ConvNeXt, Swin
        blocks = _flat(model.features[1:])
        model.features = nn.Sequential(model.features[0], blocks)
        return blocks
    encoder = getattr(model, "encoder", None)
    if encoder is not None and isinstance(getattr(encoder, "layers", None), nn.Sequential):  # ViT
        return encoder.layers
    raise ValueError(f"{type(model).__name__}: no known block layout")


def build_torchvision(spec: TorchvisionModelSpec):
    """Build the torchvision model a spec describes, as a :class:`ckptlab.worker.models.build.Built`.

    Raises:
        ValueError: torchvision does not import here (the reason and what to do), or the
            model's blocks are not the number the spec expects.
    """
    problem = torchvision_problem()
    if problem:
        raise ValueError(problem)
    import torchvision

    from ckptlab.worker.models.base import Built, default_loss

    kwargs = {"image_size": spec.image_size} if spec.architecture.startswith("vit") else {}
    model = torchvision.models.get_model(spec.architecture, weights=None, num_classes=spec.num_classes, **kwargs)
    blocks = torchvision_blocks(model)
    if len(blocks) != spec.depth:
        raise ValueError(f"{spec.architecture}: expected {spec.depth} blocks, found {len(blocks)}")
    n, classes = spec.image_size, spec.num_classes

    def make_batch(batch_size: int, gen: torch.Generator):
        images = torch.randn(batch_size, 3, n, n, generator=gen)
        return images, torch.randint(0, classes, (batch_size,), generator=gen)

    return Built(model, blocks, make_batch, default_loss)
