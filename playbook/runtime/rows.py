"""Rows as a play sees them, and how a play's return value becomes output columns."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd

from ..errors import PlaybookError

__all__ = ["Row", "output_columns"]

_STATUS_COLUMNS = ("play_status", "play_error")


class Row(Mapping[Any, Any]):
    """One input row: ``row.website`` or ``row["website"]``; read-only.

    Rows share one column map, so a million of them cost one tuple each.
    """

    __slots__ = ("_cols", "_vals", "index")

    def __init__(self, cols: dict[Any, int], vals: tuple[Any, ...], index: Any) -> None:
        self._cols = cols
        self._vals = vals
        self.index = index

    def __getitem__(self, column: Any) -> Any:
        try:
            return self._vals[self._cols[column]]
        except KeyError:
            raise KeyError(f"the row has no column {column!r}; columns: {list(self._cols)}") from None

    def __getattr__(self, column: str) -> Any:
        try:
            return self._vals[self._cols[column]]
        except KeyError:
            raise AttributeError(f"the row has no column {column!r}; columns: {list(self._cols)}") from None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cols)

    def __len__(self) -> int:
        return len(self._cols)

    def to_dict(self) -> dict[Any, Any]:
        return {c: self._vals[i] for c, i in self._cols.items()}

    def __repr__(self) -> str:
        return f"Row({self.index!r}, {self.to_dict()!r})"


class OutputError(PlaybookError, TypeError):
    """The play returned something that cannot become output columns (the row fails)."""


def output_columns(value: Any, play: str) -> dict[str, Any]:
    """A play's return value as ``{column: value}``.

    A dict (or a Series, which ``DataFrame.apply`` expands the same way) gives its keys as
    columns; ``None`` gives no columns; any other value becomes one column named after the play.
    A key that is not a string, or that names a status column, fails the row: a row memo is JSON,
    whose keys are strings, and the status columns are playbook's.
    """
    if value is None:
        return {}
    if type(value) is dict:
        for k in value:
            if not isinstance(k, str):
                raise OutputError(f"play {play!r} returned a dict with a non-string key {k!r}; column names must be strings")
        for k in _STATUS_COLUMNS:
            if k in value:
                raise OutputError(f"play {play!r} returned a column named {k!r}, which playbook uses for the row's status; rename it")
        return value
    if isinstance(value, Mapping):
        return output_columns(dict(value), play)
    if isinstance(value, pd.Series):
        return output_columns(value.to_dict(), play)
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited, and never will be: no "never awaited" warning later
        raise OutputError(f"play {play!r} returned a {type(value).__name__} that was never awaited: did you forget an await?")
    return {play: value}
