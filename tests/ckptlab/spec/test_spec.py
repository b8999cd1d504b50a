import dataclasses
import re
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.kinds import (
    ModelKind,
    default_model_kind,
    get_model_kind,
    model_kind_names,
    register_model_kind,
    registered,
)
from ckptlab.spec.presets import EXAMPLE_SPEC
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


# ----------------------------------------------------------------- the model-kind table


class _WideSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["wide_test"] = "wide_test"
    depth: int = Field(2, ge=1)
    width: int = Field(4, ge=1, le=8)
    note: str | None = None


def _wide(**changes) -> ModelKind:
    entry = ModelKind(
        name="wide_test",
        spec=_WideSpec,
        summary="a test's kind",
        label="{kind} {depth}x{width}[ ({note})]",
        builder="tests.conftest:build_noop_model",
        example={"depth": 2},
        rank=99,
        count_parameters=lambda m: m.depth * m.width,
    )
    return dataclasses.replace(entry, **changes)


def test_the_model_validates_through_the_table_as_it_is_when_validated():
    body = {"model": {"kind": "wide_test", "width": 8}}
    with pytest.raises(ValidationError) as ei:
        ExperimentSpec.model_validate(body)
    assert locs(ei.value) == [("model", "kind")] and "wide_test" not in ei.value.errors()[0]["msg"].split(";")[1]
    with registered(_wide()):
        spec = ExperimentSpec.model_validate(body)
        assert isinstance(spec.model, _WideSpec) and spec.model.width == 8
        assert ExperimentSpec.model_validate_json(spec.model_dump_json()) == spec
        assert spec.model_dump()["model"] == {"kind": "wide_test", "depth": 2, "width": 8, "note": None}
        with pytest.raises(ValidationError) as ei:
            ExperimentSpec.model_validate({"model": {"kind": "wide_test", "width": 9}})
        assert locs(ei.value) == [("model", "width")]  # the field, no union tag: the form's path
        mapping = ExperimentSpec.model_json_schema()["properties"]["model"]["discriminator"]["mapping"]
        assert mapping["wide_test"] == "#/$defs/_WideSpec"
    with pytest.raises(ValidationError):
        ExperimentSpec.model_validate(body)
    assert "wide_test" not in model_kind_names()


def test_a_model_without_kind_is_the_default_kind_and_a_non_object_is_refused():
    spec = ExperimentSpec.model_validate({"model": {"depth": 3}})
    assert spec.model.kind == default_model_kind() == ExperimentSpec().model.kind
    assert "kind" in spec.model.model_fields_set  # stored with its kind
    with pytest.raises(ValidationError) as ei:
        ExperimentSpec.model_validate({"model": 5})
    assert locs(ei.value) == [("model",)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "Wide"}, "lower-case"),
        ({"name": "other_test"}, "needs the field kind"),
        ({"builder": "no_colon"}, "package.module:function"),
        ({"count_parameters": None}, "uncounted"),
        ({"default": True}, "already the default kind"),
        ({"label": "{kind} {nope}"}, "lacks: ['nope']"),
        ({"label": "{depth:3d}"}, "plain {field} placeholders"),
        ({"example": {"nope": 1}}, "lacks: ['nope']"),
        ({"name": "mlp"}, "already registered"),
    ],
)
def test_registration_refuses_an_entry_the_table_cannot_serve(changes, message):
    before = model_kind_names()
    with pytest.raises(ValueError, match=re.escape(message)):
        register_model_kind(_wide(**changes))
    assert model_kind_names() == before


def test_every_built_in_kind_is_complete():
    for name in model_kind_names():
        entry = get_model_kind(name)
        # Counted, or says why not (torchvision, custom, python): no silent skip.
        assert (entry.count_parameters is None) == bool(entry.uncounted), name
        fields = entry.fields()
        assert set(entry.example) <= set(fields) | entry.extra_fields, name
        required = {f for f, info in fields.items() if info["required"]} - set(entry.example)
        if not required:  # the form's starting values are a valid model
            ExperimentSpec.model_validate({"model": {"kind": name, **entry.example}})
        assert "?" not in entry.label_for(entry.example) or required, name
    assert get_model_kind("torchvision").count_parameters is None


def test_the_label_fills_fields_and_drops_optional_parts_without_them():
    entry = _wide()
    assert entry.label_for({"depth": 3, "width": 4}) == "wide_test 3x4"
    assert entry.label_for({"depth": 3, "width": None, "note": "n"}) == "wide_test 3x? (n)"
    hf = get_model_kind("hf")
    assert hf.label_for({"architecture": "llama", "num_hidden_layers": 2, "seq_len": 16}) == "hf llama 2 layers, seq 16"
    assert hf.label_for({"architecture": "vit", "image_size": None}) == "hf vit"


def test_the_fields_come_from_the_spec_class_json_schema():
    fields = get_model_kind("mlp").fields()
    assert fields["depth"] == {
        "type": "int",
        "title": "Depth",
        "required": False,
        "nullable": False,
        "default": 32,
        "minimum": 1,
        "maximum": 1024,
        "description": "number of identical blocks",
    }
    assert fields["dropout"]["exclusive_maximum"] == 1 and fields["stem"]["type"] == "bool"
    hf = get_model_kind("hf").fields()
    assert hf["seq_len"]["nullable"] and (hf["seq_len"]["minimum"], hf["seq_len"]["maximum"]) == (2, 32768)
    assert hf["architecture"]["type"] == "choice" and "llama" in hf["architecture"]["enum"]
    assert get_model_kind("custom").fields()["options"]["type"] == "json"


@pytest.mark.parametrize(
    ("distributed", "extra", "loc", "words"),
    [
        ({"world_size": 2}, {}, ("distributed", "world_size"), "needs kind 'ddp' or 'fsdp2'"),
        ({"kind": "ddp", "world_size": 2, "mixed_precision": {}}, {}, ("distributed", "mixed_precision"), "FSDP2"),
        ({"kind": "fsdp2", "world_size": 0}, {}, ("distributed", "world_size"), "greater than or equal to 1"),
        (
            {"kind": "fsdp2", "world_size": 2, "find_unused_parameters": True},
            {},
            ("distributed", "find_unused_parameters"),
            "DDP's option",
        ),
        ({"kind": "fsdp2", "world_size": 2}, {"device": "cuda"}, ("device",), "CPU ranks"),
        (
            {"kind": "ddp", "world_size": 2},
            {"checkpoint": {"strategy": "compile_budget"}},
            ("checkpoint", "strategy"),
            "compiles",
        ),
    ],
)
def test_a_sharded_spec_is_refused_at_the_field_that_cannot_run(distributed, extra, loc, words):
    with pytest.raises(ValidationError) as info:
        ExperimentSpec.model_validate({**spec_dict(**extra), "distributed": distributed})
    (error,) = info.value.errors()
    assert error["loc"] == loc and words in error["msg"]


def test_a_sharded_spec_defaults_to_fsdp2s_recommended_units():
    spec = ExperimentSpec.model_validate({**spec_dict(), "distributed": {"kind": "fsdp2", "world_size": 4}})
    d = spec.distributed
    assert (d.shard_unit, d.reshard_after_forward, d.mixed_precision) == ("block", True, None)
    assert ExperimentSpec.model_validate(spec_dict()).distributed.kind == "none"
