"""``ckptlab.spec.hf_catalog``: the table of Hugging Face architectures the API validates against, without
importing transformers, agrees with the installed transformers; ``hf`` specs are checked
field by field."""

from __future__ import annotations

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.hf_catalog import HF_ARCHITECTURES
from tests.factories import hf_model


@pytest.mark.parametrize("architecture", sorted(HF_ARCHITECTURES))
def test_defaults_are_the_config_classes(architecture):
    transformers = pytest.importorskip("transformers")
    arch = HF_ARCHITECTURES[architecture]
    config = getattr(transformers, arch.config_class)()
    for name, field in arch.fields.items():
        actual = getattr(config, name)
        if field.default is None:  # derived by the config (GPT-2's n_inner, Llama's kv heads)
            continue
        expected = list(field.default) if isinstance(field.default, tuple) else field.default
        assert (list(actual) if isinstance(actual, tuple) else actual) == expected, name


@pytest.mark.parametrize("architecture", sorted(HF_ARCHITECTURES))
def test_depth_counts_the_blocks_the_worker_finds(architecture):
    pytest.importorskip("transformers")
    from ckptlab.worker.models.hf_models import build_hf

    spec = ExperimentSpec.model_validate({"model": hf_model(architecture)})
    assert len(build_hf(spec.model).blocks) == spec.model.depth


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hidden_sizee", 3, "unknown field"),
        ("hidden_size", "64", "expected an integer"),
        ("hidden_size", True, "expected an integer"),
        ("num_hidden_layers", 0, "between"),
        ("image_size", 64, "does not apply"),
        ("num_key_value_heads", 3, "must divide"),
        ("tie_word_embeddings", 1, "true or false"),
    ],
)
def test_bad_config_fields_are_errors_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        ExperimentSpec.model_validate({"model": hf_model("llama", **{field: value})})
    assert info.value.errors()[0]["loc"][-1] == field


def test_a_config_default_that_does_not_fit_is_named_as_the_default():
    body = {"model": {"kind": "hf", "architecture": "mistral", "hidden_size": 64, "num_attention_heads": 4}}
    with pytest.raises(ValueError, match=r"num_key_value_heads \(8, the config default\)"):
        ExperimentSpec.model_validate(body)


def test_stage_lists_need_one_value_per_stage():
    with pytest.raises(ValueError, match="one value per stage"):
        ExperimentSpec.model_validate({"model": hf_model("swin", num_heads=[1, 2])})
    spec = ExperimentSpec.model_validate({"model": hf_model("resnet", depths=[2, 2, 1], hidden_sizes=[8, 8, 8])})
    assert spec.model.depth == 5


def test_the_stored_spec_round_trips():
    spec = ExperimentSpec.model_validate({"model": hf_model("gpt2")})
    again = ExperimentSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec and again.model.config_overrides == spec.model.config_overrides


@pytest.mark.parametrize("architecture", sorted(HF_ARCHITECTURES))
def test_each_architecture_has_a_small_example_the_form_can_start_from(architecture):
    from ckptlab.spec.limits import estimate_param_count

    example = HF_ARCHITECTURES[architecture].public()["example"]
    spec = ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": architecture, **example}})
    assert 10_000 < estimate_param_count(spec) < 5_000_000  # seconds per step on a laptop CPU


@pytest.mark.parametrize("architecture", [{}, [], None, 3])
def test_an_architecture_of_another_type_is_an_error_naming_it(architecture):
    with pytest.raises(ValueError, match="architecture"):
        ExperimentSpec.model_validate({"model": {"kind": "hf", "architecture": architecture}})
