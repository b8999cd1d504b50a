import pytest
from pydantic import ValidationError

from ckptlab.spec import EXAMPLE_SPEC, ExperimentSpec
from tests.factories import spec_dict


def locs(exc: ValidationError) -> list[tuple]:
    return [tuple(e["loc"]) for e in exc.errors()]


def test_example_spec_round_trips():
    spec = ExperimentSpec.model_validate(EXAMPLE_SPEC)
    assert ExperimentSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert spec.checkpoint.segments == 4 and spec.model.width == 1024


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"checkpoint.strategy": "sequential", "checkpoint.segments": 0}, ("checkpoint", "segments")),
        ({"checkpoint.strategy": "sequential", "checkpoint.segments": 9}, ("checkpoint", "segments")),
        ({"model.kind": "cnn"}, ("model", "kind")),
        ({"batch_size": 0}, ("batch_size",)),
        ({"amp": "fp8"}, ("amp",)),
        ({"steps": 2, "warmup_steps": 2}, ("warmup_steps",)),
    ],
)
def test_bad_values_are_rejected_at_their_field(overrides, loc):
    with pytest.raises(ValidationError) as ei:
        ExperimentSpec.model_validate(spec_dict(**overrides))
    assert locs(ei.value) == [loc]


def test_misspelled_field_is_rejected():
    d = spec_dict()
    d["checkpoint"]["segmets"] = 4
    with pytest.raises(ValidationError) as ei:
        ExperimentSpec.model_validate(d)
    assert locs(ei.value) == [("checkpoint", "segmets")]


def test_segments_up_to_depth_are_accepted():
    spec = ExperimentSpec.model_validate(spec_dict(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 8}))
    assert spec.checkpoint.segments == spec.model.depth == 8


def test_segments_beyond_depth_allowed_when_not_checkpointing():
    # segments only matter for strategy 'sequential'
    spec = ExperimentSpec.model_validate(spec_dict(**{"checkpoint.segments": 99}))
    assert spec.checkpoint.strategy == "none"
