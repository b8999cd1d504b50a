"""The ``torchvision`` model of the experiment spec: a torchvision classification model
built with ``weights=None`` (random weights, nothing downloaded), and whether torchvision
imports where this process runs.

The package registry's ``torchvision==0.28.0`` wheel is built for the CUDA torch: beside the
CPU ``torch==2.13.0`` its import fails (``RuntimeError: operator torchvision::nms does not
exist``). The kind is offered where torchvision imports (a CUDA install, or any matching
pair); elsewhere the API refuses it with a 422 saying why (:func:`torchvision_problem`).
Nothing here imports torch: the check runs ``import torchvision`` in a child interpreter.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Literal

from pydantic import Field

from ckptlab.spec.base import SpecInt, _Strict

__all__ = ["TORCHVISION_ARCHITECTURES", "TorchvisionModelSpec", "torchvision_problem"]

#: Architectures and their number of blocks: ResNets' bottleneck / basic blocks of every
#: stage in order; ConvNeXt's and Swin's stage blocks with the downsampling layers between
#: stages; ViT's encoder layers (torchvision 0.28 ``models.get_model(name, weights=None)``).
TORCHVISION_ARCHITECTURES: dict[str, int] = {
    "resnet18": 2 + 2 + 2 + 2,
    "resnet50": 3 + 4 + 6 + 3,
    "resnet101": 3 + 4 + 23 + 3,
    "convnext_tiny": 3 + 3 + 9 + 3 + 3,
    "convnext_small": 3 + 3 + 27 + 3 + 3,
    "swin_t": 2 + 2 + 6 + 2 + 3,
    "vit_b_16": 12,
    "vit_b_32": 12,
}


class TorchvisionModelSpec(_Strict):
    """A torchvision classification model with random weights (``weights=None``).

    Args:
        architecture: one of :data:`TORCHVISION_ARCHITECTURES`.
        image_size: input height and width, pixels (ViT needs a multiple of its patch,
            16 or 32; default 224, the size the models were designed for).
        num_classes: classes of the final layer (default 1000).

    Shapes: inputs ``(batch_size, 3, image_size, image_size)``, targets ``(batch_size,)``.
    """

    kind: Literal["torchvision"] = "torchvision"
    architecture: Literal[tuple(TORCHVISION_ARCHITECTURES)] = Field(  # type: ignore[valid-type]
        description="weights=None: random, nothing downloaded"
    )
    image_size: SpecInt = Field(224, ge=32, le=1024, description="image height and width, pixels")
    num_classes: SpecInt = Field(1000, ge=1, le=100_000, title="Classes", description="classes of the final layer")

    @property
    def depth(self) -> int:
        """The number of blocks (see :data:`TORCHVISION_ARCHITECTURES`)."""
        return TORCHVISION_ARCHITECTURES[self.architecture]


@functools.cache
def torchvision_problem(python: str = sys.executable) -> str | None:
    """Why torchvision cannot be used with this environment's torch, or None when it imports.

    Runs ``import torchvision`` in a child ``python`` (once per process: cached), so the
    caller never imports torch.

    Returns:
        None, or one line: the import's last error line and what to do about it.
    """
    try:
        done = subprocess.run(
            [python, "-c", "import torchvision"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"torchvision could not be checked here: {exc}"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit code {done.returncode}"
    hint = (
        "the registry's torchvision 0.28.0 wheel is built for the CUDA torch and does not import beside "
        "the CPU torch 2.13.0; install a matching torch/torchvision pair (e.g. a CUDA install), or use model "
        "kind hf (resnet, convnext, vit, swin from transformers configs)"
    )
    if "No module named" in last:
        hint = "torchvision is not installed; install a torchvision built for this torch, or use model kind hf"
    return f"torchvision does not import here ({last}); {hint}"
