"""The counters of one run and how each event changes them: a reducer over the run's events.

:class:`RunCounters` holds the counts (rows by status, calls, tokens, cost, spend by provider
and tool), the run's times and the providers its rows called, and :data:`APPLY` maps each kind
of event to the step that folds it in.  The fan-out (:mod:`playbook.runtime.state.fanout`)
applies that step before it hands the event to the views; the read API
(:mod:`playbook.runtime.state.reading`) derives what views show from these counters.  The three
are one class chain, not three objects, so an event costs no extra hop on its way through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from playbook.events import (
    CallFailed,
    CallFinished,
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
from playbook.runtime.state.legs import Legs
from playbook.runtime.state.timeline import Timeline
from playbook.runtime.state.upstream import ProviderView, provider_view
from playbook.store.spending import SpendLines

if TYPE_CHECKING:
    from playbook.providers.provider import Provider

__all__ = ["APPLY", "RunCounters"]

SAMPLE_EVERY = 0.25  # seconds between two looks of the timeline at the providers while calls go out


class RunCounters:
    """The counters of one run, changed by each event through :data:`APPLY`."""

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
        "waiting",
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
        "calls_unpriced",
        "reused_unpriced",
        "unpriced",
        "spend",
        "_memo_line",
        "started",
        "finished",
        "ran_before",
        "stopping",
        "stopped",
        "providers",
        "down_since",
        "waterfalls",
        "notices",
        "receipts_lost",
        "clock",
        "wall",
        "_asleep",
        "timeline",
        "_next_sample",
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
        self.total = 0
        self.ok = self.reused = self.failed = self.parked = self.skipped = 0  # rows by final status
        self.in_flight = self.waiting = 0
        self.sleeping = 0  # of the waiting rows, those in ctx.sleep
        # Paid calls (to a provider, over HTTP, or with a cost) apart from free local ones: "calls paid"
        # must be what the user is billed for, not every function that ran.
        self.calls_executed = self.calls_reused = self.calls_local = 0
        self.calls_shared = 0  # answered by a receipt this run paid for (identical calls of several rows)
        self.calls_failed = 0  # requests that brought back nothing to keep: the provider saw them too
        self.tokens = 0.0  # what the paid calls' answers counted (an LLM's usage)
        self.cost_spent = self.cost_saved = 0.0
        # of cost_spent, what bought nothing kept: calls of failed rows, refused answers
        self.cost_failed = 0.0
        # Calls whose model has no price, paid and reused: not in the sums above (never counted as 0),
        # and the tools they were of.
        self.calls_unpriced = self.reused_unpriced = 0
        self.unpriced: set[str] = set()
        # (provider, tool) -> [paid, cost, reused, saved, paid unpriced, reused unpriced]: store.spend()
        # gets it as the run ends
        self.spend = SpendLines()
        # its line of rows reused from memos ("play <name>"), once there is one
        self._memo_line: list[float] | None = None
        self.started: float | None = None
        self.finished: float | None = None
        self.ran_before = 0.0  # seconds spent in earlier executions of this run (a pilot's further rounds)
        self.stopping = False  # a stop was asked for: rows in flight are landing, the rest will be skipped
        self.stopped = False
        # the providers the run's rows called (read through provider_views)
        self.providers: dict[str, Provider] = {}
        self.down_since: dict[str, float] = {}  # provider -> epoch seconds it went down (this outage)
        self.waterfalls = Legs()
        self.notices: list[str] = []  # what the user must hear about the run as a whole
        self.receipts_lost = 0
        self.clock, self.wall = clock, wall  # the wall clock: down_since is said as a time of day
        self._asleep: set[int] = set()
        self.timeline = Timeline()  # each provider over the run, for its picture
        self._next_sample = 0.0  # clock time the timeline is due another look at the providers

    # -- how each event changes the counters -------------------------------------------

    def _row_finished(self, event: RowFinished) -> None:
        self.in_flight -= event.ran
        if event.held:
            self._awake(event.position)
        setattr(self, event.status, getattr(self, event.status) + event.copies)
        if event.calls:  # a reused row: every call it made is reused, once per key
            self._saved(event.calls, (event.cost,), event.unpriced)
        if event.cost_failed:
            self.cost_failed += event.cost_failed

    def rows_reused(self, rows: int, calls: int, costs: list[float], unpriced: int) -> None:
        """Rows settled by their memos, counted at once as their ``RowFinished`` events would be
        one by one, when no view listens to those (a million rows may come this way at once):
        ``rows`` with their copies; of the rows whose memo saved calls, those ``calls``, each
        row's cost in ``costs``, and of the calls, how many had no price (``unpriced``)."""
        self.reused += rows
        if calls:
            self._saved(calls, costs, unpriced)

    def _saved(self, calls: int, costs: Sequence[float], unpriced: int) -> None:
        """Calls that reused rows' memos saved (``costs``: the rows', added in their order)."""
        self.calls_reused += calls
        line = self._memo_line
        if line is None:
            line = self._memo_line = self.spend[None, "play " + self.play]
        line[2] += calls
        saved, line_saved = self.cost_saved, line[3]
        for cost in costs:
            saved += cost
            line_saved += cost
        self.cost_saved, line[3] = saved, line_saved
        if unpriced:
            self.reused_unpriced += unpriced
            line[5] += unpriced
            self.unpriced.add("play " + self.play)

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
            if event.unpriced:
                self.reused_unpriced += 1
                line[5] += 1
                self.unpriced.add(event.tool)
        else:
            self.calls_executed += 1
            self.cost_spent += event.cost
            self.tokens += event.tokens
            line[0] += 1
            line[1] += event.cost
            if event.unpriced:
                self.calls_unpriced += 1
                line[4] += 1
                self.unpriced.add(event.tool)
            if self.clock() >= self._next_sample:  # a few times a second while calls go out
                self.sample()

    def _call_failed(self, event: CallFailed) -> None:
        self.calls_failed += 1

    def _row_started(self, event: RowStarted) -> None:
        self.in_flight += 1

    def _row_deferred(self, event: RowDeferred) -> None:
        self.in_flight -= 1  # back among the rows not started: no provider holds it

    def _row_held(self, event: RowHeld) -> None:
        self.in_flight -= 1
        self.waiting += 1

    def _row_sleeping(self, event: RowSleeping) -> None:
        self.in_flight -= 1
        self.waiting += 1  # a sleeping row is waiting too, on no provider
        self.sleeping += 1
        self._asleep.add(event.position)

    def _row_resumed(self, event: RowResumed) -> None:
        self._awake(event.position)

    def _awake(self, position: int) -> None:
        self.waiting -= 1
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
            self.ran_before += self.finished - self.started
        self.started = self.clock()
        self.finished = None
        self.stopping = False
        self.sample()

    def _notice(self, event: RunNotice) -> None:
        self.notices.append(event.message)
        self.receipts_lost += event.lost

    def _down(self, event: ProviderDown) -> None:
        self.down_since.setdefault(event.provider, self.wall())  # a failed probe is the same outage
        self.sample()

    def _up(self, event: ProviderUp) -> None:
        self.down_since.pop(event.provider, None)
        self.sample()

    def _hold_changed(self, event: ProviderHoldSet | ProviderHoldLifted) -> None:
        self.sample()  # a hold's span starts or ends now

    def _run_finished(self, event: RunFinished) -> None:
        self.sample()
        self.finished = self.clock()
        self.stopped = event.stopped
        self.in_flight = self.waiting = self.sleeping = 0
        self._asleep.clear()

    # -- what changes the counters without an event ------------------------------------

    def sample(self) -> None:
        """Let the timeline look at the providers now: their calls, 429s, failures, rate and holds."""
        self._next_sample = self.clock() + SAMPLE_EVERY
        self.timeline.sample(self.wall(), self.provider_views())

    def provider_views(self) -> dict[str, ProviderView]:
        """Each provider the run's rows called, as it stands now."""
        return {name: provider_view(p) for name, p in self.providers.items()}

    def stop_requested(self) -> None:
        """The run was asked to stop (``run.stop()``, Ctrl-C, a fatal error)."""
        self.stopping = True

    def take_spend(self) -> SpendLines:
        """What the run paid and reused since it last said (per provider and tool), for ``store.spend()``."""
        lines, self.spend, self._memo_line = self.spend, SpendLines(), None
        return lines


APPLY: dict[type, Callable[[RunCounters, Any], None]] = {
    RowFinished: RunCounters._row_finished,
    CallFinished: RunCounters._call_finished,
    CallFailed: RunCounters._call_failed,
    RowStarted: RunCounters._row_started,
    RowHeld: RunCounters._row_held,
    RowDeferred: RunCounters._row_deferred,
    RowSleeping: RunCounters._row_sleeping,
    RowResumed: RunCounters._row_resumed,
    WaterfallFinished: RunCounters._waterfall,
    RowRequeued: RunCounters._requeued,
    RunStarted: RunCounters._run_started,
    RunCounted: lambda state, event: setattr(state, "total", state.total + event.rows),
    RunNotice: RunCounters._notice,
    ProviderDown: RunCounters._down,
    KeyRetired: lambda state, event: state.notices.append(event.said()),
    ProviderUp: RunCounters._up,
    ProviderHoldSet: RunCounters._hold_changed,
    ProviderHoldLifted: RunCounters._hold_changed,
    RunFinished: RunCounters._run_finished,
}
"""Each kind of event the counters hear, and the step that folds it in; other kinds only reach the views."""
