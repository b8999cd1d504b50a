"""The experiment spec: the one definition of what a checkpointing experiment is.

Both processes import this module: the backend validates requests with it and the worker
builds the run from it. It never imports torch.

Example (JSON)::

    {"model": {"kind": "mlp", "depth": 32, "width": 1024, "dropout": 0.0},
     "batch_size": 64, "steps": 5, "warmup_steps": 1,
     "checkpoint": {"strategy": "sequential", "segments": 4,
                    "use_reentrant": false, "preserve_rng_state": true},
     "amp": "off", "optimizer": "adam", "device": "auto", "seed": 0}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = ["MLPSpec", "CheckpointSpec", "ExperimentSpec", "EXAMPLE_SPEC"]


class _Strict(BaseModel):
    """Base for spec parts: unknown fields are rejected, so a misspelled option is an
    error instead of a silently ignored default."""

    model_config = ConfigDict(extra="forbid")


class MLPSpec(_Strict):
    """A multi-layer perceptron: stem, ``depth`` identical blocks, head.

    Shapes: input ``(batch_size, width)`` float32 -> stem ``Linear(width, width) -> ReLU``
    -> ``depth`` x block ``Linear(width, width) -> ReLU [-> Dropout(dropout)]`` -> head
    ``Linear(width, 10)`` -> cross-entropy against 10 synthetic classes.
    Only the block list is checkpointed. Parameters: ``(depth + 1) * (width**2 + width) +
    10 * width + 10``.
    """

    kind: Literal["mlp"] = "mlp"
    depth: int = Field(32, ge=1, le=1024, description="number of identical blocks")
    width: int = Field(1024, ge=1, le=16384, description="features per block")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability after each block")


class CheckpointSpec(_Strict):
    """How the block list is checkpointed.

    Args:
        strategy: ``none`` keeps every activation; ``sequential`` runs
            ``torch.utils.checkpoint.checkpoint_sequential(blocks, segments, x)``.
        segments: number of segments for ``sequential`` (1 to ``model.depth``). PyTorch
            never checkpoints the last segment, so ``segments=1`` saves nothing.
        use_reentrant: passed to PyTorch. ``True`` is the legacy autograd.Function variant
            which gives no gradients when no input requires grad.
        preserve_rng_state: restore the RNG state before recomputation so dropout masks
            match the first forward. Default: True.
    """

    strategy: Literal["none", "sequential"] = "none"
    segments: int = Field(1, ge=1, description="segments for strategy 'sequential'")
    use_reentrant: bool = False
    preserve_rng_state: bool = True


class ExperimentSpec(_Strict):
    """One checkpointing experiment: a model, a checkpointing setting, and a short training run.

    Args:
        model: the model to train (see :class:`MLPSpec`).
        batch_size: samples per step (default 64).
        steps: training steps, warm-up included (default 5).
        warmup_steps: first steps left out of the medians (default 1; must be < steps).
        checkpoint: the checkpointing setting (see :class:`CheckpointSpec`).
        amp: ``off`` or ``bf16`` (forward under ``torch.autocast`` with bfloat16).
        optimizer: ``sgd`` or ``adam``.
        device: ``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``.
        seed: seeds the weights and the synthetic data.

    Raises:
        pydantic.ValidationError: on unknown fields, values out of range, or
            ``checkpoint.segments`` greater than ``model.depth``.
    """

    model: MLPSpec = Field(default_factory=MLPSpec)
    batch_size: int = Field(64, ge=1, le=65536)
    steps: int = Field(5, ge=1, le=100_000)
    warmup_steps: int = Field(1, ge=0)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    amp: Literal["off", "bf16"] = "off"
    optimizer: Literal["sgd", "adam"] = "adam"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = Field(0, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _cross_field_checks(self) -> ExperimentSpec:
        if self.warmup_steps >= self.steps:
            raise _field_error(
                ("warmup_steps",),
                self.warmup_steps,
                f"warmup_steps ({self.warmup_steps}) must be less than steps ({self.steps})",
            )
        ck = self.checkpoint
        if ck.strategy == "sequential" and ck.segments > self.model.depth:
            raise _field_error(
                ("checkpoint", "segments"),
                ck.segments,
                f"segments ({ck.segments}) must not exceed model.depth ({self.model.depth})",
            )
        return self


def _field_error(loc: tuple[str, ...], value: object, message: str) -> ValidationError:
    """A ValidationError located at ``loc``, for checks that involve several fields (so the
    API's 422 names the field to fix rather than the whole spec)."""
    return ValidationError.from_exception_data(
        "ExperimentSpec",
        [InitErrorDetails(type=PydanticCustomError("spec_constraint", message), loc=loc, input=value)],
    )


EXAMPLE_SPEC: dict = {
    "model": {"kind": "mlp", "depth": 32, "width": 1024, "dropout": 0.0},
    "batch_size": 64,
    "steps": 5,
    "warmup_steps": 1,
    "checkpoint": {
        "strategy": "sequential",
        "segments": 4,
        "use_reentrant": False,
        "preserve_rng_state": True,
    },
    "amp": "off",
    "optimizer": "adam",
    "device": "auto",
    "seed": 0,
}
