"""A play's declared output (``@pb.play(output=Model)``): its columns, their dtypes, and the
validation each row's output goes through.

``Model`` is a pydantic model or a TypedDict.  A row's return value (a dict, a Series, or an
instance of the model) is validated with one cached ``TypeAdapter``; the row's output is the
validated dump in python mode (a datetime stays a datetime), which holds the model's fields only,
in the model's order: keys the model does not declare are dropped, as pydantic drops them
(a model with ``extra="allow"`` keeps them, as untyped columns after the model's; one with
``extra="forbid"`` fails the row).  A field error fails the row, naming the field.

The columns exist in the result even when no row succeeded, each with the dtype its annotation
calls for, so code downstream sees the same frame whatever happened to the rows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import types
import typing
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import pandas as pd
import typing_extensions as te
from pydantic import (
    AwareDatetime,
    BaseModel,
    FutureDatetime,
    NaiveDatetime,
    PastDatetime,
    RootModel,
    TypeAdapter,
    ValidationError,
)
from pydantic.errors import PydanticUserError
from pydantic.json_schema import PydanticJsonSchemaWarning

from playbook.addresses import code_fingerprint, digest
from playbook.errors import PlaybookError, PlayDefinitionError
from playbook.records import STATUS_COLUMNS

__all__ = ["OutputError", "OutputModel"]


_SHOWN = 3  # field errors named in a row's message; the rest are counted

# Dtypes a column of each kind gets.  Every one holds a missing value, since failed, parked and
# skipped rows have none: ints are the nullable "Int64" (not float64, which would round ids past
# 2**53), bools the nullable "boolean".  Strings, datetimes and timedeltas get the dtype pandas
# itself gives a column of such Python values (on pandas 3: "str", whose missing value is NaN and
# whose ``==`` gives plain bools, and microsecond datetimes, which reach past the year 2262), so a
# declared column has the dtype the same values would have had without a model.
_OBJECT = "object"
_DATETIME = "datetime"  # datetime64 (with the values' time zone when they share one)
_AWARE = "aware"  # the same, but with no values its time zone is unknown: object
_STR = pd.Series(["a"]).dtype
_DT_UNIT: Any = pd.Series([dt.datetime(2000, 1, 1)]).dt.unit
_BY_TYPE: tuple[tuple[type, Any], ...] = (
    (bool, "boolean"),  # before int: bool is an int
    (int, "Int64"),
    (float, "float64"),
    (str, _STR),
    (dt.datetime, _DATETIME),  # before date (a date column stays object: pandas has no date dtype)
    (dt.timedelta, pd.Series([dt.timedelta(1)]).dtype),
)
_DATETIMES = {
    AwareDatetime: _AWARE,
    NaiveDatetime: _DATETIME,
    PastDatetime: _DATETIME,
    FutureDatetime: _DATETIME,
}
_WRAPPERS = {typing.Annotated, te.Required, te.NotRequired, te.ReadOnly}
_UNIONS = {typing.Union, types.UnionType}


class OutputError(PlaybookError, TypeError):
    """The play returned something that cannot become output columns (the row fails)."""


class OutputModel:
    """A play's output model: its fields in order with their column dtypes, and a cached validator."""

    __slots__ = ("model", "play", "fields", "fingerprint", "_adapter", "_open")

    def __init__(self, model: Any, play: str) -> None:
        self._adapter = adapter(model, f"play {play!r}")
        self.model = model
        self.play = play
        self.fields: tuple[tuple[str, Any], ...] = tuple(
            (name, _kind(tp)) for name, tp in _annotations(model)
        )
        for name, _ in self.fields:
            if name in STATUS_COLUMNS:
                raise PlayDefinitionError(
                    f"play {play!r}: output={model.__name__} has a field {name!r}, a column playbook uses for the row's status"
                )
        config = (
            model.model_config
            if isinstance(model, type) and issubclass(model, BaseModel)
            else getattr(model, "__pydantic_config__", {})
        )
        self._open = config.get("extra") == "allow"
        self.fingerprint = digest(_schema_text(self._adapter, model))

    def __repr__(self) -> str:
        return f"<OutputModel {self.model.__name__} of play {self.play!r}: {', '.join(n for n, _ in self.fields)}>"

    def validate(self, value: Any) -> dict[str, Any]:
        """The row's output: ``value`` (a dict, a Series or a model instance) validated and dumped."""
        if isinstance(value, pd.Series):
            value = value.to_dict()
        elif isinstance(value, Mapping) and type(value) is not dict:
            value = dict(value)
        adapter = self._adapter
        try:
            valid = adapter.validate_python(value)
        except ValidationError as exc:
            raise OutputError(f"play {self.play!r}: {explain(exc)}") from None
        # Dumped through the adapter, not the instance: a subclass instance gives the model's fields only.
        output: dict[str, Any] = adapter.dump_python(valid)
        return output

    def frame(self, outputs: list[dict[str, Any]], index: pd.Index) -> pd.DataFrame:
        """The output columns of every row (``{}`` for a row with no output), typed, in the model's order."""
        columns = {name: _column(kind, [o.get(name) for o in outputs], index) for name, kind in self.fields}
        if self._open:
            names = set(columns)
            extra = list(dict.fromkeys(k for o in outputs for k in o if k not in names))
            if extra:
                records: Any = [{k: o[k] for k in extra if k in o} for o in outputs]
                rest = pd.DataFrame.from_records(records, index=index, columns=extra)
                columns.update({k: rest[k] for k in extra})
        return pd.DataFrame(columns, index=index)


def is_model(model: Any) -> bool:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return not issubclass(model, RootModel)  # a RootModel's value is not a set of named columns
    return te.is_typeddict(model)


def _what(value: Any) -> str:
    if isinstance(value, BaseModel):
        return f"an instance of {type(value).__name__} (pass the class itself)"
    text = repr(value)
    return f"{text[:60]}…" if len(text) > 60 else text


def _annotations(model: Any) -> list[tuple[str, Any]]:
    """The model's output fields in the order its dump gives them, with their annotations."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        fields = [(name, f.annotation) for name, f in model.model_fields.items() if not f.exclude]
        return fields + [(name, c.return_type) for name, c in model.model_computed_fields.items()]
    try:
        return list(te.get_type_hints(model, include_extras=True).items())
    except (NameError, TypeError):  # a name pydantic found in the defining scope: the columns stay untyped
        return [(name, Any) for name in getattr(model, "__annotations__", {})]


def _kind(tp: Any) -> Any:
    """The column dtype for a field annotated ``tp``; ``Optional[X]`` is ``X`` (a missing value is None)."""
    origin = te.get_origin(tp)
    if origin in _WRAPPERS:
        return _kind(te.get_args(tp)[0])
    if origin in _UNIONS or origin is Literal:
        args = te.get_args(tp)
        # Literal["a", "b"] is a str column (not a category: a new value would not fit it).
        inner = [type(a) for a in args] if origin is Literal else list(args)
        kinds = {_kind(a) for a in inner if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else _OBJECT
    if not isinstance(tp, type) or issubclass(tp, enum.Enum):  # an IntEnum's members stay members
        return _OBJECT
    if tp in _DATETIMES:
        return _DATETIMES[tp]
    return next((kind for base, kind in _BY_TYPE if issubclass(tp, base)), _OBJECT)


def _column(kind: Any, values: list[Any], index: pd.Index) -> pd.Series:
    try:
        # A str test first: a dtype compared with a str may warn.  Equality, not identity: a play
        # unpickled in another process (a Dask worker) holds other copies of these strings.
        if isinstance(kind, str) and kind in (_DATETIME, _AWARE):
            return _datetimes(values, index, aware=kind == _AWARE)
        column: pd.Series = pd.Series(values, index=index, dtype=kind)
        return column
    except (
        TypeError,
        ValueError,
        OverflowError,
    ):  # a value the dtype cannot hold (an int past 64 bits): as it is
        return pd.Series(values, index=index, dtype=object)


def _datetimes(values: list[Any], index: pd.Index, *, aware: bool) -> pd.Series:
    """A datetime64 column; with the values' time zone when they all share one, else object."""
    zones = {_zone_name(v.tzinfo) for v in values if v is not None}
    if not zones:
        return pd.Series(values, index=index, dtype=object if aware else f"datetime64[{_DT_UNIT}]")
    if zones == {None}:
        return pd.Series(values, index=index, dtype=f"datetime64[{_DT_UNIT}]")
    zone = zones.pop()
    if zones or zone is None:  # naive and aware, or several zones: no one dtype holds them
        return pd.Series(values, index=index, dtype=object)
    stamps = pd.to_datetime(values, utc=True).tz_convert(zone).as_unit(_DT_UNIT)
    return pd.Series(stamps, index=index)


def _zone_name(tz: Any) -> Any:
    """One name per time zone: a pytz zone has a tzinfo per UTC offset, a zoneinfo one per zone."""
    if tz is None:
        return None
    return getattr(tz, "key", None) or getattr(tz, "zone", None) or tz


def adapter(model: Any, owner: str) -> TypeAdapter[Any]:
    """The validator of an output model (a play's or an LLM tool's ``output=``), or a
    PlayDefinitionError naming ``owner`` ("play 'enrich'", "llm_tool 'llm'")."""
    if not is_model(model):
        raise PlayDefinitionError(
            f"{owner}: output= takes a pydantic model class or a TypedDict class, not {_what(model)}"
        )
    try:
        return TypeAdapter(model)
    except PydanticUserError as exc:  # e.g. typing.TypedDict on Python < 3.12, an undefined name
        raise PlayDefinitionError(
            f"{owner}: output={model.__name__} cannot validate outputs: {exc}"
        ) from None


def explain(exc: ValidationError, what: str = "output") -> str:
    """``output field 'employees': Input should be a valid integer (got 'many')``, per error."""
    parts = []
    for error in exc.errors(include_url=False)[:_SHOWN]:
        where = ".".join(str(p) for p in error["loc"])
        got = "" if error["type"] == "missing" else f" (got {_short(error['input'])})"
        parts.append(f"{f'{what} field {where!r}' if where else what}: {error['msg']}{got}")
    more = exc.error_count() - _SHOWN
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}…" if len(text) > 60 else text


def _schema_text(adapter: TypeAdapter[Any], model: Any) -> str:
    """What the play's fingerprint takes from its output model: the JSON schema (fields, types,
    defaults, constraints) and the code of the model's validators and serializers, which change
    values without changing the schema."""
    try:
        with warnings.catch_warnings():
            # a default with no JSON form is left out
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            schema = json.dumps(adapter.json_schema(), default=repr)
    except PydanticUserError:
        # a type with no JSON schema (an arbitrary class): the fields' annotations stand in
        schema = repr(_annotations(model))
    decorators = getattr(model, "__pydantic_decorators__", None)
    code = []
    if decorators is not None:
        for group in dataclasses.fields(decorators):
            code += [
                f"{name}={code_fingerprint(d.func)}" for name, d in getattr(decorators, group.name).items()
            ]
    return "\x1f".join([schema, *code])
