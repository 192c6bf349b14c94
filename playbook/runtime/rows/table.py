"""The rows table: every row's state, and the frame's values as plays see them.

A row's status, output, error, why it parked, what it waits on while held, its attempts and its
wait budgets change only through :class:`RowTable`'s methods, so settling or re-admitting a row
is one call and no column can fall out of step with another.  Rows with the same key run once:
the first (the *lead*) lists its copies, which share every outcome it settles with.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, cast

import numpy as np
import pandas as pd

from playbook._internal.flow import WaitBudget
from playbook.addresses import int_row_digests, labelled_row_digest, row_digest
from playbook.plays.outputs import OutputModel
from playbook.records import Status
from playbook.runtime.rows.frames import ABSENT, Row, result_frame
from playbook.runtime.rows.grouping import consolidate, message_group

__all__ = ["ERROR_COLUMNS", "FailedRow", "ParkedRow", "Parking", "RowTable", "Waiting", "grouped"]


class Parking(NamedTuple):
    """Why a row parked: ``hold``, ``down`` or ``budget``; on which provider; ready when (epoch seconds)."""

    reason: str
    provider: str | None
    ready_at: float | None


class Waiting(NamedTuple):
    """What a row off its worker waits for: a provider's hold, or its own ``ctx.sleep``."""

    kind: Literal["provider", "sleep"]
    provider: str | None  # the provider's name; None for a sleep


ERROR_COLUMNS = ["row", "position", "error", "group", "cost"]  # run.errors


class FailedRow(NamedTuple):
    row: Any  # the index label
    position: int
    error: str
    group: str  # what it failed of, with the values masked: rows failed by one bug share it
    # what its calls paid for in the attempt that failed (rows sharing its key: on the first)
    cost: float = 0.0


class ParkedRow(NamedTuple):
    row: Any
    position: int
    reason: str
    provider: str | None
    ready_at: float | None
    message: str | None


_STATUSES: tuple[Status | None, ...] = (None, "ok", "reused", "failed", "parked", "skipped")
_CODE = {status: code for code, status in enumerate(_STATUSES)}
_AHEAD = 256  # rows whose values are made at once, as rows are taken in order


class RowTable:
    """Every row's state, its values and its index label, by position.

    Columnar, so that a million rows cost a few bytes each beyond what they return: statuses in a
    ``bytearray``, attempts in an ``array``, outputs as one list per output column, and what few
    rows have (an error, a parking, a wait, copies) in dictionaries by position.  The frame's
    values are read from its columns when a row runs (see :func:`_values`), not made a tuple per row.
    """

    __slots__ = (
        "labels",
        "columns",
        "digests",
        "statuses",
        "attempts",
        "outputs",
        "errors",
        "groups",
        "costs",
        "parkings",
        "waiting",
        "running",
        "budgets",
        "copies",
        "copy",
        "_getters",
        "_ahead",
        "_ahead_at",
        "_range",
        "_size",
    )

    def __init__(self, frame: pd.DataFrame) -> None:
        n = self._size = len(frame)
        index = frame.index
        # A RangeIndex is read as arithmetic; another index once, as the values it iterates as.
        self._range = (index.start, index.step) if isinstance(index, pd.RangeIndex) else None
        self.labels: Sequence[Any] | pd.Index = index if self._range is not None else list(index)
        self._getters = [_values(frame.iloc[:, i]) for i in range(frame.shape[1])]
        # The values of the rows from _ahead_at on, made a chunk at a time as rows are taken in order.
        self._ahead: list[tuple[Any, ...]] = []
        self._ahead_at = 0
        self.columns = {c: i for i, c in enumerate(frame.columns)}  # shared by every Row
        # Each row's identity (addresses.row_id) as 16 bytes; all zeros: none yet, or none at all (its
        # values have no key form).
        self.digests = bytearray(16 * n)
        self.statuses = bytearray(n)  # a code of _STATUSES; 0: not settled in this execution
        self.attempts = array("I", bytes(4 * n))
        self.outputs: dict[str, list[Any]] = {}  # column -> every row's value, ABSENT where it returned none
        self.errors: dict[int, str] = {}
        self.groups: dict[int, str] = {}  # a failed row: its error's group
        self.costs: dict[int, float] = {}  # a failed row that paid for calls: what they cost
        self.parkings: dict[int, Parking] = {}
        self.waiting: dict[int, Waiting] = {}  # rows in the waiting queue, and what for
        self.running: set[int] = set()  # on a worker now
        self.budgets: dict[int, dict[str, WaitBudget]] = {}  # provider -> wait left, until the row settles
        self.copies: dict[int, list[int]] = {}  # a lead: later rows with the same key
        self.copy: set[int] = set()  # later rows with an earlier row's id: they never run themselves

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        settled = self._size - self.statuses.count(0)
        return f"<RowTable {self._size} rows, {settled} settled>"

    def label(self, pos: int) -> Any:
        if self._range is not None:
            return self._range[0] + pos * self._range[1]
        return self.labels[pos]

    def values(self, pos: int) -> tuple[Any, ...]:
        """The row's values, in column order, as iterating the frame gives them."""
        ahead = self._ahead
        i = pos - self._ahead_at
        if 0 <= i < len(ahead):
            return ahead[i]
        if i == len(ahead) and self._getters:  # the row after the chunk: the next chunk, made at once
            self._ahead = ahead = list(zip(*[_slice(get, pos, pos + _AHEAD) for get in self._getters]))
            self._ahead_at = pos
            return ahead[0]
        return tuple([get(pos) for get in self._getters])  # a row out of order (a retry, a row back)

    def row(self, pos: int) -> Row:
        """The row as the play sees it."""
        return Row(self.columns, self.values(pos), self.label(pos))

    def status(self, pos: int) -> Status | None:
        return _STATUSES[self.statuses[pos]]

    def output(self, pos: int) -> dict[str, Any] | None:
        """The row's output columns (``None``: it has no output)."""
        if self.statuses[pos] not in (1, 2):
            return None
        return {c: v for c, values in self.outputs.items() if (v := values[pos]) is not ABSENT}

    def started(self, pos: int) -> int:
        """A worker took the row; returns its attempt number."""
        self.running.add(pos)
        n = self.attempts[pos] = self.attempts[pos] + 1
        return n

    def group(self, pos: int) -> Sequence[int]:
        """The row and the rows sharing its key."""
        copies = self.copies.get(pos)
        return (pos, *copies) if copies else (pos,)

    def key(self, pos: int) -> str | None:
        """The row's identity (:func:`~playbook.addresses.row_id`), or ``None``: it has none."""
        digest = self.digests[16 * pos : 16 * pos + 16]
        return digest.hex() if any(digest) else None

    def identify(
        self, positions: Sequence[int], key_cols: list[Any] | None, labelled: bool = False
    ) -> tuple[Sequence[int], list[tuple[int, str]]]:
        """Key each row; group duplicates under their first position.  Returns the rows to run
        (``positions`` itself when every row has a key of its own) and ``(position, why)`` for
        the rows that cannot be identified.  ``labelled``: each row's index label is part of its
        identity (its play reads it), so rows differing only by label are not duplicates."""
        key_idx = [self.columns[c] for c in key_cols] if key_cols is not None else None
        getters = self._getters if key_idx is None else [self._getters[i] for i in key_idx]
        ints = [_int_array(get) for get in getters]
        labels = self._int_labels() if labelled else None
        if getters and all(a is not None for a in ints) and (labels is not None or not labelled):
            # the common id column
            where = np.asarray(positions, dtype=np.int64)
            view = np.frombuffer(self.digests, dtype="S16")
            for start in range(0, len(where), 65536):  # their values as Python ints: 2 MB at a time
                part = where[start : start + 65536]
                digests = int_row_digests([a[part] for a in ints], None if labels is None else labels[part])  # type: ignore[index]
                view[part] = np.frombuffer(digests, dtype="S16")
            return self._leads(positions), []
        keyed: list[int] = []
        unkeyed: list[tuple[int, str]] = []
        digests = self.digests
        for pos in positions:
            try:
                values = [get(pos) for get in getters]
                digests[16 * pos : 16 * pos + 16] = (
                    labelled_row_digest(values, self.label(pos)) if labelled else row_digest(values)
                )
            except TypeError as exc:
                unkeyed.append(
                    (
                        pos,
                        f"cannot identify the row: {exc}; pass id_columns=COLUMNS naming the columns that identify a row",
                    )
                )
                continue
            keyed.append(pos)
        return self._leads(keyed if unkeyed else positions), unkeyed

    def _int_labels(self) -> np.ndarray[Any, Any] | None:
        """Every row's index label as an array of ints, when they all are ints (a RangeIndex)."""
        if self._range is not None:
            return np.arange(self._size, dtype=np.int64) * self._range[1] + self._range[0]
        if not all(type(label) is int for label in self.labels):  # not a bool either: its key form is "true"
            return None
        try:
            return np.asarray(self.labels, dtype=np.int64)
        except OverflowError:  # past 64 bits: their text the slow way
            return None

    def _leads(self, keyed: Sequence[int]) -> Sequence[int]:
        """The first row of each key among ``keyed`` (in order); later rows become its copies.  By
        sorting the digests, not with a dict of a million keys."""
        if len(keyed) < 2:
            return keyed
        where = np.asarray(keyed, dtype=np.int64)
        firsts = np.sort(np.frombuffer(self.digests, dtype=">u8")[0::2][where])
        if not (firsts[1:] == firsts[:-1]).any():
            # no two rows share their first 8 bytes: none share a key (a sort of ints: fast, np.unique is not)
            return keyed
        digests = np.frombuffer(self.digests, dtype="S16")[where]
        _, first, inverse = np.unique(digests, return_index=True, return_inverse=True)
        if len(first) == len(keyed):
            return keyed
        leads = where[first][inverse.reshape(-1)]  # each row's lead
        copies = self.copies
        for pos, lead in zip(where[leads != where].tolist(), leads[leads != where].tolist()):
            copies.setdefault(lead, []).append(pos)
            self.copy.add(pos)
        runnable: list[int] = where[leads == where].tolist()
        return runnable

    def set_outcome(
        self,
        pos: int,
        status: Status,
        output: dict[str, Any] | None,
        error: str | None,
        group: str | None = None,
        cost: float = 0.0,
    ) -> int:
        """Give the row (and its copies) its outcome; returns how many rows share it."""
        # Settled: its wait budgets go (a retried row waits afresh: max_wait counts from then).
        self.running.discard(pos)
        code = _CODE[status]
        if code < 3 and error is None and not (self.budgets or self.errors or self.costs or self.copies):
            # ok or reused, alone, with nothing of a failure to clear: the usual row
            self.statuses[pos] = code
            if output:
                self._put(pos, output)
            return 1
        if self.budgets:
            self.budgets.pop(pos, None)
        rows = self.group(pos)
        for p in rows:
            self.statuses[p] = code
            if output:
                self._put(p, output)
            elif code > 2:  # only rows that are ok or reused show an output
                for values in self.outputs.values():
                    values[p] = ABSENT
            if error is not None:
                self.errors[p] = error
            elif self.errors:
                self.errors.pop(p, None)
            if group is not None:
                self.groups[p] = sys.intern(group)  # rows failed by one bug share one text
        if code == 3 and cost:
            self.costs[pos] = cost
        elif self.costs:
            self.costs.pop(pos, None)
        return len(rows)

    def settle_reused(self, pos: int, output: dict[str, Any]) -> int:
        """:meth:`set_outcome` of a row settled by its memo: ``reused``, with no error.  The short
        way while no row runs, waits or has copies (a rerun's memos, met before any row runs)."""
        if self.running or self.budgets or self.errors or self.costs or self.copies:
            return self.set_outcome(pos, "reused", output, None)
        self.statuses[pos] = 2
        if output:
            self._put(pos, output)
        return 1

    def _put(self, pos: int, output: dict[str, Any]) -> None:
        outputs = self.outputs
        for c, v in output.items():
            values = outputs.get(c)
            if values is None:
                values = outputs[c] = [ABSENT] * self._size
            values[pos] = v

    def park(self, pos: int, parking: Parking) -> None:
        for p in self.group(pos):
            self.parkings[p] = parking

    def unsettle(self, pos: int) -> int:
        """The row (and its copies) runs again; returns how many rows that is."""
        group = self.group(pos)
        for p in group:
            self.statuses[p] = 0
            for values in self.outputs.values():
                values[p] = ABSENT
            self.errors.pop(p, None)
            self.groups.pop(p, None)
            self.costs.pop(p, None)
            self.parkings.pop(p, None)
        return len(group)

    def settled_as(self, statuses: tuple[str, ...]) -> list[int]:
        """Leads (and single rows) with one of ``statuses`` that can run again."""
        codes = {_CODE[cast(Status, s)] for s in statuses}
        copy, states = self.copy, self.statuses
        return [
            p for p in range(self._size) if states[p] in codes and p not in copy and self.key(p) is not None
        ]

    # -- read by RunState --------------------------------------------------------------

    # ``rows``: only these positions (a retry's run reads the rows it ran); None: every row.

    def failed(self, rows: frozenset[int] | None = None) -> list[FailedRow]:
        states = self.statuses
        return [
            FailedRow(self.label(p), p, e, self.groups.get(p) or message_group(e), self.costs.get(p, 0.0))
            for p, e in sorted(self.errors.items())
            if states[p] == 3 and (rows is None or p in rows)
        ]

    def parked(self, rows: frozenset[int] | None = None) -> list[ParkedRow]:
        out, states = [], self.statuses
        for p, message in sorted(self.errors.items()):
            if states[p] == 4 and (rows is None or p in rows):
                reason, provider, ready = self.parkings.get(p) or ("", None, None)
                out.append(ParkedRow(self.label(p), p, reason, provider, ready, message))
        return out

    def held(self, rows: frozenset[int] | None = None) -> dict[int, Waiting]:
        """The rows waiting off their workers now, and what for."""
        return dict(self.waiting) if rows is None else {p: w for p, w in self.waiting.items() if p in rows}

    def result(self, frame: pd.DataFrame, model: OutputModel | None = None) -> pd.DataFrame:
        states = np.frombuffer(self.statuses, dtype=np.uint8)
        status = np.array(_STATUSES, dtype=object)[states]
        error = np.full(self._size, None, dtype=object)
        if self.errors:
            error[np.fromiter(self.errors, dtype=np.int64, count=len(self.errors))] = _objects(
                self.errors.values()
            )
        return result_frame(frame, self.outputs, status, error, model)


def _objects(values: Any) -> np.ndarray[Any, Any]:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _values(column: pd.Series[Any]) -> Callable[[int], Any]:
    """How to read a column's value at a position, as iterating it gives it (what ``itertuples``
    gives).  A numpy column is copied (8 bytes a row: a frame changed while the run goes on does
    not change what its rows see) and read with ``item``, as pandas iterates it; a pyarrow-backed
    string column is read from its object array, which holds the same values (missing ones as its
    NA) and is far faster; any other column is read as the list of what it iterates as."""
    dtype = column.dtype
    if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow":
        # NA or NaN, as iterating gives
        return column.to_numpy(dtype=object, na_value=dtype.na_value).item  # type: ignore[arg-type]
    if isinstance(dtype, np.dtype) and dtype.kind in "biufcO":
        return np.array(column.to_numpy(), copy=True).item
    return list(column).__getitem__


def _slice(get: Callable[[int], Any], start: int, stop: int) -> list[Any]:
    """The values ``get`` (of :func:`_values`) reads from ``start`` to ``stop``, as it reads them."""
    source = get.__self__  # type: ignore[attr-defined]  # a bound method of an array or a list
    return source[start:stop].tolist() if isinstance(source, np.ndarray) else source[start:stop]  # type: ignore[no-any-return]


def _int_array(get: Callable[[int], Any]) -> np.ndarray[Any, Any] | None:
    """The column a getter of :func:`_values` reads, if it is numpy's ints or bools."""
    array = getattr(get, "__self__", None)
    return array if isinstance(array, np.ndarray) and array.dtype.kind in "iub" else None


def grouped(rows: list[FailedRow]) -> list[FailedRow]:
    """The failed rows with the group each belongs to (a family of many fingerprints is one)."""
    groups = consolidate(row.group for row in rows)
    return [row if (group := groups[row.group]) == row.group else row._replace(group=group) for row in rows]
