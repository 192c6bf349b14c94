"""Polars frames to pandas and back, for ``pl.DataFrame.play`` (see :mod:`playbook.frontends.polars`):
a play sees the Python values Polars gives, and a result column is typed only when Polars gives
back every value the run returned."""

from __future__ import annotations

import importlib
import numbers
import operator
from typing import TYPE_CHECKING, Any

import pandas as pd

from playbook.records import STATUS_COLUMNS

if TYPE_CHECKING:
    import polars as pl

__all__ = ["frames", "polars_column", "to_pandas", "to_polars", "whole_frame"]


def frames(frame: pl.DataFrame, limit: Any) -> tuple[pl.DataFrame, pd.DataFrame]:
    """The Polars rows that will run and the pandas frame they run as.  A valid ``limit`` cuts
    first, so a million-row frame is not converted for ten rows; a bad one is left for the
    options check to name."""
    if isinstance(limit, numbers.Integral) and not isinstance(limit, bool) and int(limit) >= 0:
        frame = frame.head(int(limit))
    return frame, to_pandas(frame)


def to_pandas(frame: pl.DataFrame) -> pd.DataFrame:
    """The frame as object columns of the Python values a play sees, on a fresh RangeIndex."""
    columns = {
        name: pd.Series(_python_values(frame.get_column(name)), dtype=object) for name in frame.columns
    }
    return pd.DataFrame(columns, index=pd.RangeIndex(frame.height))


def _python_values(column: pl.Series) -> list[Any]:
    import polars as pl

    dtype = column.dtype
    if isinstance(dtype, (pl.Datetime, pl.Duration)) and dtype.time_unit == "ns":
        # Python's datetime stops at microseconds and to_list() would cut the rest: pandas'
        # Timestamp keeps them (it is a datetime), as it does for the same pandas column.
        return [None if value is pd.NaT else value for value in column.to_pandas().tolist()]
    return column.to_list()


def to_polars(result: pd.DataFrame, rows: pl.DataFrame, sent: pd.DataFrame) -> pl.DataFrame:
    """The pandas result of running ``sent`` (made from ``rows``) as a Polars frame, same columns."""
    import polars as pl

    inputs = set(rows.columns)
    columns = []
    for name in result.columns:
        values = result[name]
        if name in STATUS_COLUMNS:
            columns.append(pl.Series(name, [_missing_as_none(v) for v in values], dtype=pl.String))
        elif name in inputs and _untouched(values, sent[name]):
            columns.append(rows.get_column(name))
        else:
            columns.append(polars_column(name, values))
    return pl.DataFrame(columns)


def _untouched(after: pd.Series[Any], before: pd.Series[Any]) -> bool:
    """The play replaced no value of this input column (the result holds the very objects sent)."""
    return after.dtype == object and all(map(operator.is_, after, before))


def polars_column(name: str, values: pd.Series[Any]) -> pl.Series:
    """A pandas column as a Polars one: typed when that keeps every value, else an Object column."""
    import polars as pl

    if values.dtype != object:
        try:
            return pl.from_pandas(values).rename(name)  # numbers, datetimes, strings, pandas' nullable types
        except Exception:  # whatever Polars or pyarrow refuse, the values still go over as objects
            pass
    plain = [_missing_as_none(v) for v in values]
    # pyarrow first: it builds structs from dicts ten times faster than Polars does from Python.
    # Either may pick a type that changes values (a set as a list, a UUID as bytes, a struct
    # with keys some rows lacked), so a type is kept only if it gives back every value.
    for build in (_via_arrow, pl.Series):
        try:
            typed = build(name, plain, strict=True)
            if typed.dtype != pl.Object and typed.to_list() == plain:
                return typed
        except Exception:  # mixed types, keys that are not str, ints past 64 bits: try the next, else objects
            pass
    return pl.Series(name, plain, dtype=pl.Object)


def _via_arrow(name: str, values: list[Any], *, strict: bool) -> pl.Series:
    import polars as pl

    # Polars' extra brings it; if it is missing, Polars' own way follows
    pa = importlib.import_module("pyarrow")
    return pl.Series(name, pa.array(values), strict=strict)


def _missing_as_none(value: Any) -> Any:
    """pandas' missing markers (NaN, NaT, NA) as Polars' one: a null."""
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, float) and value != value:
        return None
    return value


def whole_frame(frame: pd.DataFrame) -> pl.DataFrame:
    import polars as pl

    return pl.DataFrame([polars_column(str(name), frame[name]) for name in frame.columns])
