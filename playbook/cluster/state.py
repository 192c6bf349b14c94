"""The live state of a cluster job on the client: the partitions' reports, summed.

A :class:`ClusterState` is a :class:`~playbook.runtime.state.RunState` whose counters are the
sums of each partition's latest report, whose rows held, parked and failed are those the reports
named, and whose providers are what the workers see (calls in flight and 429s summed over
workers; a hold or an outage if any worker has one).  It passes row events on to its views
(positions are job-wide), so the panel, the text bar and the summary show a cluster job as they
show a local one, plus a table of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..events import RowFinished, RowHeld, RowParked, RowRequeued, RowResumed, RowSleeping, RunFinished, RunNotice, RunProgress, RunStarted
from ..runtime.grouping import message_group
from ..runtime.state import FailedRow, ParkedRow, ProviderView, RunEvent, RunState, Waiting, WorkerView, grouped
from .wire import COUNTERS, decode_label

__all__ = ["ClusterState"]

_APPLIED = (RunStarted, RunFinished, RunNotice)  # the rest come summed in the reports
_PAID = ("calls_executed", "calls_failed", "cost_spent", "cost_failed", "receipts_lost")  # what an attempt cut short still counts
_CALLS, _COST, _FAILED = COUNTERS.index("calls_executed"), COUNTERS.index("cost_spent"), COUNTERS.index("calls_failed")
_ROWS = tuple(COUNTERS.index(name) for name in ("ok", "reused", "failed", "parked", "skipped"))


class _Partition:
    __slots__ = ("attempt", "base", "counts", "final", "positions", "worker", "legs", "base_legs", "rows")

    def __init__(self) -> None:
        self.attempt = ""
        self.worker = ""
        self.counts: list[float] = [0] * len(COUNTERS)
        self.base: list[float] = [0] * len(COUNTERS)  # a retry: what its rows not run again counted
        self.final = False
        self.positions: set[int] = set()  # job-wide positions it reported rows for
        self.legs: list[list[Any]] = []  # its waterfalls' legs, as its latest report counts them (LEG_COLUMNS)
        self.base_legs: list[list[Any]] = []  # a retry: what the rounds before counted
        self.rows: dict[int, int] | None = None  # its rows by status (COUNTERS' index), as its result has them

    def now(self) -> list[float]:
        """Its counters: the latest report's over its base, its rows as its result has them once built."""
        counts = [value + base for value, base in zip(self.counts, self.base)]
        if self.rows is not None:
            for i in _ROWS:
                counts[i] = self.rows.get(i, 0)
        return counts


class ClusterState(RunState):
    """A cluster job's counters and rows, from its partitions' reports."""

    __slots__ = ("_failed", "_held", "_labels", "_parked", "_parts", "_views", "_worker_views", "paid_by")

    def __init__(self, *, play: str = "", clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        super().__init__(play=play, clock=clock, wall=wall)
        self._parts: dict[int, _Partition] = {}
        self._failed: dict[int, FailedRow] = {}
        self._parked: dict[int, ParkedRow] = {}
        self._held: dict[int, Waiting] = {}
        self._labels: dict[int, Any] = {}
        self._views: dict[str, dict[str, ProviderView]] = {}  # worker -> provider -> its latest view
        # What an attempt paid for and recorded, as its store counted it (calls, cost), and the
        # requests it sent; None when not known.  Asked of an attempt cut short (its worker
        # died): what it paid for or sent after its last report is in no report.
        self.paid_by: Callable[[str], tuple[int, float, int] | None] = lambda attempt: None

    def emit(self, event: RunEvent) -> None:
        if type(event) in _APPLIED:
            super().emit(event)
        else:
            self.tell(event)

    # -- reports -----------------------------------------------------------------------

    def expect(self, part: int, base: list[float] | None = None) -> None:
        """Partition ``part`` is (re)submitted; ``base``: what its rows not run again count."""
        entry = self._parts.setdefault(part, _Partition())
        entry.final = False
        entry.base = list(base) if base is not None else [0] * len(COUNTERS)
        entry.base_legs = _summed([entry.base_legs, entry.legs]) if base is not None else []
        entry.counts = [0] * len(COUNTERS)
        entry.legs = []
        entry.attempt = ""
        entry.rows = None

    def requeue(self, positions: list[int]) -> None:
        """These rows run again (a retry): they are no longer failed or parked until reported."""
        for position in positions:
            self._forget(position)

    def apply(self, reports: list[dict[str, Any]]) -> None:
        """Take the reports drained from the job's channel, in order."""
        if not reports:
            return
        for report in reports:
            self._report(report)
        self._summed()

    def settle(self, part: int, statuses: dict[str, int]) -> None:
        """Partition ``part``'s result holds ``statuses`` (play_status -> rows): what its rows count
        from now on.  Dask may have computed it again after a worker holding it died, and the
        rows of that computation came back from their memos: ``reused``, where its reports said ``ok``."""
        self._parts[part].rows = {COUNTERS.index(status): n for status, n in statuses.items()}
        self._summed()

    def _summed(self) -> None:
        for name, total in zip(COUNTERS[1:], self._sums()[1:]):  # total is the job's, set when it starts
            setattr(self, name, total)
        self.sample()  # the providers as the workers report them, a few times a second
        self.emit(RunProgress(self.done))

    def _report(self, report: dict[str, Any]) -> None:
        part = self._parts.setdefault(report["part"], _Partition())
        if report["attempt"] != part.attempt:
            if part.final:
                return  # a late word from an attempt Dask already replaced
            if part.attempt:  # run again elsewhere (its worker died): forget what the old attempt said of its rows
                for position in part.positions:
                    self._forget(position)
                part.positions.clear()
                self._cut_short(part)
            part.attempt = report["attempt"]
        part.worker = report["worker"]
        part.counts = report["counts"]
        part.legs = report.get("waterfalls", [])
        part.final = report["final"]
        self._views[report["worker"]] = {view[0]: ProviderView(*view) for view in report["providers"]}
        for position, label, finished, held in report["rows"]:
            part.positions.add(position)
            self._labels[position] = decode_label(label)
            self._row(position, finished, held)
        for note in report["notices"]:
            if note not in self.notices:  # every partition's store says the same of a shared store
                self.emit(RunNotice(note))

    def _cut_short(self, part: _Partition) -> None:
        """Its attempt was run again elsewhere (its worker died): the rows it did are done again,
        but the requests it sent stay sent.  Each counts once: paid when its receipt was written
        (its rows, run again, find it), else failed (an error, or on the wire when the worker died)."""
        for name in _PAID:
            part.base[COUNTERS.index(name)] += part.counts[COUNTERS.index(name)]
        said = self.paid_by(part.attempt)
        if said is None:  # the job's Redis does not answer: its last report is what is known
            return
        calls, cost, sent = said
        paid = max(calls, part.counts[_CALLS])
        part.base[_CALLS] += paid - part.counts[_CALLS]
        part.base[_COST] += max(0.0, cost - part.counts[_COST])
        part.base[_FAILED] += max(0, sent - paid - part.counts[_FAILED])

    def _row(self, position: int, finished: list[Any] | None, held: list[Any] | None) -> None:
        was_held = self._held.pop(position, None)
        if finished is None and (position in self._failed or position in self._parked):
            self._forget(position)
        if finished is not None:
            status, error, copies, reason, provider, ready, group, cost = finished
            self._forget(position)
            if status == "parked":
                self._parked[position] = ParkedRow(self._labels[position], position, reason, provider, ready, error)
                self.emit(RowParked(position, reason, provider, ready))
            else:
                group = group or message_group(error or "")
                self._failed[position] = FailedRow(self._labels[position], position, error or "", group, cost)
            self.emit(RowFinished(position, status, error, copies, held=was_held is not None, group=group, cost_failed=cost))
        elif held is not None:
            kind, provider, until, status = held
            self._held[position] = Waiting(kind, provider)
            self.emit(RowSleeping(position, until) if kind == "sleep" else RowHeld(position, provider, until, status))
        elif was_held is not None:
            self.emit(RowResumed(position))

    def _forget(self, position: int) -> None:
        if self._failed.pop(position, None) is not None:
            self.emit(RowRequeued(position, "failed"))
        elif self._parked.pop(position, None) is not None:
            self.emit(RowRequeued(position, "parked"))
        self._held.pop(position, None)

    def _sums(self) -> list[float]:
        sums = [0.0] * len(COUNTERS)
        for part in self._parts.values():
            for i, value in enumerate(part.now()):
                sums[i] += value
        return [round(value, 9) if name.startswith("cost") else int(value) for name, value in zip(COUNTERS, sums)]

    def counts_of(self, part: int) -> list[float]:
        """Partition ``part``'s counters now (its base included)."""
        return self._parts[part].now()

    def status_of(self, position: int) -> str:
        """ "failed" or "parked": what the reports said of the row at ``position`` (one of those)."""
        return "failed" if position in self._failed else "parked"

    def rows_of(self, part_positions: range, status: str) -> list[int]:
        """Job-wide positions in ``part_positions`` whose rows are ``status`` ("failed", "parked")."""
        rows = self._failed if status == "failed" else self._parked
        return [p for p in rows if p in part_positions]

    # -- the read API views use --------------------------------------------------------

    def label(self, position: int) -> Any:
        return self._labels.get(position, position)

    def failed_rows(self) -> list[FailedRow]:
        return grouped([self._failed[p] for p in sorted(self._failed)])

    def parked_rows(self) -> list[ParkedRow]:
        return [self._parked[p] for p in sorted(self._parked)]

    def held_rows(self) -> dict[int, Waiting]:
        return dict(self._held)

    def provider_views(self) -> dict[str, ProviderView]:
        """Each provider as the workers see it: one that any worker sees held or down is; calls
        in flight, 429s and tokens are summed over workers (each counts its own)."""
        merged: dict[str, ProviderView] = {}
        for views in self._views.values():
            for name, view in views.items():
                seen = merged.get(name)
                merged[name] = view if seen is None else _merge(seen, view)
        return merged

    def leg_rows(self) -> list[list[Any]]:
        """The waterfalls' legs, summed over the partitions."""
        return _summed([legs for part in self._parts.values() for legs in (part.base_legs, part.legs)])

    def workers(self) -> list[WorkerView]:
        by: dict[str, list[int]] = {}
        for part in self._parts.values():
            if not part.worker:
                continue
            row = by.setdefault(part.worker, [0, 0, 0, 0, 0, 0])
            counts = dict(zip(COUNTERS, part.now()))
            row[0 if not part.final else 1] += 1
            row[2] += int(counts["ok"] + counts["reused"] + counts["failed"] + counts["parked"] + counts["skipped"])
            row[3] += int(counts["total"])
            row[4] += int(counts["calls_executed"])
            row[5] += int(counts["in_flight"])
        return [WorkerView(worker, *numbers) for worker, numbers in sorted(by.items())]


def _summed(tables: list[list[list[Any]]]) -> list[list[Any]]:
    """Waterfall legs (``LEG_COLUMNS`` rows) of several partitions, as one: counts added by leg."""
    summed: dict[tuple[Any, Any, Any], list[Any]] = {}
    for table in tables:
        for key, leg, tool, *counts in table:
            row = summed.setdefault((key, leg, tool), [key, leg, tool] + [0] * len(counts))
            for i, n in enumerate(counts, 3):
                row[i] += n
    return sorted(summed.values(), key=lambda row: (str(row[0]), row[1]))


def _merge(a: ProviderView, b: ProviderView) -> ProviderView:
    return ProviderView(
        name=a.name, down=a.down or b.down, down_error=a.down_error or b.down_error, probe_at=max(a.probe_at, b.probe_at),
        held=a.held or b.held, hold_until_at=max(a.hold_until_at, b.hold_until_at), last_status=b.last_status or a.last_status,
        rate=b.rate if b.rate is not None else a.rate, in_flight_limit=b.in_flight_limit or a.in_flight_limit,
        in_flight=a.in_flight + b.in_flight, refused=a.refused + b.refused, tokens=a.tokens + b.tokens, tpm=b.tpm or a.tpm,
        sent=a.sent + b.sent, failed=a.failed + b.failed,
    )  # fmt: skip
