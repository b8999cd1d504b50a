import pytest
from pydantic import ValidationError

from ckptlab.presets import EXAMPLE_SPEC
from ckptlab.spec import ExperimentSpec
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


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"batch_size": 8.0}, ("batch_size", 8)),
        ({"model.depth": 4.0}, ("model.depth", 4)),
        ({"checkpoint.segments": 2.0, "checkpoint.strategy": "sequential"}, ("checkpoint.segments", 2)),
        ({"memory_limit_bytes": 1e9}, ("memory_limit_bytes", 1_000_000_000)),
    ],
)
def test_an_integral_float_is_the_integer_it_is(overrides, expected):
    spec = ExperimentSpec.model_validate(spec_dict(**overrides)).model_dump()
    path, value = expected
    node = spec
    for part in path.split("."):
        node = node[part]
    assert node == value and type(node) is int


@pytest.mark.parametrize("value", [8.5, "8", True, float("inf")])
def test_an_integer_field_still_refuses_what_is_not_an_integer(value):
    with pytest.raises(ValueError, match="batch_size"):
        ExperimentSpec.model_validate(spec_dict(batch_size=value))


def test_hf_config_integers_take_integral_floats_too():
    from tests.factories import hf_model

    spec = ExperimentSpec.model_validate({"model": hf_model("resnet", depths=[1.0, 2.0], num_labels=4.0)})
    assert spec.model.config_overrides["depths"] == [1, 2] and spec.model.config_overrides["num_labels"] == 4
    with pytest.raises(ValueError, match="expected an integer"):
        ExperimentSpec.model_validate({"model": hf_model("resnet", num_labels=4.5)})
