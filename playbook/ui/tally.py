"""The failed and parked rows of a run as they happen, for the live panel.

The static summary can scan every row once at the end; a panel redrawn ten times a second over a
million rows cannot.  ``Tally`` keeps the failed rows grouped by message and the parked rows in
order of parking, updated from the run's events, so a redraw costs the size of what it shows.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import islice
from typing import Any

from ..models import RowFinished, RowHeld, RowParked, RowRequeued, RowResumed, RowSleeping
from ..runtime.state import RunEvent, RunState

__all__ = ["KINDS", "Tally"]

KINDS = (RowFinished, RowParked, RowRequeued, RowHeld, RowSleeping, RowResumed)
_Parking = tuple[str, str | None, float | None]  # reason, provider, ready at


class Tally:
    """Failed rows by message (count and an example), parked rows (reason, provider, ready at;
    counted by provider and by provider and reason), and the rows each provider holds back.  The
    live panel keeps one up to date from the events; the static summary takes one of the rows as
    they stand (:meth:`of`).
    """

    __slots__ = (
        "_label", "failed", "copies", "counts", "example", "parked", "parked_rows_by", "parked_reasons", "held", "held_by",
        "version",
    )  # fmt: skip

    def __init__(self, label: Callable[[int], Any]) -> None:
        self._label = label  # position -> the row's index label
        self.failed: dict[int, str] = {}  # position -> message
        self.copies: dict[int, int] = {}  # position -> rows sharing its key, when more than one
        self.counts: dict[str, int] = {}  # message -> failed rows
        self.example: dict[str, int] = {}  # message -> a position that failed so
        self.parked: dict[int, _Parking] = {}  # position -> (reason, provider, ready_at)
        self.parked_rows_by: dict[str | None, int] = {}  # provider -> parked rows
        self.parked_reasons: dict[tuple[str | None, str], int] = {}  # (provider, reason) -> parked rows
        self.held: dict[int, str | None] = {}  # position -> the provider it waits on (None: it sleeps)
        self.held_by: dict[str, int] = {}  # provider -> rows it holds now (sleeping rows are no provider's)
        self.version = 0  # bumped on every change: a view redraws the tables only when it moved

    @classmethod
    def of(cls, state: RunState) -> Tally:
        """The tally of a run's rows as they stand: one scan, for a summary."""
        tally = cls(state.label)
        for failed in state.failed_rows():
            message, position = failed.error, failed.position
            tally.failed[position] = message
            tally.counts[message] = tally.counts.get(message, 0) + 1
            tally.example.setdefault(message, position)
        for parked in state.parked_rows():
            entry = (parked.reason, parked.provider, parked.ready_at)
            tally.parked[parked.position] = entry
            tally._count_parked(entry, 1)
        for position, waiting in state.held_rows().items():
            tally._hold(position, waiting.provider)
        return tally

    def on_event(self, event: RunEvent) -> None:
        if type(event) is RowFinished:
            status = event.status
            if (status == "ok" or status == "reused") and not self.held:
                return  # most rows, at up to 100k events a second: nothing to tally
            self._finished(event)
        elif isinstance(event, RowParked):  # the RowFinished that follows says how many rows
            self.parked[event.position] = (event.reason, event.provider, event.ready_at)
            self.version += 1
        elif isinstance(event, RowHeld):
            self._resume(event.position)  # held again, maybe by another provider
            self._hold(event.position, event.provider)
        elif isinstance(event, RowSleeping):
            self._resume(event.position)
            self._hold(event.position, None)
        elif isinstance(event, RowResumed):
            self._resume(event.position)
        elif isinstance(event, RowRequeued):
            self._forget(event.position)

    def _finished(self, event: RowFinished) -> None:
        if self.held:
            self._resume(event.position)  # a stop settles held rows
        status = event.status
        if status == "ok" or status == "reused":  # most rows: nothing to tally
            return
        position, rows = event.position, event.copies
        if rows != 1:
            self.copies[position] = rows
        if status == "failed":
            message = event.error or ""
            self.failed[position] = message
            self.counts[message] = self.counts.get(message, 0) + rows
            self.example.setdefault(message, position)
            self.version += 1
        elif status == "parked" and (entry := self.parked.get(position)) is not None:
            self._count_parked(entry, rows)

    def _hold(self, position: int, provider: str | None) -> None:
        self.held[position] = provider
        if provider is not None:
            self.held_by[provider] = self.held_by.get(provider, 0) + 1

    def _count_parked(self, entry: _Parking, rows: int) -> None:
        reason, provider = entry[0], entry[1]
        self.parked_rows_by[provider] = self.parked_rows_by.get(provider, 0) + rows
        self.parked_reasons[provider, reason] = self.parked_reasons.get((provider, reason), 0) + rows

    def _resume(self, position: int) -> None:
        if position in self.held:
            provider = self.held.pop(position)
            if provider is not None:
                self.held_by[provider] -= 1

    def _forget(self, position: int) -> None:
        """A retried row leaves the tables until it settles again."""
        self.version += 1
        rows = self.copies.pop(position, 1)
        parked = self.parked.pop(position, None)
        if parked is not None:
            self._count_parked(parked, -rows)
        message = self.failed.pop(position, None)
        if message is None:
            return
        self.counts[message] -= rows
        if self.counts[message] <= 0:
            del self.counts[message], self.example[message]
        elif self.example[message] == position:  # the example was retried: show a row that still fails so
            self.example[message] = next(p for p, m in self.failed.items() if m == message)

    @property
    def parked_count(self) -> int:
        return sum(self.parked_rows_by.values())

    def waiting(self) -> dict[str | None, int]:
        """Rows each provider holds back: held now, or parked on it."""
        counts: dict[str | None, int] = {name: n for name, n in self.parked_rows_by.items() if n}
        for provider, n in self.held_by.items():
            counts[provider] = counts.get(provider, 0) + n
        return counts

    def reasons(self, provider: str | None) -> dict[str, int]:
        """Why the rows parked on ``provider`` (``None``: on no provider, e.g. the budget) parked: reason -> rows."""
        return {reason: n for (name, reason), n in self.parked_reasons.items() if name == provider and n}

    def error_groups(self, limit: int) -> list[tuple[int, str, Any]]:
        """The ``limit`` largest groups: (rows, message, example row label)."""
        top = heapq.nlargest(limit, self.counts.items(), key=lambda item: item[1])
        return [(count, message, self._label(self.example[message])) for message, count in top]

    def parked_rows(self, limit: int) -> list[tuple[Any, str, str | None, float | None]]:
        """The first ``limit`` parked rows: (row label, reason, provider, ready_at)."""
        return [(self._label(p), reason, provider, ready) for p, (reason, provider, ready) in islice(self.parked.items(), limit)]
