"""The rows table: one record per row of the frame, and the frame's values as plays see them.

A row's status, output, error, why it parked, what it waits on while held, its attempts and its
wait budgets live in one :class:`RowEntry`, so settling or re-admitting a row is one call and no
list can fall out of step with another.  Rows with the same key run once: the first (the *lead*)
lists its copies, which share every outcome it settles with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import pandas as pd

from .._internal.flow import WaitBudget
from ..keys import row_key
from ..plays.outputs import OutputModel
from ..records import Status
from .grouping import message_group
from .rows import Row, result_frame

__all__ = ["ERROR_COLUMNS", "FailedRow", "ParkedRow", "Parking", "RowEntry", "RowTable", "Waiting"]


class Parking(NamedTuple):
    """Why a row parked: ``hold``, ``down`` or ``budget``; on which provider; ready when (epoch seconds)."""

    reason: str
    provider: str | None
    ready_at: float | None


class Waiting(NamedTuple):
    """What a row off its worker waits for: a provider's hold, or its own ``ctx.sleep``."""

    kind: Literal["provider", "sleep"]
    provider: str | None  # the provider's name; None for a sleep


ERROR_COLUMNS = ["row", "position", "error", "group"]  # run.errors


class FailedRow(NamedTuple):
    row: Any  # the index label
    position: int
    error: str
    group: str  # what it failed of, with the values masked: rows failed by one bug share it


class ParkedRow(NamedTuple):
    row: Any
    position: int
    reason: str
    provider: str | None
    ready_at: float | None
    message: str | None


@dataclass(slots=True)
class RowEntry:
    """One row of the run."""

    key: str | None = None  # its identity; None: it has none (its values have no key form)
    status: Status | None = None  # None: not settled in this execution
    output: dict[str, Any] | None = None
    error: str | None = None
    group: str | None = None  # a failed row: its error's group
    parking: Parking | None = None
    waiting: Waiting | None = None  # set while it waits in the held queue
    running: bool = False  # on a worker now
    attempts: int = 0
    budgets: dict[str, WaitBudget] | None = None  # provider -> wait left, until the row settles
    memo_key: str | None = None  # found while looking for its memo, kept to write it
    copies: list[int] | None = None  # on a lead: later rows with the same key
    copy: bool = False  # a later row with an earlier row's key: it never runs itself

    def unsettle(self) -> None:
        self.status = self.output = self.error = self.group = self.parking = None


class RowTable:
    """Every row's :class:`RowEntry`, its values and its index label, by position."""

    __slots__ = ("entries", "labels", "values", "columns")

    def __init__(self, frame: pd.DataFrame) -> None:
        self.entries = [RowEntry() for _ in range(len(frame))]
        self.labels: list[Any] = list(frame.index)
        columns = [_values(frame.iloc[:, i]) for i in range(frame.shape[1])]
        self.values: list[tuple[Any, ...]] = list(zip(*columns)) if columns else [()] * len(frame)
        self.columns = {c: i for i, c in enumerate(frame.columns)}  # shared by every Row

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        settled = sum(e.status is not None for e in self.entries)
        return f"<RowTable {len(self.entries)} rows, {settled} settled>"

    def label(self, pos: int) -> Any:
        return self.labels[pos]

    def row(self, pos: int) -> Row:
        """The row as the play sees it."""
        return Row(self.columns, self.values[pos], self.labels[pos])

    def group(self, pos: int) -> Sequence[int]:
        """The row and the rows sharing its key."""
        copies = self.entries[pos].copies
        return (pos, *copies) if copies else (pos,)

    def identify(self, positions: list[int], key_cols: list[Any] | None) -> tuple[list[int], list[tuple[int, str]]]:
        """Key each row; group duplicates under their first position.  Returns the rows to run and
        ``(position, why)`` for the rows that cannot be identified."""
        key_idx = [self.columns[c] for c in key_cols] if key_cols is not None else None
        seen: dict[str, int] = {}
        runnable: list[int] = []
        unkeyed: list[tuple[int, str]] = []
        entries, values = self.entries, self.values
        for pos in positions:
            vals = values[pos]
            try:
                key = row_key(list(vals) if key_idx is None else [vals[i] for i in key_idx])
            except TypeError as exc:
                unkeyed.append((pos, f"cannot identify the row: {exc}; pass key=COLUMNS naming the columns that identify a row"))
                continue
            entries[pos].key = key
            lead = seen.get(key)
            if lead is None:
                seen[key] = pos
                runnable.append(pos)
            else:
                copies = entries[lead].copies
                if copies is None:
                    copies = entries[lead].copies = []
                copies.append(pos)
                entries[pos].copy = True
        return runnable, unkeyed

    def set_outcome(self, pos: int, status: Status, output: dict[str, Any] | None, error: str | None, group: str | None = None) -> int:
        """Give the row (and its copies) its outcome; returns how many rows share it."""
        entries = self.entries
        entry = entries[pos]
        # Settled: its wait budgets go (a retried row waits afresh: max_wait counts from then).
        entry.running, entry.budgets = False, None
        entry.status, entry.output, entry.error, entry.group = status, output, error, group
        copies = entry.copies
        if not copies:
            return 1
        for p in copies:
            other = entries[p]
            other.status, other.output, other.error, other.group = status, output, error, group
        return 1 + len(copies)

    def park(self, pos: int, parking: Parking) -> None:
        for p in self.group(pos):
            self.entries[p].parking = parking

    def unsettle(self, pos: int) -> int:
        """The row (and its copies) runs again; returns how many rows that is."""
        group = self.group(pos)
        for p in group:
            self.entries[p].unsettle()
        return len(group)

    def settled_as(self, statuses: tuple[str, ...]) -> list[int]:
        """Leads (and single rows) with one of ``statuses`` that can run again."""
        return [p for p, e in enumerate(self.entries) if e.status in statuses and e.key is not None and not e.copy]

    # -- read by RunState --------------------------------------------------------------

    def failed(self) -> list[FailedRow]:
        labels = self.labels
        return [
            FailedRow(labels[p], p, e.error or "", e.group or message_group(e.error or ""))
            for p, e in enumerate(self.entries)
            if e.status == "failed"
        ]

    def parked(self) -> list[ParkedRow]:
        labels, out = self.labels, []
        for p, e in enumerate(self.entries):
            if e.status == "parked":
                reason, provider, ready = e.parking if e.parking is not None else ("", None, None)
                out.append(ParkedRow(labels[p], p, reason, provider, ready, e.error))
        return out

    def held(self) -> dict[int, Waiting]:
        """The rows waiting off their workers now, and what for."""
        return {p: e.waiting for p, e in enumerate(self.entries) if e.waiting is not None}

    def result(self, frame: pd.DataFrame, model: OutputModel | None = None) -> pd.DataFrame:
        entries = self.entries
        return result_frame(frame, [e.output for e in entries], [e.status for e in entries], [e.error for e in entries], model)


def _values(column: pd.Series[Any]) -> Any:
    """A column's values as iterating it gives them (what ``itertuples`` gives), faster for text:
    pandas iterates a pyarrow-backed string column one element at a time in Python, which cost a
    fifth of a 20k-row replay; its object array holds the same values (missing ones as its NA)."""
    dtype = column.dtype
    if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow":
        return column.to_numpy(dtype=object, na_value=dtype.na_value)  # type: ignore[arg-type]  # NA or NaN, as iterating gives
    return column
