"""Rows that do not read back: a stored value that cannot be decoded (invalid JSON, a date
that is not one, text in an integer column) or does not have the shape and content its
readers expect (a spec that no longer validates, a summary key of the wrong type).

One such row must not take a listing down. The column types here hand an undecodable value
back as :class:`Unreadable` instead of raising inside the driver's row processing; the ORM
load hook that :func:`watch` installs then checks every column of a loaded row, puts a
stand-in in place of each unreadable value (None, or the empty value of the column's type:
``0``, ``{}``, ``[]``) and keeps what failed on the row, where its ``corrupt`` property
(:class:`Watched`) reads it. A warning (logger ``ckptlab.db.corrupt``) names the table, the
row id and what failed, once per load. The stand-ins are never written back: they are set
as the loaded state, so the row is not dirty. ``ckptlab db check`` lists such rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import JSON, event, select
from sqlalchemy.orm import Mapper, Session, attributes
from sqlalchemy.types import TypeDecorator

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import RunSummary

__all__ = [
    "Unreadable",
    "TolerantRead",
    "TolerantJSON",
    "Corruption",
    "Watched",
    "ContentCheck",
    "watch",
    "corrupt_rows",
    "spec_problem",
    "summary_problem",
    "strings_problem",
    "objects_problem",
    "REASON_LIMIT",
]

log = logging.getLogger(__name__)

#: Longest reason kept per field, characters (a decoder's message can quote the value).
REASON_LIMIT = 300


@dataclass(frozen=True)
class Unreadable:
    """A stored value its column type could not decode (what the tolerant types return in
    place of raising).

    Attributes:
        reason: why, in words (``not valid JSON: Expecting value: line 1 column 1``).
    """

    reason: str


class TolerantRead:
    """Mixin for a :class:`~sqlalchemy.types.TypeDecorator`: a value the inner type's result
    processing raises ``ValueError`` or ``TypeError`` on reads as :class:`Unreadable`
    (``what`` says what the value is not), so the rest of the row still loads."""

    what = "readable"

    @property
    def python_type(self) -> type:
        return self.impl_instance.python_type  # type: ignore[attr-defined]

    def result_processor(self, dialect: Any, coltype: Any) -> Callable[[Any], Any] | None:
        process = super().result_processor(dialect, coltype)  # type: ignore[misc]
        if process is None:
            return None
        what = self.what

        def read(value: Any) -> Any:
            try:
                return process(value)
            except (ValueError, TypeError) as exc:
                return Unreadable(f"not {what}: {exc}"[:REASON_LIMIT])

        return read


class TolerantJSON(TolerantRead, TypeDecorator):
    """A JSON column (``JSON`` on both databases, as before) whose invalid text reads as
    :class:`Unreadable`. ``shape`` is the Python type its value has (``dict``, ``list``),
    which the load hook checks. SQLite stores any text in it; PostgreSQL refuses invalid
    JSON, so there only a value of the wrong shape or content is seen."""

    impl = JSON
    cache_ok = True
    what = "valid JSON"
    #: Python's None is stored as JSON ``null``, as a plain JSON column does.
    should_evaluate_none = True
    hashable = False

    def __init__(self, shape: type = dict):
        super().__init__()
        self.shape = shape

    @property
    def python_type(self) -> type:
        return self.shape


@dataclass(frozen=True)
class Corruption:
    """What failed to read of one stored row.

    Attributes:
        problems: ``(field, reason)`` pairs, in column order.
    """

    problems: tuple[tuple[str, str], ...]

    @property
    def fields(self) -> list[str]:
        """The fields that failed, in column order."""
        return [f for f, _ in self.problems]

    @property
    def reason(self) -> str:
        """Every failure in words: ``summary: not valid JSON: ...; attempt: ...``."""
        return "; ".join(f"{f}: {why}" for f, why in self.problems)


class Watched:
    """Mixin of a mapped class whose loaded rows are checked (:func:`watch`)."""

    @property
    def corrupt(self) -> Corruption | None:
        """What failed to read of this row when it was loaded, or None when it read whole (or
        was made in this process, never loaded)."""
        return self.__dict__.get("_corruption")


#: A check of a field's content: the value (already of the column's shape) -> why it is
#: not what readers expect, or None when it is.
ContentCheck = Callable[[Any], str | None]


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def spec_problem(value: Any) -> str | None:
    """Why a stored spec does not validate as an :class:`ExperimentSpec` (its first error), or
    None when it does."""
    try:
        ExperimentSpec.model_validate(value)
    except ValidationError as exc:
        return f"not a valid experiment spec: {_first_error(exc)}"
    return None


def summary_problem(value: Any) -> str | None:
    """Why a stored summary does not validate as a :class:`RunSummary` (its first error; the
    API serves the keys that do), or None when it does or is None."""
    if value is None:
        return None
    try:
        RunSummary.model_validate(value)
    except ValidationError as exc:
        return f"not a valid run summary: {_first_error(exc)}"
    return None


def _items_problem(value: Any, kind: type, words: str) -> str | None:
    bad = [i for i, item in enumerate(value or []) if not isinstance(item, kind)]
    return f"item {bad[0]} is not {words}" if bad else None


def strings_problem(value: Any) -> str | None:
    """Why a stored list is not a list of strings (the first item that is not), or None."""
    return _items_problem(value, str, "a string")


def objects_problem(value: Any) -> str | None:
    """Why a stored list is not a list of JSON objects (the first item that is not), or None."""
    return _items_problem(value, dict, "an object")


#: A column's Python type in words, for the reasons.
_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    str: "text",
    bool: "a boolean",
    dict: "a JSON object",
    list: "a JSON array",
    datetime: "a date and time",
}


def _type_problem(value: Any, column: Any) -> str | None:
    """Why ``value`` is not of ``column``'s type (None when it is, or is a NULL the column
    allows)."""
    if isinstance(value, Unreadable):
        return value.reason
    if value is None:
        return None if column.nullable else "missing (NULL)"
    expected = column.type.python_type
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    if expected is object or isinstance(value, expected):
        return None
    return f"not {_TYPE_WORDS.get(expected, expected.__name__)}: {value!r:.{REASON_LIMIT}}"


def _stand_in(column: Any) -> Any:
    """What a row reads in place of an unreadable value of ``column``: None where the column
    allows it or for a time (none can be made up), else the empty value of its type."""
    expected = column.type.python_type
    if column.nullable or expected is datetime:
        return None
    return expected()


def _problems(target: Any, columns: Mapping[str, Any], content: Mapping[str, tuple[ContentCheck, bool]]) -> list:
    """What fails of the loaded ``columns`` (attribute -> column) of ``target``, as
    ``(field, reason)`` pairs; each value that fails its type (or a replacing content check)
    is replaced by its stand-in on the way."""
    state = target.__dict__
    problems = []
    for key, column in columns.items():
        if key not in state:  # deferred or not loaded
            continue
        why = _type_problem(state[key], column)
        replace = why is not None
        if why is None and key in content:
            check, replace = content[key]
            why = check(state[key])
        if why is not None:
            problems.append((key, why[:REASON_LIMIT]))
            if replace:
                attributes.set_committed_value(target, key, _stand_in(column))
    return problems


def _check_row(
    target: Any,
    columns: Mapping[str, Any],
    content: Mapping[str, tuple[ContentCheck, bool]],
    refreshed: Any = None,
) -> None:
    """Check a loaded row (or only its ``refreshed`` attributes, keeping what failed of the
    others), put stand-ins in, and keep and log what failed (see the module's docstring)."""
    kept: tuple = ()
    if refreshed is not None:
        earlier = target.__dict__.get("_corruption")
        kept = tuple(p for p in earlier.problems if p[0] not in refreshed) if earlier else ()
        columns = {k: c for k, c in columns.items() if k in refreshed}
    problems = (*kept, *_problems(target, columns, content))
    target.__dict__["_corruption"] = corruption = Corruption(problems) if problems else None
    if corruption is not None and len(problems) > len(kept):
        log.warning("%s row %s is corrupt: %s", target.__table__.name, target.__dict__.get("id"), corruption.reason)


def watch(cls: type, *, content: Mapping[str, tuple[ContentCheck, bool]] | None = None) -> None:
    """Check every row of the mapped class ``cls`` as it is loaded or refreshed.

    Every column's value must be of its type (a tolerant column's :class:`Unreadable`, text
    in an integer column, an array where an object is stored: each replaced by a stand-in);
    ``content`` adds checks by attribute name: ``(check, replace)``, where ``replace`` says
    whether a value failing the check is replaced by the stand-in too (else it is served as
    stored and only reported). ``cls`` should mix in :class:`Watched` to read the result.

    Raises:
        sqlalchemy.exc.InvalidRequestError: ``cls`` is not mapped.
    """
    checks = dict(content or {})
    columns: dict[str, Any] = {}

    def mapped_columns() -> dict[str, Any]:  # read at the first load: the mappers are configured by then
        if not columns:
            mapper: Mapper = cls.__mapper__  # type: ignore[attr-defined]
            columns.update({prop.key: prop.columns[0] for prop in mapper.column_attrs})
        return columns

    def on_load(target: Any, _context: Any) -> None:
        _check_row(target, mapped_columns(), checks)

    def on_refresh(target: Any, _context: Any, attrs: Any) -> None:
        _check_row(target, mapped_columns(), checks, attrs)

    event.listen(cls, "load", on_load)
    event.listen(cls, "refresh", on_refresh)


def corrupt_rows(session: Session, *classes: type, batch: int = 500) -> Iterator[tuple[str, int, Corruption | None]]:
    """Every stored row of the watched mapped ``classes``, in id order, as ``(table, id,
    corruption)`` (None: it reads back whole), read ``batch`` rows at a time and let go of
    after each batch, so memory stays bounded. The warnings of the load hook are not logged
    meanwhile: the caller reports the rows.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be read.
    """
    quiet = log.disabled
    log.disabled = True
    try:
        for cls in classes:
            table = cls.__table__.name  # type: ignore[attr-defined]
            rows = session.scalars(select(cls).order_by(cls.id).execution_options(yield_per=batch))  # type: ignore[attr-defined]
            for part in rows.partitions():
                yield from ((table, row.id, row.corrupt) for row in part)
                session.expunge_all()
    finally:
        log.disabled = quiet
