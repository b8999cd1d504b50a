"""Model kind ``torchvision``: specs validate without torch; where torchvision does not
import (the CPU torch here, beside the registry's CUDA-built torchvision wheel) the API
refuses the kind with a 422 saying why, and stores nothing."""

from __future__ import annotations

import sys

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.torchvision_model import TORCHVISION_ARCHITECTURES, torchvision_problem
from tests.factories import spec_dict


def test_a_torchvision_spec_validates_with_its_depth_and_defaults():
    spec = ExperimentSpec.model_validate(
        spec_dict(model={"kind": "torchvision", "architecture": "resnet50"}, **{"checkpoint.strategy": "sequential"})
    )
    assert spec.model.depth == 16 and spec.model.image_size == 224 and spec.model.num_classes == 1000
    with pytest.raises(ValueError, match="architecture"):
        ExperimentSpec.model_validate(spec_dict(model={"kind": "torchvision", "architecture": "alexnet"}))
    assert set(TORCHVISION_ARCHITECTURES) >= {"resnet50", "vit_b_16", "convnext_tiny"}


def test_the_problem_names_the_import_error_of_a_broken_install(tmp_path):
    # A stand-in interpreter whose torchvision import fails the way the CUDA-built wheel does.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'RuntimeError: operator torchvision::nms does not exist' >&2\nexit 1\n", encoding="utf-8"
    )
    fake.chmod(0o755)
    problem = torchvision_problem(str(fake))
    assert "operator torchvision::nms does not exist" in problem and "CUDA" in problem and "hf" in problem
    assert torchvision_problem(sys.executable) == torchvision_problem(sys.executable)  # cached, stable
