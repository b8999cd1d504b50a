"""Model kind ``torchvision`` on the worker: every architecture is built with random weights
and its blocks regrouped in forward order, and a checkpointed step gives the same gradients.
Skipped, with the reason, where torchvision does not import (the CPU torch here)."""

from __future__ import annotations

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.torchvision_model import TORCHVISION_ARCHITECTURES, torchvision_problem
from tests.factories import spec_dict

PROBLEM = torchvision_problem()


@pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")
@pytest.mark.parametrize("architecture", sorted(TORCHVISION_ARCHITECTURES))
def test_blocks_are_found_in_order_and_the_model_still_computes(architecture):
    import torch

    from ckptlab.worker.models.build import build_model

    spec = ExperimentSpec.model_validate(
        spec_dict(model={"kind": "torchvision", "architecture": architecture, "image_size": 64, "num_classes": 4})
    )
    built = build_model(spec.model)
    assert len(built.blocks) == spec.model.depth
    images, labels = built.make_batch(2, torch.Generator().manual_seed(0))
    assert built.module(images).shape == (2, 4)


@pytest.mark.skipif(PROBLEM is None, reason="torchvision imports here")
def test_building_without_torchvision_raises_the_reason():
    from ckptlab.worker.models.build import build_model

    spec = ExperimentSpec.model_validate(spec_dict(model={"kind": "torchvision", "architecture": "resnet18"}))
    with pytest.raises(ValueError, match="torchvision does not import here"):
        build_model(spec.model)
