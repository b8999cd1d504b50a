"""The model-kind table: every model kind, declared once.

Each :class:`ModelKind` names the pydantic spec class of ``model`` (its ``kind: Literal[name]``
field is the discriminator), the form's option text and label template, the worker's builder
(``"module:function"``, imported by the worker only), the parameter counter and the admission
check the API runs, the form's starting values and a sort rank. Spec validation and its JSON
schema (:func:`model_spec_type`, the type of ``ExperimentSpec.model``), the limits
(:mod:`ckptlab.spec.limits`), ``GET /api/meta`` (``model_kind_table``), the form and the
worker (``ckptlab.worker.models.build.build_model``) all read this table, as it is when they
read it: a kind registered after import is accepted, listed and built. The built-in entries are
in :mod:`ckptlab.spec.model_kinds`, registered when it is imported (:mod:`ckptlab.spec.experiment`
imports it, so the table is full wherever a spec is). This module imports neither torch nor
FastAPI.

Example usage (adding a model kind; see docs/architecture.md, "Adding a model kind")::

    from ckptlab.spec.kinds import ModelKind, register_model_kind

    register_model_kind(ModelKind(
        name="wide", spec=WideSpec, summary="a wide MLP", label="{kind} {depth}x{width}",
        builder="my_pkg.models:build_wide", count_parameters=lambda m: m.depth * (m.width**2 + m.width),
        example={"depth": 4, "width": 512}, rank=5,
    ))

Known limitations:
    - The spec class is validated in Python mode (``model_validate``) even under
      ``ExperimentSpec.model_validate_json``: a field type whose JSON form differs from its
      Python form (an ``Enum``, a ``tuple``) must accept both itself.
    - Registration is per process: a kind registered in a worker that the API process does
      not know is refused by the API (422), never run by surprise.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args

from pydantic import AfterValidator, BaseModel, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

from ckptlab.spec.base import _field_error

if TYPE_CHECKING:
    from ckptlab.settings import Settings

__all__ = [
    "ActivationFloor",
    "ModelKind",
    "MODEL_KIND_TABLE",
    "model_spec_type",
    "ModelKindName",
    "register_model_kind",
    "registered",
    "get_model_kind",
    "model_kind_names",
    "default_model_kind",
    "default_model",
]

#: ``check(model, settings) -> [(field, value, message), ...]``: why the server refuses a
#: valid model (an entry point not installed, a target not allowed); each error is located
#: at ``model.<field>``.
Check = Callable[[Any, "Settings"], Iterable[tuple[str, Any, str]]]
_NAME = re.compile(r"^[a-z0-9_]+$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
#: JSON schema ``type`` -> the form's field type (``choice`` for an ``enum``).
_TYPES = {"integer": "int", "number": "float", "boolean": "bool", "string": "str"}
#: JSON schema keyword -> the served name (``ge``/``le``: what pydantic writes for a bound of a
#: nullable integer such as ``SpecInt | None``).
_BOUNDS = {
    "ge": "minimum",
    "le": "maximum",
    "gt": "exclusive_minimum",
    "lt": "exclusive_maximum",
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusiveMinimum": "exclusive_minimum",
    "exclusiveMaximum": "exclusive_maximum",
    "maxLength": "max_length",
    "pattern": "pattern",
    "examples": "examples",
    "description": "description",
    "enum": "enum",
}


@dataclass(frozen=True)
class ActivationFloor:
    """Bytes per sample that one training step of a model holds whatever is checkpointed
    (pure arithmetic from the model's fields: a lower bound, not a prediction). A model
    kind's ``activation_floor(model, element_bytes)`` answers it; ``element_bytes`` is the
    size of an activation element (4 in float32, 2 under autocast, so the bound holds
    either way). :func:`ckptlab.spec.limits.estimate_activation_bytes` combines it with
    the spec's batch and strategy.

    Attributes:
        batch: the batch (inputs and targets), alive from the forward to the end of backward.
        blocks: each block's input, in order: a block that runs without checkpointing keeps
            (at least) its input for backward, a checkpointed group keeps its first block's
            input, and a group recomputed during backward holds every one of its blocks'
            inputs again. 0 where the input is the batch itself.
        kept: what the stem, the head and the loss keep at the loss's backward beside the
            batch and the blocks' inputs (no strategy checkpoints them): tensors their layers
            saved, the output the step holds, and for a cross-entropy loss the float32
            log-probabilities with their incoming gradient.
        fields: the model's fields to lower for a lower floor (a refusal names them beside
            ``batch_size``, which every term grows with).
    """

    batch: int
    blocks: tuple[int, ...]
    kept: int
    fields: tuple[str, ...]


@dataclass(frozen=True)
class ModelKind:
    """One model kind.

    Attributes:
        name: the value of ``model.kind`` (``[a-z0-9_]+``).
        spec: the pydantic class of such a model; its ``kind: Literal[name] = name`` field is
            the discriminator, and it has a ``depth`` (a field or a property: the number of
            blocks the worker checkpoints).
        summary: one line on what it is (the form's option text).
        label: a ``str.format`` template over the model's fields describing one model, e.g.
            ``"{kind} {depth}×{width}"``; a part in ``[brackets]`` shows only when every
            field in it has a value, a missing field elsewhere reads ``?``.
        builder: ``"module:function"`` of the worker's builder, ``function(model) ->
            ckptlab.worker.models.base.Built``; imported by the worker only, when first used.
        example: the form's starting values of the model's fields (``kind`` left out).
        rank: sort rank in lists and the form, lowest first.
        count_parameters: ``count_parameters(model) -> int``, the exact number of trainable
            parameters the builder makes (pure arithmetic), for the server's parameter and
            memory limits; None when the API cannot know it (then ``uncounted`` says why).
        uncounted: why ``count_parameters`` is None (``GET /api/meta`` serves it: the kind's
            parameter limit is not checked). Required when ``count_parameters`` is None.
        check: the server-side admission check (:data:`Check`), or None.
        activation_floor: ``activation_floor(model, element_bytes) -> ActivationFloor``,
            what a training step holds per sample whatever is checkpointed (pure arithmetic,
            a lower bound), for the server's activation limit; None where the API cannot
            know the model's shapes (``custom``, ``python``, ``torchvision``: no limit).
        default: the kind of a ``model`` that gives no ``kind`` (one entry at most).
        note: a sentence the form shows under the kind's fields.
        option_text: the form's text of an ``enum`` field's values, ``{field: {value: text}}``.
        extra_fields: fields a spec of this kind may set beyond the class's declared ones
            (``extra="allow"``: the ``hf`` config fields), so that sweeps accept them as axes.
        renderer: a form renderer for fields the class does not declare (``"hf_config"``:
            frontend/form_hf.js draws the chosen architecture's config fields); None: the
            form draws the declared fields from :meth:`fields`.
    """

    name: str
    spec: type[BaseModel]
    summary: str
    label: str
    builder: str
    example: Mapping[str, Any]
    rank: int
    count_parameters: Callable[[Any], int] | None = None
    uncounted: str = ""
    check: Check | None = None
    activation_floor: Callable[[Any, int], ActivationFloor] | None = None
    default: bool = False
    note: str = ""
    option_text: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    extra_fields: frozenset[str] = frozenset()
    renderer: str | None = None

    def label_for(self, model: Mapping[str, Any]) -> str:
        """The one-line description of a model (``"mlp 8×256"``) from its fields.

        Args:
            model: the model's fields (a spec's ``model`` as JSON, possibly incomplete).

        Returns:
            :attr:`label` filled in: a missing or null field reads ``?``; a ``[bracketed]``
            part is dropped unless every field in it has a value.
        """
        values = {"kind": self.name, **model}

        def present(name: str) -> bool:
            return values.get(name) is not None and values.get(name) != ""

        def optional(m: re.Match[str]) -> str:
            return m.group(1) if all(present(f) for f in _label_fields(m.group(1))) else ""

        text = _OPTIONAL.sub(optional, self.label)
        return text.format_map(_Missing({k: v for k, v in values.items() if v is not None and v != ""}))

    def fields(self) -> dict[str, dict[str, Any]]:
        """The spec class's fields (``kind`` left out) from its JSON schema, in order.

        Returns:
            ``{name: {"type", "title", "required", "nullable"[, "default", "minimum",
            "maximum", "exclusive_minimum", "exclusive_maximum", "enum", "description",
            "max_length", "pattern", "examples"]}}``; ``type`` is ``int``, ``float``,
            ``bool``, ``str``, ``choice`` (an ``enum``) or ``json`` (an object or a list).
        """
        schema = self.spec.model_json_schema()
        required = set(schema.get("required", ()))
        return {
            name: _public_field(name, prop, name in required)
            for name, prop in schema.get("properties", {}).items()
            if name != "kind"
        }

    def public(self) -> dict[str, Any]:
        """What ``GET /api/meta`` serves of it (the frontend's only source)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "label": self.label,
            "example": dict(self.example),
            "rank": self.rank,
            "default": self.default,
            "fields": self.fields(),
            "note": self.note,
            "option_text": {f: dict(texts) for f, texts in self.option_text.items()},
            "renderer": self.renderer,
            "parameter_limit_checked": self.count_parameters is not None,
            "parameter_limit_note": self.uncounted or None,
        }


def _public_field(name: str, prop: Mapping[str, Any], required: bool) -> dict[str, Any]:
    branches = prop.get("anyOf", [prop])
    kept = [b for b in branches if b.get("type") != "null"]
    merged = {**prop, **kept[0]} if len(kept) == 1 else dict(prop)
    kind = "choice" if "enum" in merged else _TYPES.get(merged.get("type", ""), "json")
    out: dict[str, Any] = {
        "type": kind,
        "title": merged.get("title", name),
        "required": required,
        "nullable": len(kept) < len(branches),
    }
    if "default" in prop:
        out["default"] = prop["default"]
    out.update({ours: merged[theirs] for theirs, ours in _BOUNDS.items() if theirs in merged})
    return out


def _label_fields(template: str) -> set[str]:
    """The field names a label template reads (``[optional]`` parts included)."""
    text = _OPTIONAL.sub(lambda m: m.group(1), template)
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


_TABLE: dict[str, ModelKind] = {}
#: The table, read-only and live: name -> :class:`ModelKind`, in registration order.
MODEL_KIND_TABLE: Mapping[str, ModelKind] = MappingProxyType(_TABLE)


def register_model_kind(kind: ModelKind) -> ModelKind:
    """Add ``kind`` to the table; returns it.

    Raises:
        ValueError: the name is taken or not ``[a-z0-9_]+``; the spec class's ``kind`` field
            is not ``Literal[name] = name``; the class has no ``depth``; ``builder`` is not
            ``module:function``; neither ``count_parameters`` nor ``uncounted`` is given; a
            second default kind; the label has a format spec or names a field the class lacks,
            or the example does.
    """
    name, spec = kind.name, kind.spec
    if name in _TABLE:
        raise ValueError(f"model kind {name!r} is already registered")
    if not _NAME.match(name):
        raise ValueError(f"model kind name {name!r} must be lower-case letters, digits and underscores")
    discriminator = spec.model_fields.get("kind")
    if discriminator is None or get_args(discriminator.annotation) != (name,) or discriminator.default != name:
        raise ValueError(f"{spec.__name__} needs the field kind: Literal[{name!r}] = {name!r}")
    known = set(spec.model_fields) | set(kind.extra_fields)
    if "depth" not in known and not isinstance(getattr(spec, "depth", None), property):
        raise ValueError(f"{spec.__name__} needs a depth (a field or a property: the number of blocks)")
    if not _TARGET.match(kind.builder):
        raise ValueError(f"builder {kind.builder!r} must be 'package.module:function'")
    if kind.count_parameters is None and not kind.uncounted:
        raise ValueError(f"model kind {name!r}: give count_parameters, or say in uncounted why the API cannot count")
    if kind.default and any(k.default for k in _TABLE.values()):
        raise ValueError(f"model kind {name!r}: {default_model_kind()!r} is already the default kind")
    plain = all(not spec and not conv for _, _, spec, conv in string.Formatter().parse(kind.label))
    if not plain or "{{" in kind.label:
        raise ValueError(f"model kind {name!r}: the label takes plain {{field}} placeholders (the form fills it too)")
    unknown = sorted((_label_fields(kind.label) - known) | (set(kind.example) - known))
    if unknown:
        raise ValueError(f"model kind {name!r}: the label or example names fields {spec.__name__} lacks: {unknown}")
    _TABLE[name] = kind
    return kind


@contextmanager
def registered(kind: ModelKind) -> Iterator[ModelKind]:
    """Register ``kind`` for the ``with`` block only (tests, notebooks)."""
    register_model_kind(kind)
    try:
        yield kind
    finally:
        _TABLE.pop(kind.name, None)


def get_model_kind(name: str) -> ModelKind:
    """The table's entry for ``name``.

    Raises:
        ValueError: no such kind (the message lists the known ones).
    """
    try:
        return _TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model kind {name!r}; expected one of {', '.join(model_kind_names())}") from None


def model_kind_names() -> list[str]:
    """Every registered kind's name, by rank."""
    return [k.name for k in sorted(_TABLE.values(), key=lambda k: k.rank)]


def default_model_kind() -> str:
    """The kind of a ``model`` that gives none (the entry registered with ``default=True``).

    Raises:
        LookupError: no default kind is registered.
    """
    for k in _TABLE.values():
        if k.default:
            return k.name
    raise LookupError("no default model kind is registered")


def default_model() -> BaseModel:
    """A model of the default kind with every field at its default (``ExperimentSpec.model``'s
    default)."""
    return _TABLE[default_model_kind()].spec()


def _validate_model(value: Any) -> BaseModel:
    """``value`` as the spec class of its ``kind`` (the default kind when it gives none).
    Errors are located below ``model`` (``model.kind``, ``model.width``)."""
    if isinstance(value, BaseModel):
        entry = _TABLE.get(getattr(value, "kind", None))  # type: ignore[arg-type]
        if entry is not None and isinstance(value, entry.spec):
            return value
        value = value.model_dump()
    if not isinstance(value, Mapping):
        raise _field_error((), value, f"model must be an object with a kind, one of {', '.join(model_kind_names())}")
    kind = value.get("kind", default_model_kind())
    entry = _TABLE.get(kind) if isinstance(kind, str) else None
    if entry is None:
        raise _field_error(
            ("kind",), kind, f"unknown model kind {kind!r}; expected one of {', '.join(model_kind_names())}"
        )
    if "kind" not in value:
        value = {**value, "kind": kind}
    return entry.spec.model_validate(value)


class _ByKind:
    """``ExperimentSpec.model``'s validation and JSON schema, read from the table when used:
    validation dispatches on ``kind``; the schema is a ``oneOf`` of every registered kind's
    class with a ``kind`` discriminator, built each time a schema is generated."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # No serialization schema: a model is serialized as what it is (its own class's).
        return core_schema.no_info_plain_validator_function(_validate_model)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        # generate_inner (not handler(...)) puts each class in $defs and answers a $ref to it.
        generator = handler.generate_json_schema  # type: ignore[attr-defined]
        refs = {n: generator.generate_inner(_TABLE[n].spec.__pydantic_core_schema__) for n in model_kind_names()}
        mapping = {name: ref["$ref"] for name, ref in refs.items() if "$ref" in ref}
        return {"oneOf": list(refs.values()), "discriminator": {"propertyName": "kind", "mapping": mapping}}


def model_spec_type() -> Any:
    """The type of ``ExperimentSpec.model``: a model of any registered kind (see :class:`_ByKind`).

    Returns:
        ``Annotated[Union[<the classes registered now>], ...]``: the union is what static
        introspection sees (the kinds registered when it is called: the built-ins);
        validation and the JSON schema read the table live.
    """
    classes = tuple(k.spec for k in sorted(_TABLE.values(), key=lambda k: k.rank))
    return Annotated[Union[classes] if classes else BaseModel, _ByKind()]  # noqa: UP007


def _known_kind(name: str) -> str:
    get_model_kind(name)  # ValueError naming the known ones
    return name


def _kind_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = model_kind_names()  # read at schema time: a kind registered later is in it


#: A model kind's name, checked against the table as it is when validated (a query
#: parameter such as ``GET /api/experiments?model_kind=``); its JSON schema lists the kinds.
ModelKindName = Annotated[str, AfterValidator(_known_kind), Field(json_schema_extra=_kind_enum)]
