"""RunState: the counters of one run, built from its events, the fan-out to views, and the
read API views use (rows held, parked and failed; providers as snapshots; holds).

Views import this module's public names only: they never see the scheduler, its queues or a
provider object, so the runtime can change its insides without a view noticing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from playbook._internal.renamed import renamed
from playbook.events import (
    CallFailed,
    CallFinished,
    Event,
    KeyRetired,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RowDeferred,
    RowFinished,
    RowHeld,
    RowRequeued,
    RowResumed,
    RowSleeping,
    RowStarted,
    RunCounted,
    RunFinished,
    RunNotice,
    RunStarted,
    WaterfallFinished,
)
from playbook.records import ProviderWait, RunStats
from playbook.runtime.rows.grouping import Families
from playbook.runtime.rows.table import ERROR_COLUMNS, FailedRow, ParkedRow, Waiting, grouped
from playbook.runtime.state.legs import LEG_COLUMNS, Legs
from playbook.runtime.state.timeline import ProviderSeries, Timeline
from playbook.runtime.state.upstream import ProviderView, provider_view
from playbook.store.spending import SpendLines

if TYPE_CHECKING:
    from playbook.providers.provider import Provider
    from playbook.runtime.rows.table import RowTable

__all__ = [
    "ERROR_COLUMNS",
    "LEG_COLUMNS",
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

Listener = Callable[[Event], None]
SAMPLE_EVERY = 0.25  # seconds between two looks of the timeline at the providers while calls go out


class WorkerView(NamedTuple):
    """One worker of a cluster run, as views show it."""

    worker: str  # its address
    running: int  # partitions it runs now
    finished: int  # partitions it finished
    done: int  # rows of its partitions that reached a final status
    rows: int  # rows of its partitions
    calls_executed: int
    in_flight: int  # rows in flight on it now


class RunState:
    """Applies each event to the counters, then hands it to every subscribed view."""

    __slots__ = (
        "play",
        "run_id",
        "total",
        "ok",
        "reused",
        "failed",
        "parked",
        "skipped",
        "in_flight",
        "held",
        "sleeping",
        "calls_executed",
        "calls_reused",
        "calls_shared",
        "calls_failed",
        "calls_local",
        "tokens",
        "cost_spent",
        "cost_saved",
        "cost_failed",
        "spend",
        "_memo_line",
        "started",
        "finished",
        "stopping",
        "stopped",
        "providers",
        "down_since",
        "waterfalls",
        "notices",
        "receipts_lost",
        "_clock",
        "_wall",
        "_listeners",
        "_by_kind",
        "_before",
        "_table",
        "_rows",
        "_asleep",
        "timeline",
        "_next_sample",
        "__weakref__",
    )

    def __init__(
        self,
        *,
        play: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.play = play
        self.run_id = ""
        self.total = self.ok = self.reused = self.failed = self.parked = self.skipped = self.in_flight = (
            self.held
        ) = 0
        self.sleeping = 0  # of the held rows, those in ctx.sleep
        # Paid calls (to a provider, over HTTP, or with a cost) apart from free local ones: "calls paid"
        # must be what the user is billed for, not every function that ran.
        self.calls_executed = self.calls_reused = self.calls_local = 0
        self.calls_shared = 0  # answered by a receipt this run paid for (identical calls of several rows)
        self.calls_failed = 0  # requests that brought back nothing to keep: the provider saw them too
        self.tokens = 0.0  # what the paid calls' answers counted (an LLM's usage)
        self.cost_spent = self.cost_saved = 0.0
        self.cost_failed = (
            0.0  # of cost_spent, what bought nothing kept: calls of failed rows, refused answers
        )
        self.spend = (
            SpendLines()
        )  # (provider, tool) -> [paid, cost, reused, saved]: store.spend() gets it as the run ends
        self._memo_line: list[float] | None = (
            None  # its line of rows reused from memos ("play <name>"), once there is one
        )
        self.started: float | None = None
        self.finished: float | None = None
        self.stopping = False  # a stop was asked for: rows in flight are landing, the rest will be skipped
        self.stopped = False
        self._before = 0.0  # seconds spent in earlier executions of this run (a pilot's further rounds)
        self.providers: dict[
            str, Provider
        ] = {}  # the providers the run's rows called (read through provider_views)
        self.down_since: dict[str, float] = {}  # provider -> epoch seconds it went down (this outage)
        self.waterfalls = Legs()
        self.notices: list[str] = []  # what the user must hear about the run as a whole
        self.receipts_lost = 0
        self._clock, self._wall = clock, wall  # the wall clock: down_since is said as a time of day
        self._listeners: list[Listener] = []
        self._by_kind: dict[type, list[Listener]] = {}  # listeners that asked for some kinds only
        self._table: RowTable | None = None
        self._rows: frozenset[int] | None = None  # the rows of the table this run ran (None: all of them)
        self._asleep: set[int] = set()
        self.timeline = Timeline()  # each provider over the run, for its picture
        self._next_sample = 0.0  # clock time the timeline is due another look at the providers

    def attach(self, table: RowTable, rows: frozenset[int] | None = None) -> None:
        """The run's rows (``rows``: the positions a retry ran; ``None``: all), read by :meth:`failed_rows` and the like."""
        self._table = table
        self._rows = rows

    def subscribe(self, listener: Listener, kinds: tuple[type, ...] | None = None) -> Callable[[], None]:
        """Call ``listener(event)`` for every event from now on (or only those of ``kinds``: a view
        that redraws on a timer need not pay a call per row); returns an unsubscribe function."""
        if kinds is not None:
            for kind in kinds:
                self._by_kind.setdefault(kind, []).append(listener)

            def unsubscribe() -> None:
                for kind in kinds:
                    self._by_kind[kind].remove(listener)

            return unsubscribe
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def emit(self, event: Event) -> None:
        kind = type(event)
        apply = _APPLY.get(kind)
        if apply is not None:
            apply(self, event)
        for listener in self._listeners:  # as tell() does, inline: this runs for every event of every row
            listener(event)
        for inner in self._by_kind.get(kind, ()):
            inner(event)

    def tell(self, event: Event) -> None:
        """Hand ``event`` to the views without counting it (a cluster job's counters come summed)."""
        for listener in self._listeners:
            listener(event)
        for inner in self._by_kind.get(type(event), ()):
            inner(event)

    # -- how each event changes the counters -------------------------------------------

    def _row_finished(self, event: RowFinished) -> None:
        self.in_flight -= event.ran
        if event.held:
            self._awake(event.position)
        setattr(self, event.status, getattr(self, event.status) + event.copies)
        if event.calls:  # a reused row: every call it made is reused, once per key
            self.calls_reused += event.calls
            self.cost_saved += event.cost
            line = self._memo_line
            if line is None:
                line = self._memo_line = self.spend[None, "play " + self.play]
            line[2] += event.calls
            line[3] += event.cost
        if event.cost_failed:
            self.cost_failed += event.cost_failed

    def _call_finished(self, event: CallFinished) -> None:
        if event.local:
            self.calls_local += 1
            return
        line = self.spend[event.provider, event.tool]
        if event.reused:
            if event.shared:
                self.calls_shared += 1
            else:
                self.calls_reused += 1
            self.cost_saved += event.cost
            line[2] += 1
            line[3] += event.cost
        else:
            self.calls_executed += 1
            self.cost_spent += event.cost
            self.tokens += event.tokens
            line[0] += 1
            line[1] += event.cost
            if self._clock() >= self._next_sample:  # a few times a second while calls go out
                self.sample()

    def _call_failed(self, event: CallFailed) -> None:
        self.calls_failed += 1

    def _row_started(self, event: RowStarted) -> None:
        self.in_flight += 1

    def _row_deferred(self, event: RowDeferred) -> None:
        self.in_flight -= 1  # back among the rows not started: no provider holds it

    def _row_held(self, event: RowHeld) -> None:
        self.in_flight -= 1
        self.held += 1

    def _row_sleeping(self, event: RowSleeping) -> None:
        self.in_flight -= 1
        self.held += 1  # a sleeping row is held too, by no provider
        self.sleeping += 1
        self._asleep.add(event.position)

    def _row_resumed(self, event: RowResumed) -> None:
        self._awake(event.position)

    def _awake(self, position: int) -> None:
        self.held -= 1
        if position in self._asleep:
            self._asleep.discard(position)
            self.sleeping -= 1

    def _waterfall(self, event: WaterfallFinished) -> None:
        self.waterfalls.count(event)

    def _requeued(self, event: RowRequeued) -> None:
        setattr(self, event.previous, getattr(self, event.previous) - event.copies)

    def _run_started(self, event: RunStarted) -> None:
        self.play, self.run_id, self.total = event.play, event.run_id, self.total + event.total
        if self.started is not None and self.finished is not None:
            self._before += self.finished - self.started
        self.started = self._clock()
        self.finished = None
        self.stopping = False
        self.sample()

    def _notice(self, event: RunNotice) -> None:
        self.notices.append(event.message)
        self.receipts_lost += event.lost

    def _down(self, event: ProviderDown) -> None:
        self.down_since.setdefault(event.provider, self._wall())  # a failed probe is the same outage
        self.sample()

    def _up(self, event: ProviderUp) -> None:
        self.down_since.pop(event.provider, None)
        self.sample()

    def _hold_changed(self, event: ProviderHoldSet | ProviderHoldLifted) -> None:
        self.sample()  # a hold's span starts or ends now

    def _run_finished(self, event: RunFinished) -> None:
        self.sample()
        self.finished = self._clock()
        self.stopped = event.stopped
        self.in_flight = self.held = self.sleeping = 0
        self._asleep.clear()

    def sample(self) -> None:
        """Let the timeline look at the providers now: their calls, 429s, failures, rate and holds."""
        self._next_sample = self._clock() + SAMPLE_EVERY
        self.timeline.sample(self._wall(), self.provider_views())

    def stop_requested(self) -> None:
        """The run was asked to stop (``run.stop()``, Ctrl-C, a fatal error)."""
        self.stopping = True

    # -- the read API views use --------------------------------------------------------

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped

    @property
    def elapsed(self) -> float:
        """Seconds spent running (a pilot's further round adds its own time, not the pause before it)."""
        if self.started is None:
            return 0.0
        return self._before + (self.finished if self.finished is not None else self._clock()) - self.started

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

    @property
    def waiting(self) -> int:
        """Rows stepped aside now (RunStats' word): waiting for a provider, or in ctx.sleep."""
        return self.held

    def held_rows(self) -> dict[int, Waiting]:
        """Rows off their workers now: position -> what they wait for (a provider, or a sleep)."""
        return self._table.held(self._rows) if self._table is not None else {}

    def can_retry(self, status: str) -> bool:
        """Would a retry of the rows left ``status`` ("failed", "parked") run any, whichever run over the frame left them?"""
        return self._table is not None and bool(self._table.settled_as((status,)))

    def provider_views(self) -> dict[str, ProviderView]:
        """Each provider the run's rows called, as it stands now."""
        return {name: provider_view(p) for name, p in self.providers.items()}

    def holds(self) -> list[ProviderWait]:
        """Providers holding rows back: until when, how many rows wait (held or parked), last status;
        a provider that is down too (``reason="down"``, ``until`` its next probe, ``error`` why)."""
        now = self._wall()
        held = Counter(w.provider for w in self.held_rows().values() if w.kind == "provider")
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

    def take_spend(self) -> SpendLines:
        """What the run paid and reused since it last said (per provider and tool), for ``store.spend()``."""
        lines, self.spend, self._memo_line = self.spend, SpendLines(), None
        return lines

    def stats(self) -> RunStats:
        return RunStats(
            total=self.total,
            ok=self.ok,
            reused=self.reused,
            failed=self.failed,
            parked=self.parked,
            skipped=self.skipped,
            waiting=self.held,
            calls_executed=self.calls_executed,
            calls_reused=self.calls_reused,
            calls_shared=self.calls_shared,
            calls_failed=self.calls_failed,
            calls_local=self.calls_local,
            tokens=round(self.tokens),
            cost_spent=round(self.cost_spent, 9),
            cost_saved=round(self.cost_saved, 9),
            cost_failed=round(self.cost_failed, 9),
            elapsed=round(self.elapsed, 6),
            receipts_lost=self.receipts_lost,
        )

    def __repr__(self) -> str:
        return (
            f"<RunState {self.play!r} {self.done}/{self.total} ok={self.ok} reused={self.reused} "
            f"failed={self.failed} parked={self.parked} in_flight={self.in_flight} held={self.held}>"
        )


_APPLY: dict[type, Callable[[RunState, Any], None]] = {
    RowFinished: RunState._row_finished,
    CallFinished: RunState._call_finished,
    CallFailed: RunState._call_failed,
    RowStarted: RunState._row_started,
    RowHeld: RunState._row_held,
    RowDeferred: RunState._row_deferred,
    RowSleeping: RunState._row_sleeping,
    RowResumed: RunState._row_resumed,
    WaterfallFinished: RunState._waterfall,
    RowRequeued: RunState._requeued,
    RunStarted: RunState._run_started,
    RunCounted: lambda state, event: setattr(state, "total", state.total + event.rows),
    RunNotice: RunState._notice,
    ProviderDown: RunState._down,
    KeyRetired: lambda state, event: state.notices.append(event.said()),
    ProviderUp: RunState._up,
    ProviderHoldSet: RunState._hold_changed,
    ProviderHoldLifted: RunState._hold_changed,
    RunFinished: RunState._run_finished,
}


def __getattr__(name: str) -> Any:
    if name == "RunEvent":  # one name for a run's events: playbook.events.Event
        renamed("playbook.runtime.state.run_state.RunEvent", "playbook.events.Event")
        return Event
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
