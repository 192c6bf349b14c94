"""RunState: the read API views use, over the counters of one run and its fan-out to views.

What a view reads of a run: its counters and phase; its rows waiting, parked and failed; its
providers as snapshots, their holds and their history; its waterfalls' legs; its workers (a
cluster run's).  Views import this module's public names only: they never see the scheduler, its
queues or a provider object, so the runtime can change its insides without a view noticing.

:class:`RunState` is the last of one class chain: :class:`~playbook.runtime.state.reducer.RunCounters`
(the counters and how each event changes them), then
:class:`~playbook.runtime.state.fanout.RunFanout` (events counted, then handed to the views),
then the reads here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from playbook._internal.renamed import renamed
from playbook.events import Event
from playbook.records import ProviderWait, RunStats
from playbook.runtime.rows.grouping import Families
from playbook.runtime.rows.table import ERROR_COLUMNS, FailedRow, ParkedRow, Waiting, grouped
from playbook.runtime.state.fanout import Listener, RunFanout
from playbook.runtime.state.legs import LEG_COLUMNS
from playbook.runtime.state.timeline import ProviderSeries
from playbook.runtime.state.upstream import Budget, ProviderView, provider_view

if TYPE_CHECKING:
    from playbook.runtime.rows.table import RowTable

__all__ = [
    "ERROR_COLUMNS",
    "LEG_COLUMNS",
    "Budget",
    "FailedRow",
    "Families",
    "Listener",
    "ParkedRow",
    "ProviderSeries",
    "ProviderView",
    "RunState",
    "Waiting",
    "WorkerView",
    "grouped",
    "provider_view",
]


class WorkerView(NamedTuple):
    """One worker of a cluster run, as views show it."""

    worker: str  # its address
    running: int  # partitions it runs now
    finished: int  # partitions it finished
    done: int  # rows of its partitions that reached a final status
    rows: int  # rows of its partitions
    calls_executed: int
    in_flight: int  # rows in flight on it now


class RunState(RunFanout):
    """One run as views read it: counted from its events, which it hands on to every subscribed view."""

    __slots__ = ("_table", "_rows", "__weakref__")

    def __init__(
        self,
        *,
        play: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(play=play, clock=clock, wall=wall)
        self._table: RowTable | None = None
        self._rows: frozenset[int] | None = None  # the rows of the table this run ran (None: all of them)

    def attach(self, table: RowTable, rows: frozenset[int] | None = None) -> None:
        """The run's rows (``rows``: the positions a retry ran; ``None``: all), read by
        :meth:`failed_rows` and the like."""
        self._table = table
        self._rows = rows

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped

    @property
    def elapsed(self) -> float:
        """Seconds spent running (a pilot's further round adds its own time, not the pause before it)."""
        if self.started is None:
            return 0.0
        return self.ran_before + (self.finished if self.finished is not None else self.clock()) - self.started

    @property
    def running(self) -> bool:
        return self.started is not None and self.finished is None

    @property
    def phase(self) -> str:
        """``not started``, ``running``, ``stopping``, ``stopped`` or ``finished``."""
        if self.started is None:
            return "not started"
        if self.finished is None:
            return "stopping" if self.stopping else "running"
        return "stopped" if self.stopped else "finished"

    def label(self, position: int) -> Any:
        """The index label of the row at ``position`` (the position itself before rows are attached)."""
        return self._table.label(position) if self._table is not None else position

    def failed_rows(self) -> list[FailedRow]:
        """Failed rows, in order: (row label, position, error, group)."""
        return grouped(self._table.failed(self._rows)) if self._table is not None else []

    def parked_rows(self) -> list[ParkedRow]:
        """Parked rows, in order: (row label, position, reason, provider, ready_at, message)."""
        return self._table.parked(self._rows) if self._table is not None else []

    def waiting_rows(self) -> dict[int, Waiting]:
        """Rows off their workers now: position -> what they wait for (a provider, or a sleep)."""
        return self._table.held(self._rows) if self._table is not None else {}

    def can_retry(self, status: str) -> bool:
        """Would a retry of the rows left ``status`` ("failed", "parked") run any, whichever run
        over the frame left them?"""
        return self._table is not None and bool(self._table.settled_as((status,)))

    def holds(self) -> list[ProviderWait]:
        """Providers holding rows back: until when, how many rows wait (held or parked), last status;
        a provider that is down too (``reason="down"``, ``until`` its next probe, ``error`` why)."""
        now = self.wall()
        held = Counter(w.provider for w in self.waiting_rows().values() if w.kind == "provider")
        parked = Counter(r.provider for r in self.parked_rows() if r.provider)
        out = []
        for name, p in self.provider_views().items():
            if p.down:
                reason, until, error = "down", p.probe_at or None, p.down_error
            else:
                reason, until, error = "hold", p.hold_until_at if p.hold_until_at > now else None, None
            if held[name] or parked[name] or until is not None or reason == "down":
                rows = held[name] + parked[name]
                out.append(
                    ProviderWait(
                        provider=name,
                        until=until,
                        waiting_rows=rows,
                        parked_rows=parked[name],
                        last_status=p.last_status,
                        reason=reason,
                        error=error,
                    )
                )
        return out

    def history(self) -> list[ProviderSeries]:
        """Each provider over the run so far (calls accepted, 429s, failures, rate, holds), bounded
        whatever the run's length: what its picture draws."""
        if self.finished is None:
            self.sample()
        return self.timeline.series()

    def workers(self) -> list[WorkerView]:
        """The workers of a cluster run, by address; none for a run in this process."""
        return []

    def leg_rows(self) -> list[list[Any]]:
        """One row per waterfall leg, in ``LEG_COLUMNS`` order."""
        return self.waterfalls.rows()

    def stats(self) -> RunStats:
        return RunStats(
            total=self.total,
            ok=self.ok,
            reused=self.reused,
            failed=self.failed,
            parked=self.parked,
            skipped=self.skipped,
            waiting=self.waiting,
            calls_executed=self.calls_executed,
            calls_reused=self.calls_reused,
            calls_shared=self.calls_shared,
            calls_failed=self.calls_failed,
            calls_local=self.calls_local,
            tokens=round(self.tokens),
            cost_spent=round(self.cost_spent, 9),
            cost_saved=round(self.cost_saved, 9),
            cost_failed=round(self.cost_failed, 9),
            calls_unpriced=self.calls_unpriced,
            reused_unpriced=self.reused_unpriced,
            elapsed=round(self.elapsed, 6),
            receipts_lost=self.receipts_lost,
        )

    def __repr__(self) -> str:
        return (
            f"<RunState {self.play!r} {self.done}/{self.total} ok={self.ok} reused={self.reused} "
            f"failed={self.failed} parked={self.parked} in_flight={self.in_flight} waiting={self.waiting}>"
        )


def __getattr__(name: str) -> Any:
    if name == "RunEvent":  # one name for a run's events: playbook.events.Event
        renamed("playbook.runtime.state.reading.RunEvent", "playbook.events.Event")
        return Event
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
