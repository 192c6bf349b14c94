"""RunState: the counters of one run, built from its events, and the fan-out to views."""

from __future__ import annotations

import time
from collections.abc import Callable

from typing import Any

from ..models import (
    CallFinished, Event, ProviderDown, ProviderUp, RowFinished, RowHeld, RowRequeued, RowResumed, RowStarted, RunFinished,
    RunNotice, RunStarted, RunStats, WaterfallFinished,
)  # fmt: skip

__all__ = ["LEG_COLUMNS", "RunState"]

Listener = Callable[[Event], None]
_LEG_COLUMN = {"hit": 1, "miss": 2, "unavailable": 3, "error": 4, "never": 5}
LEG_COLUMNS = ["waterfall", "leg", "tool", "hits", "misses", "unavailable", "errors", "never_reached"]


class RunState:
    """Applies each event to the counters, then hands it to every subscribed view."""

    __slots__ = (
        "play", "run_id", "total", "ok", "reused", "failed", "parked", "skipped", "in_flight", "held",
        "calls_executed", "calls_reused", "calls_local", "cost_spent", "cost_saved", "started", "finished",
        "stopped", "providers", "down_since", "waterfalls", "notices", "receipts_lost", "_clock", "_wall", "_listeners",
        "_by_kind", "_before",
    )  # fmt: skip

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.play = ""
        self.run_id = ""
        self.total = self.ok = self.reused = self.failed = self.parked = self.skipped = self.in_flight = self.held = 0
        # Paid calls (to a provider, over HTTP, or with a cost) apart from free local ones: "calls paid"
        # must be what the user is billed for, not every function that ran.
        self.calls_executed = self.calls_reused = self.calls_local = 0
        self.cost_spent = self.cost_saved = 0.0
        self.started: float | None = None
        self.finished: float | None = None
        self.stopped = False
        self._before = 0.0  # seconds spent in earlier executions (run.retry() executes again)
        self.providers: dict[str, Any] = {}  # name -> Provider, for views that show their state
        self.down_since: dict[str, float] = {}  # provider -> epoch seconds it went down (this outage)
        # waterfall key -> per leg [tool, hit, miss, unavailable, error, never]
        self.waterfalls: dict[str, list[list[Any]]] = {}
        self.notices: list[str] = []  # what the user must hear about the run as a whole
        self.receipts_lost = 0
        self._clock = clock
        self._wall = wall  # down_since is said as a time of day
        self._listeners: list[Listener] = []
        self._by_kind: dict[type, list[Listener]] = {}  # listeners that asked for some kinds only

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
        if kind is RowFinished:
            n = event.copies
            self.in_flight -= event.ran
            self.held -= event.held
            setattr(self, event.status, getattr(self, event.status) + n)
            if event.calls:  # a reused row: every call it made is reused, once per key
                self.calls_reused += event.calls
                self.cost_saved += event.cost
        elif kind is CallFinished:
            if event.reused:
                self.calls_reused += 1
                self.cost_saved += event.cost
            elif event.local:
                self.calls_local += 1
            else:
                self.calls_executed += 1
                self.cost_spent += event.cost
        elif kind is RowStarted:
            self.in_flight += 1
        elif kind is RowHeld:
            self.in_flight -= 1
            self.held += 1
        elif kind is RowResumed:
            self.held -= 1
        elif kind is WaterfallFinished:
            legs = self.waterfalls.get(event.key)
            if legs is None or [leg[0] for leg in legs] != list(event.tools):
                legs = self.waterfalls[event.key] = [[tool, 0, 0, 0, 0, 0] for tool in event.tools]
            for leg, outcome in zip(legs, event.outcomes):
                leg[_LEG_COLUMN[outcome]] += 1
        elif kind is RowRequeued:
            setattr(self, event.previous, getattr(self, event.previous) - event.copies)
        elif kind is RunStarted:
            self.play, self.run_id, self.total = event.play, event.run_id, event.total
            if self.started is not None and self.finished is not None:
                self._before += self.finished - self.started
            self.started = self._clock()
            self.finished = None
        elif kind is RunNotice:
            self.notices.append(event.message)
            self.receipts_lost += event.lost
        elif kind is ProviderDown:
            self.down_since.setdefault(event.provider, self._wall())  # a failed probe is the same outage
        elif kind is ProviderUp:
            self.down_since.pop(event.provider, None)
        elif kind is RunFinished:
            self.finished = self._clock()
            self.stopped = event.stopped
            self.in_flight = self.held = 0
        for listener in self._listeners:
            listener(event)
        for inner in self._by_kind.get(kind, ()):
            inner(event)

    def leg_rows(self) -> list[list[Any]]:
        """One row per waterfall leg, in ``LEG_COLUMNS`` order."""
        return [[key, i, *leg] for key, legs in self.waterfalls.items() for i, leg in enumerate(legs)]

    @property
    def done(self) -> int:
        """Rows that reached a final status."""
        return self.ok + self.reused + self.failed + self.parked + self.skipped

    @property
    def elapsed(self) -> float:
        """Seconds spent running (a retry adds its own time, not the pause before it)."""
        if self.started is None:
            return 0.0
        return self._before + (self.finished if self.finished is not None else self._clock()) - self.started

    def stats(self) -> RunStats:
        return RunStats(
            total=self.total,
            ok=self.ok,
            reused=self.reused,
            failed=self.failed,
            parked=self.parked,
            skipped=self.skipped,
            held=self.held,
            calls_executed=self.calls_executed,
            calls_reused=self.calls_reused,
            calls_local=self.calls_local,
            cost_spent=round(self.cost_spent, 9),
            cost_saved=round(self.cost_saved, 9),
            elapsed=round(self.elapsed, 6),
            receipts_lost=self.receipts_lost,
        )

    def __repr__(self) -> str:
        done = self.done
        return (
            f"<RunState {self.play!r} {done}/{self.total} ok={self.ok} reused={self.reused} "
            f"failed={self.failed} parked={self.parked} in_flight={self.in_flight} held={self.held}>"
        )
