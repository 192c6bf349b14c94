"""The shape of a cluster job's result: one set of columns and dtypes for every partition, and a
retried partition put back together.

Each partition's run builds its result as a pandas run does, from its own rows, so partitions can
disagree: a partition whose rows all failed has no output columns, one whose values were all
None has a float column where another has text.  A Dask DataFrame has one schema, so before the
result is handed over each partition is profiled, the profiles unified (a column missing or
empty somewhere takes a type that can hold a missing value; ints and floats meet as floats;
anything else meets as objects), and each partition conformed to them.  An object column of text
only (every value a str or missing, in every partition) is Dask's string dtype when Dask's own
``dataframe.convert-string`` is on, so the result writes to Parquet as Dask's own frames do;
a column holding anything else (dicts, lists, your objects) keeps the values as returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Profile", "conform", "profile", "reassembled", "statuses", "unify"]

# per column: its label, its dtype, and for objects "text", "none" or "other"
Profile = list[tuple[Any, Any, str]]
STATUS = ("play_status", "play_error")


def profile(frame: pd.DataFrame) -> Profile:
    """What each column of a partition's result holds (run on the worker that holds it)."""
    out: Profile = []
    for label in frame.columns:
        column = frame[label]
        kind = ""
        if column.dtype == object:
            values = column.dropna()
            kind = "none" if values.empty else "text" if all(isinstance(v, str) for v in values) else "other"
        out.append((label, column.dtype, kind))
    return out


def statuses(frame: pd.DataFrame) -> dict[str, int]:
    """How many of a partition's rows end with each ``play_status`` (run on the worker that holds it)."""
    return {str(status): int(n) for status, n in frame["play_status"].value_counts().items()}


def unify(profiles: Sequence[Profile], inputs: Sequence[Any], *, text: bool) -> tuple[list[Any], list[Any]]:
    """The columns of the whole result, in a pandas result's order (inputs, outputs as first
    seen, then the statuses), and the dtype each takes.  ``text``: text columns become strings."""
    seen: dict[Any, list[tuple[Any, str]]] = {}
    for found in profiles:
        for label, dtype, kind in found:
            seen.setdefault(label, []).append((dtype, kind))
    outputs = [label for label in seen if label not in inputs and label not in STATUS]
    columns = [*(c for c in inputs if c in seen), *outputs, *(c for c in STATUS if c in seen)]
    return columns, [_dtype(seen[c], len(profiles), text=text and c not in inputs) for c in columns]


def _dtype(found: list[tuple[Any, str]], partitions: int, *, text: bool) -> Any:
    kinds = {kind for _, kind in found if kind}
    gaps = len(found) < partitions or "none" in kinds  # somewhere the column holds no value at all
    # an object column of Nones says nothing of the type
    typed = [dtype for dtype, kind in found if kind != "none"]
    if typed and all(dtype == typed[0] for dtype in typed):
        first = typed[0]
        if first.kind in "iu" and gaps:
            return np.dtype("float64")  # as pandas gives an int column with a row missing
        if first.kind == "b" and gaps:
            return np.dtype(object)
        if not _objects(first):
            return first
    elif typed and all(dtype.kind in "iuf" for dtype in typed):
        return np.dtype("float64")
    if text and kinds <= {"text", "none"} and all(_objects(dtype) for dtype in typed):
        return pd.StringDtype("pyarrow")
    return np.dtype(object)


def _objects(dtype: Any) -> bool:
    """A plain object column (not pandas' string dtype, whose kind is "O" too)."""
    return isinstance(dtype, np.dtype) and dtype.kind == "O"


def conform(frame: pd.DataFrame, columns: Sequence[Any], dtypes: Sequence[Any]) -> pd.DataFrame:
    """A partition's result with exactly ``columns``, of ``dtypes`` (run on the worker that holds it)."""
    out: dict[Any, pd.Series[Any]] = {}
    for label, dtype in zip(columns, dtypes):
        column = (
            frame[label]
            if label in frame.columns
            else pd.Series([None] * len(frame), index=frame.index, dtype=object)
        )
        if str(column.dtype) != str(dtype):
            column = column.astype(dtype)
        out[label] = column
    return pd.DataFrame(out, index=frame.index, columns=list(columns))


def reassembled(
    previous: pd.DataFrame,
    again: pd.DataFrame,
    ran: Sequence[int],
    retried: Sequence[int],
    inputs: Sequence[Any],
) -> pd.DataFrame:
    """A retried partition's result: ``again`` holds the rows at positions ``ran`` run now (the
    ``retried`` ones and those that were done, which came back from their memos with the very
    values first returned); the rest (failed or parked, not retried) are as ``previous`` had them."""
    before = previous["play_status"].tolist()
    statuses = again["play_status"].tolist()
    chosen = set(retried)
    for j, position in enumerate(ran):
        if position not in chosen:
            # done before: still "ok" (or "reused"), not "reused" by this retry
            statuses[j] = before[position]
    again = again.assign(play_status=pd.Series(statuses, index=again.index, dtype=again["play_status"].dtype))
    ran_set = set(ran)
    rest = [p for p in range(len(previous)) if p not in ran_set]
    if not rest:
        return again
    kept = previous.iloc[rest][[c for c in previous.columns if c in inputs or c in STATUS]]
    return pd.concat([again, kept]).iloc[np.argsort([*ran, *rest], kind="stable")]
