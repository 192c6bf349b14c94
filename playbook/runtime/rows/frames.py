"""Rows as a play sees them, how a play's return value becomes output columns (and a failure
the row's message), and the result frame they make."""

from __future__ import annotations

import difflib
import inspect
import linecache
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pandas as pd

from playbook.plays.outputs import OutputError, OutputModel
from playbook.records import STATUS_COLUMNS
from playbook.runtime.rows.grouping import safe_str
from playbook.tagged import Unencodable, decode, encode

__all__ = [
    "ABSENT",
    "OutputError",
    "Row",
    "error_line",
    "error_message",
    "output_columns",
    "play_row",
    "result_frame",
    "row_output",
    "stored_output",
]


class Row(Mapping[Any, Any]):
    """One input row: ``row.website`` or ``row["website"]``; read-only.  ``row.index`` (or
    ``row.Index``, as ``itertuples`` spells it) is the row's index label, unless the frame has a
    column of that name: a column wins, as ``row.website`` reads a column.

    Rows share one column map, so a million of them cost one tuple each.
    """

    __slots__ = ("_cols", "_vals", "_label")

    def __init__(self, cols: dict[Any, int], vals: tuple[Any, ...], index: Any) -> None:
        self._cols = cols
        self._vals = vals
        self._label = index

    def __getitem__(self, column: Any) -> Any:
        try:
            return self._vals[self._cols[column]]
        except KeyError:
            raise KeyError(self._missing(column)) from None

    def __getattr__(self, column: str) -> Any:
        try:
            return self._vals[self._cols[column]]
        except KeyError:
            if column == "index" or column == "Index":  # after the columns: a frame's own column "index" wins
                return self._label
            raise AttributeError(self._missing(column)) from None

    def _missing(self, column: Any) -> str:
        if column == "name":
            hint = " (the row's index label is row.index, not row.name as in DataFrame.apply)"
        else:
            near = difflib.get_close_matches(str(column), [str(c) for c in self._cols], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"the row has no column {column!r}; columns: {list(self._cols)}{hint}"

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cols)

    def __contains__(self, column: object) -> bool:
        return column in self._cols

    def __len__(self) -> int:
        return len(self._cols)

    def to_dict(self) -> dict[Any, Any]:
        return {c: self._vals[i] for c, i in self._cols.items()}

    def __repr__(self) -> str:
        return f"Row({self._label!r}, {self.to_dict()!r})"


class Book(Protocol):
    """What :func:`play_row` reads of the row's ledger (a :class:`~.ledger.RowLedger`)."""

    signal: BaseException | None

    def forgotten_await(self, value: Any) -> str: ...
    def never_awaited(self) -> str | None: ...


async def play_row(play: Any, row: Row, ctx: Any, book: Book) -> tuple[dict[str, Any], Any]:
    """The output of ``play`` (a ``Play``) for one row, with ``ctx`` its context, and the output's
    stored form (``None``: it has none).  A suspension the play caught still counts, and a ctx call
    it never awaited fails it."""
    return row_output(play, await play.fn(row, ctx), book)


def row_output(play: Any, value: Any, book: Book) -> tuple[dict[str, Any], Any]:
    """:func:`play_row`'s output of the row that returned ``value`` (a row's runner awaits the play
    itself: a coroutine less a row)."""
    name = play.name
    if book.signal is not None:
        raise book.signal
    output, stored = stored_output(
        output_columns(value, name, book.forgotten_await, play.output), name, book.forgotten_await
    )
    advice = book.never_awaited()
    if advice is not None:
        raise OutputError(f"play {name!r} made a ctx call that it never awaited, so it never ran: {advice}")
    return output, stored


def output_columns(
    value: Any, play: str, forgotten: Callable[[Any], str], model: OutputModel | None = None
) -> dict[str, Any]:
    """A play's return value as ``{column: value}``.

    With an output ``model``, the value as the model validates it (see :mod:`playbook.plays.outputs`).
    Else a dict (or a Series, which ``DataFrame.apply`` expands the same way) gives its keys as
    columns; ``None`` gives no columns; any other value becomes one column named after the play.
    A key that is not a string, or that names a status column, fails the row: a row memo is JSON,
    whose keys are strings, and the status columns are playbook's.  ``forgotten(awaitable)``
    gives the advice for a coroutine returned instead of awaited.
    """
    if model is not None:
        return _validated(value, play, forgotten, model)
    if value is None:
        return {}
    if type(value) is dict:
        for k in value:
            if not isinstance(k, str):
                raise OutputError(
                    f"play {play!r} returned a dict with a non-string key {k!r}; column names must be strings"
                )
        for k in STATUS_COLUMNS:
            if k in value:
                raise OutputError(
                    f"play {play!r} returned a column named {k!r}, which playbook uses for the row's status; rename it"
                )
        return value
    if isinstance(value, Mapping):
        return output_columns(dict(value), play, forgotten)
    if isinstance(value, pd.Series):
        return output_columns(value.to_dict(), play, forgotten)
    if inspect.isawaitable(value):
        raise OutputError(
            f"play {play!r} returned a {type(value).__name__} that was never awaited: {forgotten(value)}"
        )
    return {play: value}


def _validated(value: Any, play: str, forgotten: Callable[[Any], str], model: OutputModel) -> dict[str, Any]:
    if inspect.isawaitable(value):
        raise OutputError(
            f"play {play!r} returned a {type(value).__name__} that was never awaited: {forgotten(value)}"
        )
    try:
        return model.validate(value)
    except OutputError:
        if isinstance(value, Mapping):
            # a field that holds a coroutine was meant to be awaited: say that instead
            stored_output(dict(value), play, forgotten)
        raise


def stored_output(
    output: dict[str, Any], play: str, forgotten: Callable[[Any], str]
) -> tuple[dict[str, Any], Any]:
    """The output as a replay will give it back, and its stored form (``None``: it has none).

    A row's first run shows exactly what a rerun reuses (a Timestamp stays a Timestamp, a tuple a
    tuple, a pydantic model is its dict).  An output with no stored form (an object of the
    play's own) is kept as it is but not memoised: that row simply runs again next time, against
    its receipts.  A coroutine anywhere in it fails the row: it was meant to be awaited.
    """
    try:
        stored = encode(output)
    except Unencodable as exc:
        if exc.awaitable:
            advice = forgotten(exc.value)
            _close_awaitables(output)
            raise OutputError(
                f"play {play!r}: output{exc.where} is a {type(exc.value).__name__} that was never awaited: {advice}"
            ) from None
        return output, None
    return (output if stored is output else decode(stored)), stored


def _close_awaitables(value: Any) -> None:
    """Close every coroutine in a returned structure: none of them will ever run."""
    if inspect.iscoroutine(value):
        value.close()
    elif isinstance(value, Mapping):
        for v in value.values():
            _close_awaitables(v)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _close_awaitables(v)


ABSENT: Any = object()  # an output column a row did not return


def result_frame(
    frame: pd.DataFrame,
    outputs: dict[str, list[Any]],
    status: Any,
    errors: Any,
    model: OutputModel | None = None,
) -> pd.DataFrame:
    """Input rows in input order and index, the output columns, ``play_status``, ``play_error``.

    ``outputs`` holds each output column's value for every row, :data:`ABSENT` where the row
    returned none (a row that failed, parked or was skipped returns none).  A column no row
    returned is left out.  With an output ``model``, its columns come in its order with its
    dtypes, even if no row returned them.  With ``overwrite=True`` (else such a row fails first,
    see settle.clashing), an output named like an input column replaces it in place, as
    ``df.assign`` would, but only in the rows that returned it: a failed, parked or skipped row
    keeps its input value.
    """
    index = frame.index
    names = [c for c, values in outputs.items() if any(v is not ABSENT for v in values)]
    result = frame.copy(deep=False)  # columns are added or replaced, never changed in place
    inputs: set[Any] = set(frame.columns)
    if model is not None:
        records = [
            {c: v for c, v in zip(names, row) if v is not ABSENT} for row in zip(*(outputs[c] for c in names))
        ]
        out = model.frame(records if names else [{}] * len(index), index)
        columns: Iterator[tuple[Any, pd.Series[Any]]] = iter(out.items())
    else:  # a column at a time: a million rows hold one column's values twice at most, not every column's
        columns = ((c, _series([_NAN if v is ABSENT else v for v in outputs[c]], index)) for c in names)
    for col, series in columns:
        if col in inputs:
            given = outputs.get(col)
            values = (
                list(frame[col])
                if given is None
                else [v if o is ABSENT else o for o, v in zip(given, frame[col])]
            )
            result[col] = _series(values, index)
        else:
            result[_label(frame, col)] = series
    result[_label(frame, "play_status")] = pd.Series(status, index=index, dtype=object, copy=False)
    result[_label(frame, "play_error")] = pd.Series(errors, index=index, dtype=object, copy=False)
    return result


_NAN = float("nan")


def _series(values: list[Any], index: pd.Index) -> pd.Series[Any]:
    numbers = _numbers(values)
    if numbers is not None:
        return pd.Series(numbers, index=index, copy=False)
    try:
        return pd.Series(values, index=index)
    except (UnicodeError, ValueError, TypeError):
        return pd.Series(values, index=index, dtype=object)


def _numbers(values: list[Any]) -> np.ndarray[Any, Any] | None:
    """``values`` as the array pandas infers for them when they are Python ints and floats (NaN
    where a row returned none): int64 for ints, float64 once a float is among them.  Made here,
    without the buffers of every kind pandas' inference fills (50 MB at a million rows); ``None``
    for anything else, and for ints past int64, which pandas keeps otherwise."""
    kinds = set(map(type, values))
    if not kinds or not kinds <= {int, float}:
        return None
    try:
        if float not in kinds:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        numbers = np.fromiter(values, dtype=np.float64, count=len(values))
    except OverflowError:
        return None
    if int in kinds and (np.abs(numbers) >= 2.0**63).any():
        return None  # a float now, but an int past int64 before
    return numbers


def _label(frame: pd.DataFrame, name: str) -> Any:
    """A new column's label: ``name``, or ``(name, "", ...)`` when the columns are a MultiIndex."""
    levels = frame.columns.nlevels
    return name if levels == 1 else (name,) + ("",) * (levels - 1)


def error_line(exc: BaseException, fn: Any) -> str:
    """``(line N: source)`` when the play's own code raised the error (a tool's error names the
    tool already).  In a ``%%play`` cell N is the cell's line: the row error points at it."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if code is None or tb is None or tb.tb_frame.f_code is not code:
        return ""
    text = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return f" (line {tb.tb_lineno}: {text})" if text else f" (line {tb.tb_lineno})"


def error_message(exc: BaseException) -> str:
    text = safe_str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    notes = getattr(exc, "__notes__", None)
    return f"{message} ({'; '.join(notes)})" if notes else message
