"""The live state of a cluster job on the client: the partitions' reports, summed.

A :class:`ClusterState` is a :class:`~playbook.runtime.state.reading.RunState` whose counters are the
sums of each partition's latest report, whose rows held, parked and failed are those the reports
named, and whose providers are what the workers see (calls in flight and 429s summed over
workers; a hold or an outage if any worker has one).  It passes row events on to its views
(positions are job-wide), so the panel, the text bar and the summary show a cluster job as they
show a local one, plus a table of workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from playbook.cluster.wire import COUNTERS, decode_label
from playbook.events import (
    Event,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RowFinished,
    RowHeld,
    RowParked,
    RowRequeued,
    RowResumed,
    RowSleeping,
    RunFinished,
    RunNotice,
    RunProgress,
    RunStarted,
)
from playbook.runtime.rows.grouping import message_group
from playbook.runtime.state.reading import (
    Budget,
    FailedRow,
    ParkedRow,
    ProviderView,
    RunState,
    Waiting,
    WorkerView,
    grouped,
)

__all__ = ["ClusterState"]

_APPLIED = (RunStarted, RunFinished, RunNotice)  # the rest come summed in the reports
_PAID = (
    "calls_executed",
    "calls_failed",
    "cost_spent",
    "cost_failed",
    "receipts_lost",
    "calls_unpriced",
)  # what an attempt cut short still counts
_CALLS, _COST, _FAILED = (
    COUNTERS.index("calls_executed"),
    COUNTERS.index("cost_spent"),
    COUNTERS.index("calls_failed"),
)
_ROWS = tuple(COUNTERS.index(name) for name in ("ok", "reused", "failed", "parked", "skipped"))


class _Partition:
    __slots__ = ("attempt", "base", "counts", "final", "positions", "worker", "legs", "others", "rows")

    def __init__(self) -> None:
        self.attempt = ""
        self.worker = ""
        self.counts: list[float] = [0] * len(COUNTERS)
        self.base: list[float] = [0] * len(COUNTERS)  # what attempts cut short counted (their worker died)
        self.final = False
        self.positions: set[int] = set()  # job-wide positions it reported rows for
        # its waterfalls' legs, as its latest report counts them (LEG_COLUMNS)
        self.legs: list[list[Any]] = []
        # a retry: its rows not run again, by status (COUNTERS' index): not this run's
        self.others: dict[int, int] = {}
        # its rows by status (COUNTERS' index), as its result has them
        self.rows: dict[int, int] | None = None

    def now(self) -> list[float]:
        """Its counters: the latest report's over its base, its rows as its result has them once built
        (less those a retry did not run)."""
        counts = [value + base for value, base in zip(self.counts, self.base)]
        if self.rows is not None:
            for i in _ROWS:
                counts[i] = self.rows.get(i, 0) - self.others.get(i, 0)
        return counts


class ClusterState(RunState):
    """A cluster job's counters and rows, from its partitions' reports."""

    __slots__ = (
        "_failed",
        "_held",
        "_labels",
        "_parked",
        "_parts",
        "_views",
        "_worker_views",
        "before",
        "paid_by",
        "ran",
        "_told",
    )

    def __init__(
        self,
        *,
        play: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        before: ClusterState | None = None,
    ) -> None:
        super().__init__(play=play, clock=clock, wall=wall)
        self.before = before  # a retry's: the state of the run it retried
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
        self.ran: frozenset[int] | None = None  # a retry: the job-wide positions it runs (None: every row)
        # Each provider as its views were last told: (held, until, down).  The holds and outages
        # are the workers', seen in their reports: told as a local run's providers tell theirs.
        self._told: dict[str, tuple[bool, float, bool]] = {}

    def emit(self, event: Event) -> None:
        if type(event) in _APPLIED:
            super().emit(event)
        else:
            self.tell(event)

    # -- reports -----------------------------------------------------------------------

    def expect(self, part: int, others: dict[str, int] | None = None) -> None:
        """Partition ``part`` is submitted; ``others``: a retry's, its rows not run again by status
        (its result has them, this run does not count them)."""
        entry = self._parts[part] = _Partition()
        entry.others = {COUNTERS.index(status): n for status, n in (others or {}).items()}

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
        found = self._parts.get(part)
        if found is None:  # a partition a retry did not run: its rows are the runs' before
            return
        found.rows = {COUNTERS.index(status): n for status, n in statuses.items()}
        self._summed()

    def _summed(self) -> None:
        for name, total in zip(COUNTERS[1:], self._sums()[1:]):  # total is the job's, set when it starts
            setattr(self, name, total)
        self.sample()  # the providers as the workers report them, a few times a second
        self._tell_providers()
        self.emit(RunProgress(self.done))

    def _tell_providers(self) -> None:
        """A hold or an outage that a worker's report shows, or no longer shows: told to the views
        as a provider in this process tells its own (``ProviderHoldSet``...)."""
        for name, view in self.provider_views().items():
            held, until, down = before = self._told.get(name, (False, 0.0, False))
            now = (view.held, view.hold_until_at if view.held else 0.0, view.down)
            if now == before:
                continue
            self._told[name] = now
            if view.held and (not held or view.hold_until_at != until):
                self.tell(ProviderHoldSet(name, view.hold_until_at, view.last_status))
            elif held and not view.held:
                self.tell(ProviderHoldLifted(name))
            if view.down and not down:
                self.tell(ProviderDown(name, view.down_error or "down"))
            elif down and not view.down:
                self.tell(ProviderUp(name))

    def _report(self, report: dict[str, Any]) -> None:
        part = self._parts.setdefault(report["part"], _Partition())
        if report["attempt"] != part.attempt:
            if part.final:
                return  # a late word from an attempt Dask already replaced
            if part.attempt:
                # run again elsewhere (its worker died): forget what the old attempt said of its rows
                for position in part.positions:
                    self._forget(position)
                part.positions.clear()
                self._cut_short(part)
            part.attempt = report["attempt"]
        part.worker = report["worker"]
        part.counts = report["counts"]
        part.legs = report.get("waterfalls", [])
        part.final = report["final"]
        self._views[report["worker"]] = {view[0]: _view(view) for view in report["providers"]}
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
                self._parked[position] = ParkedRow(
                    self._labels[position], position, reason, provider, ready, error
                )
                self.emit(RowParked(position, reason, provider, ready))
            else:
                group = group or message_group(error or "")
                self._failed[position] = FailedRow(self._labels[position], position, error or "", group, cost)
            self.emit(
                RowFinished(
                    position, status, error, copies, held=was_held is not None, group=group, cost_failed=cost
                )
            )
        elif held is not None:
            kind, provider, until, status = held
            self._held[position] = Waiting(kind, provider)
            self.emit(
                RowSleeping(position, until)
                if kind == "sleep"
                else RowHeld(position, provider, until, status)
            )
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
        return [
            round(value, 9) if name.startswith("cost") else int(value) for name, value in zip(COUNTERS, sums)
        ]

    def standing(
        self, statuses: tuple[str, ...], offsets: list[int], lengths: list[int]
    ) -> dict[int, dict[int, str]]:
        """The rows whose latest outcome, over this run and those it retried, is one of
        ``statuses``: partition -> position in it -> that status."""
        found = self._latest(statuses)
        todo: dict[int, dict[int, str]] = {}
        for part, (offset, length) in enumerate(zip(offsets, lengths)):
            rows_in = {
                p - offset: status for p, status in sorted(found.items()) if offset <= p < offset + length
            }
            if rows_in:
                todo[part] = rows_in
        return todo

    def can_retry(self, status: str) -> bool:
        return bool(self._latest((status,)))

    def _latest(self, statuses: tuple[str, ...]) -> dict[int, str]:
        """Job-wide position -> status, of the rows this run and those it retried left ``statuses``."""
        found: dict[int, str] = {}
        seen: set[int] = set()
        state: ClusterState | None = self
        while state is not None:
            for status in statuses:
                rows = state._failed if status == "failed" else state._parked
                found.update((p, status) for p in rows if p not in seen)
            if state.ran is None:  # a first run: it ran every row
                break
            seen |= state.ran
            state = state.before
        return found

    # -- the read API views use --------------------------------------------------------

    def label(self, position: int) -> Any:
        return self._labels.get(position, position)

    def failed_rows(self) -> list[FailedRow]:
        return grouped([self._failed[p] for p in sorted(self._failed)])

    def parked_rows(self) -> list[ParkedRow]:
        return [self._parked[p] for p in sorted(self._parked)]

    def waiting_rows(self) -> dict[int, Waiting]:
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
        return _summed([part.legs for part in self._parts.values()])

    def workers(self) -> list[WorkerView]:
        by: dict[str, list[int]] = {}
        for part in self._parts.values():
            if not part.worker:
                continue
            row = by.setdefault(part.worker, [0, 0, 0, 0, 0, 0])
            counts = dict(zip(COUNTERS, part.now()))
            row[0 if not part.final else 1] += 1
            row[2] += int(
                counts["ok"] + counts["reused"] + counts["failed"] + counts["parked"] + counts["skipped"]
            )
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


def _view(raw: Sequence[Any]) -> ProviderView:
    """A provider's view as a worker's report carries it (JSON: its tuples arrive as lists)."""
    view = ProviderView(*raw)
    window = (int(view.window[0]), float(view.window[1])) if view.window is not None else None
    return view._replace(
        keys=tuple(_view(key) for key in view.keys),
        window=window,
        budgets=tuple(Budget(*budget) for budget in view.budgets),
    )


def _merge(a: ProviderView, b: ProviderView) -> ProviderView:
    return ProviderView(
        name=a.name,
        down=a.down or b.down,
        down_error=a.down_error or b.down_error,
        probe_at=max(a.probe_at, b.probe_at),
        held=a.held or b.held,
        hold_until_at=max(a.hold_until_at, b.hold_until_at),
        last_status=b.last_status or a.last_status,
        rate=b.rate if b.rate is not None else a.rate,
        in_flight_limit=b.in_flight_limit or a.in_flight_limit,
        in_flight=a.in_flight + b.in_flight,
        refused=a.refused + b.refused,
        tokens=a.tokens + b.tokens,
        tpm=b.tpm or a.tpm,
        sent=a.sent + b.sent,
        failed=a.failed + b.failed,
        budgets=_budgets(a.budgets, b.budgets),
    )


def _budgets(a: tuple[Budget, ...], b: tuple[Budget, ...]) -> tuple[Budget, ...]:
    """Two workers' budgets of one account: the use summed, the limit (the account's) as either says."""
    limits = {x.name: x.limit for x in (*a, *b) if x.limit is not None}
    used: dict[str, float] = {}
    for x in (*a, *b):
        used[x.name] = used.get(x.name, 0.0) + x.used
    return tuple(Budget(name, n, limits.get(name)) for name, n in used.items())
