"""The failed and parked rows of a run as they happen, for the live panel.

The static summary can scan every row once at the end; a panel redrawn ten times a second over a
million rows cannot.  ``Tally`` keeps the failed rows grouped by their error's group (one bug, one
group: see :mod:`playbook.runtime.rows.grouping`) and the parked rows grouped by reason, provider and
the minute they are ready at, updated from the run's events, so a redraw costs the size of what
it shows.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from playbook.events import Event, RowFinished, RowHeld, RowParked, RowRequeued, RowResumed, RowSleeping
from playbook.runtime.state.reading import Families, RunState

__all__ = ["KINDS", "Tally"]

KINDS = (RowFinished, RowParked, RowRequeued, RowHeld, RowSleeping, RowResumed)
_Parking = tuple[str, str | None, float | None]  # reason, provider, ready at
_Group = tuple[str, str | None, float | None]  # reason, provider, the minute it is ready at


class Tally:
    """Failed rows by group (count, an example row and its message), parked rows (reason,
    provider, ready at; counted by provider, by provider and reason, and by reason, provider and
    ready-at minute), and the rows each provider holds back.  The live panel keeps one up to date
    from the events; the static summary takes one of the rows as they stand (:meth:`of`).
    """

    __slots__ = (
        "_label",
        "failed",
        "families",
        "copies",
        "counts",
        "costs",
        "paid",
        "example",
        "parked",
        "parked_rows_by",
        "parked_reasons",
        "parked_groups",
        "latest",
        "held",
        "held_by",
        "version",
    )

    def __init__(self, label: Callable[[int], Any]) -> None:
        self._label = label  # position -> the row's index label
        self.failed: dict[int, tuple[str, str]] = {}  # position -> its error's fingerprint, its message
        self.families = Families()  # fingerprints of one type and place: many are one group
        self.copies: dict[int, int] = {}  # position -> rows sharing its key, when more than one
        self.counts: dict[str, int] = {}  # fingerprint -> failed rows (its group: families.label)
        self.costs: dict[int, float] = {}  # position of a failed row that paid for calls -> what they cost
        # fingerprint -> what its failed rows paid for (kept as rows come and go, as counts)
        self.paid: dict[str, float] = {}
        self.example: dict[str, int] = {}  # fingerprint -> a position that failed so
        self.parked: dict[int, _Parking] = {}  # position -> (reason, provider, ready_at)
        self.parked_rows_by: dict[str | None, int] = {}  # provider -> parked rows
        self.parked_reasons: dict[tuple[str | None, str], int] = {}  # (provider, reason) -> parked rows
        self.parked_groups: dict[_Group, int] = {}  # (reason, provider, ready-at minute) -> parked rows
        self.latest: dict[_Group, float] = {}  # such a group -> the latest time one of its rows is ready at
        self.held: dict[int, str | None] = {}  # position -> the provider it waits on (None: it sleeps)
        self.held_by: dict[str, int] = {}  # provider -> rows it holds now (sleeping rows are no provider's)
        self.version = 0  # bumped on every change: a view redraws the tables only when it moved

    @classmethod
    def of(cls, state: RunState) -> Tally:
        """The tally of a run's rows as they stand: one scan, for a summary."""
        tally = cls(state.label)
        for failed in state.failed_rows():
            tally._fail(failed.position, failed.group, failed.error, 1, failed.cost)
        for parked in state.parked_rows():
            entry = (parked.reason, parked.provider, parked.ready_at)
            tally.parked[parked.position] = entry
            tally._count_parked(entry, 1)
        for position, waiting in state.waiting_rows().items():
            tally._hold(position, waiting.provider)
        return tally

    def on_event(self, event: Event) -> None:
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
            self._resume(event.position)  # a stop settles waiting rows
        status = event.status
        if status == "ok" or status == "reused":  # most rows: nothing to tally
            return
        position, rows = event.position, event.copies
        if rows != 1:
            self.copies[position] = rows
        if status == "failed":
            self._fail(position, event.group or event.error or "", event.error or "", rows, event.cost_failed)
            self.version += 1
        elif status == "parked" and (entry := self.parked.get(position)) is not None:
            self._count_parked(entry, rows)

    def _fail(self, position: int, group: str, message: str, rows: int, cost: float) -> None:
        if cost:
            self.costs[position] = cost
            self.paid[group] = self.paid.get(group, 0.0) + cost
        self.families.add(group)
        self.failed[position] = (group, message)
        self.counts[group] = self.counts.get(group, 0) + rows
        self.example.setdefault(group, position)

    def _hold(self, position: int, provider: str | None) -> None:
        self.held[position] = provider
        if provider is not None:
            self.held_by[provider] = self.held_by.get(provider, 0) + 1

    def _count_parked(self, entry: _Parking, rows: int) -> None:
        reason, provider, ready = entry
        self.parked_rows_by[provider] = self.parked_rows_by.get(provider, 0) + rows
        self.parked_reasons[provider, reason] = self.parked_reasons.get((provider, reason), 0) + rows
        group = (reason, provider, None if ready is None else ready // 60 * 60)
        n = self.parked_groups.get(group, 0) + rows
        if n > 0:
            self.parked_groups[group] = n
            if ready is not None and ready > self.latest.get(group, 0.0):
                self.latest[group] = ready
        else:
            self.parked_groups.pop(group, None)
            self.latest.pop(group, None)

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
        failed = self.failed.pop(position, None)
        if failed is None:
            return
        group = failed[0]
        cost = self.costs.pop(position, 0.0)
        if cost:
            self.paid[group] -= cost
        self.counts[group] -= rows
        if self.counts[group] <= 0:
            del self.counts[group], self.example[group]
        elif self.example[group] == position:  # the example was retried: show a row that still fails so
            self.example[group] = next(p for p, (g, _) in self.failed.items() if g == group)

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
        """Why the rows parked on ``provider`` (``None``: on no provider, e.g. the budget) parked:
        reason -> rows."""
        return {reason: n for (name, reason), n in self.parked_reasons.items() if name == provider and n}

    def error_groups(self, limit: int) -> list[tuple[int, str, Any, str, float]]:
        """The ``limit`` largest groups: (rows, group, example row label, its message, what its rows
        paid for)."""
        rows: dict[str, int] = {}
        example: dict[str, int] = {}
        label = self.families.label
        for fingerprint, n in self.counts.items():
            group = label(fingerprint)
            rows[group] = rows.get(group, 0) + n
            example.setdefault(group, self.example[fingerprint])
        cost: dict[str, float] = {}
        for fingerprint, paid in self.paid.items():  # a redraw costs the groups, not the rows
            group = label(fingerprint)
            cost[group] = cost.get(group, 0.0) + paid
        top = heapq.nlargest(limit, rows.items(), key=lambda item: item[1])
        return [
            (n, group, self._label(example[group]), self.failed[example[group]][1], cost.get(group, 0.0))
            for group, n in top
        ]

    @property
    def kinds(self) -> int:
        """Groups of failed rows (fingerprints of a large family count as one)."""
        label = self.families.label
        return len({label(fingerprint) for fingerprint in self.counts})

    def parked_summary(self, limit: int) -> list[tuple[int, str, str | None, float | None]]:
        """The ``limit`` largest groups of parked rows, by reason, provider and the minute they are
        ready at: (rows, reason, provider, the latest time one of them is ready at)."""
        top = heapq.nlargest(limit, self.parked_groups.items(), key=lambda item: item[1])
        return [(count, group[0], group[1], self.latest.get(group)) for group, count in top]
