"""Text progress on stderr, for terminals, scripts and CI logs.

On a terminal, a tqdm bar as wide as the window, following it when the window is resized. tqdm
cuts a line that is too long at its end, so what holds rows back (held and parked rows, the
providers that hold calls or are down) comes first, right after the play's name, shortened until
it fits; the counters come last, and give way (shorter, then none) before the bar would shrink
under ``MIN_BAR`` cells.  Written to a file or a CI log, where carriage returns pile up into one
endless line, it writes a plain line of progress when the run starts and then at most every
``LOG_EVERY`` seconds, ``$COLUMNS`` (else ``LOG_WIDTH``) wide.  A provider going down or coming
back also gets a line of its own, and the summary printed at the end has one line per provider
that holds rows, is down or has parked rows, and one per group of failed rows (one bug in one
line of the play is one group).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from playbook._internal.words import money, time_of_day, tokens
from playbook.events import (
    Event,
    KeyRetired,
    ProviderDown,
    ProviderHoldLifted,
    ProviderHoldSet,
    ProviderUp,
    RowFinished,
    RowHeld,
    RowRequeued,
    RowSleeping,
    RunFinished,
    RunProgress,
    RunStarted,
)
from playbook.runtime.state.reading import RunState
from playbook.ui.html import budgets_said, in_words, priced
from playbook.ui.tally import KINDS as TALLY_KINDS
from playbook.ui.tally import Tally

__all__ = [
    "GROUPS_SHOWN",
    "LOG_EVERY",
    "LOG_WIDTH",
    "MIN_BAR",
    "TextView",
    "error_lines",
    "summary",
    "waiting_line",
]

_INTERVAL = 0.1  # at most 10 refreshes a second
_HEARTBEAT = 1.0  # and at least one a second while the run goes: a hold's countdown and the clock move
LOG_WIDTH = 100  # columns of the bar when stderr is not a terminal and $COLUMNS is not set
MIN_BAR = 10  # cells the bar keeps: the counters give way first
_WIDE = 100  # columns from which the bar also shows the times and the rate
_NARROW = "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"  # tqdm's line without "[00:03<00:04, 5.1row/s]"
LOG_EVERY = 5.0  # seconds between two lines of progress in a log (tqdm writes to a file every 10)
GROUPS_SHOWN = 5  # groups of failed rows the summary lists
_KINDS = (
    RunStarted,
    RunFinished,
    ProviderHoldSet,
    ProviderHoldLifted,
    ProviderDown,
    ProviderUp,
    RowFinished,
    RowRequeued,
    RowHeld,
    RowSleeping,
    RunProgress,
    KeyRetired,
)


class TextView:
    """A progress bar with the run's counters, refreshed at most 10 times a second."""

    def __init__(
        self, state: RunState, *, file: Any = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._state = state
        self._file = file if file is not None else sys.stderr
        self._clock = clock
        self._bar: tqdm | None = None
        self._terminal = _is_terminal(self._file)
        self._last = 0.0
        self._logged: float | None = None  # when a log's last line of progress was written
        self._logged_done = 0  # and how many rows were done then: the rate is over the time between two lines
        self._timer: asyncio.TimerHandle | None = None  # the next redraw that no event may bring
        self._unsubscribe: list[Callable[[], None]] = []
        self.follow(state)

    def follow(self, state: RunState) -> None:
        """Show ``state`` from now on (a retry's run, with its own counters) in place of the one before."""
        for undo in self._unsubscribe:
            undo()
        self._state = state
        self._down: set[str] = set()  # providers whose going down this view has written
        self.tally = Tally(state.label)  # "e.g. row 12": the index label, as run.errors gives it
        # The tally first: a refresh on the same event must see it counted.
        self._unsubscribe = [
            state.subscribe(self.tally.on_event, kinds=TALLY_KINDS, every_row=False),
            state.subscribe(self.on_event, kinds=_KINDS),
        ]

    def unsubscribe(self) -> None:
        """Stop following the run; a bar still drawn is closed where it stands."""
        for undo in self._unsubscribe:
            undo()
        self._unsubscribe = []
        self._disarm()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_event(self, event: Event) -> None:
        kind = type(event)
        if (
            kind is RowFinished
            or kind is RowRequeued
            or kind is RowHeld
            or kind is RowSleeping
            or kind is RunProgress
        ):
            if self._clock() - self._last >= _INTERVAL:
                self._refresh()
            else:  # not now, but soon: the last events of a burst must not wait for the next one
                self._arm(_INTERVAL)
        elif isinstance(event, RunStarted):
            if self._bar is None and self._terminal:
                self._bar = tqdm(
                    total=event.total,
                    desc=event.play,
                    unit="row",
                    file=self._file,
                    leave=True,
                    dynamic_ncols=True,
                )
            self._logged = None  # a log says where a run (or a retry) starts
            self._refresh()
        elif kind is ProviderHoldSet or kind is ProviderHoldLifted:
            self._refresh()
        elif isinstance(event, (ProviderDown, ProviderUp)):
            self._say(event)
            self._refresh()
        elif kind is KeyRetired:
            self._line(event.said())  # type: ignore[union-attr]
        elif kind is RunFinished:
            self._refresh()
            self._disarm()
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            print(summary(self._state, self.tally), file=self._file, flush=True)

    def _columns(self) -> int | None:
        """The terminal's width now, as tqdm measures it for this redraw (it leaves the last column free)."""
        try:
            return os.get_terminal_size(self._file.fileno()).columns - 1
        except (AttributeError, ValueError, OSError):
            return None

    def _say(self, event: ProviderDown | ProviderUp) -> None:
        """A line of its own when a provider goes down or comes back: a log keeps when and why."""
        name = event.provider
        if isinstance(event, ProviderDown):
            if name in self._down:  # a failed probe: the same outage
                return
            self._down.add(name)
            provider = self._state.provider_views().get(name)
            probe = (
                f"; next probe at {time_of_day(provider.probe_at)}"
                if provider is not None and provider.probe_at
                else ""
            )
            line = f"provider {name!r} is down: {in_words(event.error)}; its rows wait for it up to max_wait, then park{probe}"
        elif name in self._down:
            self._down.discard(name)
            line = f"provider {name!r} is up again"
        else:
            return
        self._line(line)

    def _line(self, line: str) -> None:
        """A line of its own, above the bar."""
        if self._bar is not None:
            tqdm.write(line, file=self._file)
        else:
            print(line, file=self._file, flush=True)

    def _arm(self, delay: float) -> None:
        """Redraw in ``delay`` seconds, unless a redraw is due sooner already."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven from outside an event loop: events alone redraw
            return
        if self._timer is not None:
            if self._timer.when() <= loop.time() + delay:
                return
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._tick)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        self._refresh()

    def _refresh(self) -> None:
        bar, s = self._bar, self._state
        if bar is None and (self._terminal or s.started is None or s.finished is not None):
            return
        self._last = self._clock()
        self._disarm()
        self._arm(_HEARTBEAT)
        if bar is None:
            self._log()
            return
        bar.n = s.done
        columns = self._columns()
        # A narrow window keeps the count and drops the times and the rate: the bar keeps its cells.
        bar.bar_format = _NARROW if columns is not None and columns < _WIDE else None
        bar.set_description_str(s.play, refresh=False)
        bar.set_postfix_str("", refresh=False)
        # What the line holds besides the bar: the name, "45%|", "| 17/40 [00:03<00:04, 5.1row/s]".
        room = None if columns is None else columns - _meter(bar) - MIN_BAR - 3  # " [", "]"
        alerts = waiting_line(s, self.tally, room)
        bar.set_description_str(f"{s.play} [{alerts}]" if alerts else s.play, refresh=False)
        for counters in _counters(s):  # the longest that leaves the bar its cells
            bar.set_postfix_str(counters, refresh=False)
            if columns is None or columns - _meter(bar) >= MIN_BAR:
                break
        bar.refresh()

    def _log(self) -> None:
        """A line of progress in a log, at most every ``LOG_EVERY`` seconds (the first at once)."""
        now = self._clock()
        if self._logged is not None and now - self._logged < LOG_EVERY:
            return
        s, columns = self._state, _log_width()
        # The rate over the time since the previous line, as tqdm's is over its last updates: no
        # rate (and no ETA) at a run's first line, nor while no row is done (a hold's silence).
        rate = (
            (s.done - self._logged_done) / (now - self._logged)
            if self._logged is not None and now > self._logged
            else 0.0
        )
        self._logged, self._logged_done = now, s.done
        count = f"{s.done:,}/{s.total:,} rows" + (f" ({100 * s.done // s.total}%)" if s.total else "")
        timed = f"{count} {_pace(s.elapsed, s.total - s.done, rate)}"
        bare = f"{s.done:,}/{s.total:,} rows"
        # What holds rows back comes first, then the count: the times give way, then the percentage.
        for done in (timed, count, bare):
            alerts = waiting_line(s, self.tally, columns - len(s.play) - len(done) - 5)
            line = f"{s.play} [{alerts}]: {done}" if alerts else f"{s.play}: {done}"
            if len(line) <= columns:
                break
        counters = next((c for c in _counters(s) if len(line) + 3 + len(c) <= columns), "")
        print(f"{line} | {counters}" if counters else line, file=self._file, flush=True)


_WHY_PARKED = {
    "budget": "the budget ran out",
    "store": "the receipt store refused writes (nothing it could not record was paid for)",
}


def _pace(elapsed: float, left: int, rate: float) -> str:
    """tqdm's "[elapsed<remaining, rate]" for a line of a log: ``[00:05<00:11, 3.2 rows/s]``;
    ``[00:00<?, ? rows/s]`` until a row is done.  A slow run says seconds per row (``12.5s/row``)."""
    if not rate > 0:
        return f"[{tqdm.format_interval(elapsed)}<?, ? rows/s]"
    per = f"{rate:.3g} rows/s" if rate >= 1 else f"{1 / rate:.3g}s/row"
    return f"[{tqdm.format_interval(elapsed)}<{tqdm.format_interval(max(left, 0) / rate)}, {per}]"


def waiting_line(s: RunState, tally: Tally, room: int | None = None) -> str:
    """What holds rows back, in at most ``room`` characters when it can: waiting and parked rows, then
    each provider that is down, holds calls or has parked rows, with details while they fit."""
    counts = " ".join(f"{name}={n}" for name, n in (("waiting", s.waiting), ("parked", s.parked)) if n)
    waiting = tally.waiting()
    full, short = [], []
    down = held = 0
    for name, p in s.provider_views().items():
        rows = waiting.get(name, 0)
        if p.down:
            down += 1
            probe = f", probe {time_of_day(p.probe_at)}" if p.probe_at else ""
            full.append(f"{name} down ({_rows(rows)}{probe})")
            short.append(f"{name} down")
        elif p.held:
            held += 1
            full.append(f"{name} held until {time_of_day(p.hold_until_at)} ({_rows(rows)})")
            short.append(f"{name} held")
        elif rows:
            full.append(f"{name}: {_rows(rows)} waiting")
    least = [f"{down} down"] * bool(down) + [f"{held} held"] * bool(held)
    lines = [" | ".join(filter(None, [counts, *parts])) for parts in (full, short, [", ".join(least)])]
    for line in lines:
        if room is None or len(line) <= room:
            return line
    return lines[-1]


def summary(state: RunState, tally: Tally) -> str:
    """What the run did and what it cost, on one line; then a line per provider that holds rows, is
    down or has parked rows (how many, until when, why), a line with each budget of a provider
    paced by its tokens (the last minute's use against its limit, by its own name), and the rows
    the budget parked."""
    s = state
    parts = [f"{s.play}: {s.total} rows", f"ok {s.ok}", f"reused {s.reused}", f"failed {s.failed}"]
    if s.parked:
        parts.append(f"parked {s.parked}")
    if s.skipped:
        parts.append(f"skipped {s.skipped}")
    parts.append(_calls(s))
    failed = f" ({money(s.cost_failed)} on failures)" if s.cost_failed else ""
    spent = priced(s.cost_spent, s.calls_executed, s.calls_unpriced)
    saved = priced(s.cost_saved, s.calls_reused + s.calls_shared, s.reused_unpriced)
    parts.append(f"cost {spent} spent{failed}, {saved} saved{_unpriced(s)}")
    parts.append(f"{s.elapsed:.1f}s")
    lines = [" | ".join(parts)]
    for name, p in s.provider_views().items():
        parked = tally.parked_rows_by.get(name, 0)
        reasons = tally.reasons(name)
        # why they parked, when that is not the hold or the outage the line tells (a quota, by its name)
        why = f" ({_reasons(reasons)})" if set(reasons) - {"hold", "down"} else ""
        rows = f"; {_rows(parked)} parked{why}" if parked else ""
        if p.down:
            since = s.down_since.get(name)
            when = f" since {time_of_day(since)}" if since else ""
            probe = f"; next probe at {time_of_day(p.probe_at)}" if p.probe_at else ""
            lines.append(f"provider {name!r} is down{when}: {in_words(p.down_error)}{rows}{probe}")
        elif p.held:
            status = f" (HTTP {p.last_status})" if p.last_status else ""
            lines.append(f"provider {name!r} holds calls until {time_of_day(p.hold_until_at)}{status}{rows}")
        for key in p.keys:  # a pool's key held while the others go on (a refused key is among the notices)
            if key.held and not key.retired and not p.held:
                lines.append(
                    f"provider {name!r}: key {key.name} holds calls until {time_of_day(key.hold_until_at)}; the other keys went on"
                )
        if p.budgets:  # how near its limits the calls ran, each budget by its own name
            lines.append(f"provider {name!r}: {budgets_said(p)}")
        if parked and not p.down and not p.held:
            ready = max((at for _, on, at in tally.parked.values() if on == name and at), default=None)
            until = f", ready at {time_of_day(ready)}" if ready else ""
            lines.append(f"provider {name!r}: {_rows(parked)} parked ({_reasons(reasons)}){until}")
    for reason, n in tally.reasons(None).items():
        lines.append(f"{_rows(n)} parked: " + _WHY_PARKED.get(reason, reason))
    if s.parked:
        lines.append("a rerun runs the parked rows again")
    lines += error_lines(tally)
    lines += [f"warning: {note}" for note in s.notices]
    return "\n".join(lines)


def error_lines(tally: Tally) -> list[str]:
    """The largest groups of failed rows, a line each: how many, the group, an example row."""
    groups = tally.error_groups(GROUPS_SHOWN)
    if not groups:
        return []
    failed = sum(tally.counts.values())
    kinds = tally.kinds
    lines = [f"{_rows(failed)} failed" + (f", {kinds:,} kinds of error:" if kinds > 1 else ":")]
    for n, group, example, message, cost in groups:
        paid = f" (paid {money(cost)})" if cost else ""
        lines.append(f"  {n:,} × {group}{paid}; e.g. row {example!r}: {in_words(message)}")
    if kinds > GROUPS_SHOWN:
        lines.append(
            f"  … and {kinds - GROUPS_SHOWN:,} more kinds (run.errors.groupby('group') lists them all)"
        )
    return lines


def _meter(bar: tqdm) -> int:
    """The length of the bar's line without its bar."""
    shape = (bar.bar_format or "{l_bar}{bar}{r_bar}").replace("{bar}", "")
    return len(tqdm.format_meter(**{**bar.format_dict, "ncols": None, "bar_format": shape}))


def _counters(s: RunState) -> list[str]:
    """The counters a line of progress ends with, longest first: what a narrow line drops first."""
    rows = f"ok={s.ok} reused={s.reused} failed={s.failed}"
    return [f"{rows} | {_calls(s)}", rows, f"ok={s.ok} failed={s.failed}", ""]


def _unpriced(s: RunState) -> str:
    """The tools whose calls have no price (their model is not in the price table), by name."""
    n = s.calls_unpriced + s.reused_unpriced
    if not n:
        return ""
    tools = f" of {', '.join(map(repr, sorted(s.unpriced)))}" if s.unpriced else ""
    return f" ({n:,} calls{tools} unpriced: no price for the model)"


def _calls(s: RunState) -> str:
    shared = f"{s.calls_shared} shared in this run, " if s.calls_shared else ""
    failed = f", {s.calls_failed} failed" if s.calls_failed else ""
    used = f" ({tokens(s.tokens)})" if s.tokens >= 1 else ""
    return f"calls {s.calls_executed} paid{failed}{used}, {shared}{s.calls_reused} from receipts, {s.calls_local} local"


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _reasons(reasons: dict[str, int]) -> str:
    if len(reasons) == 1:
        return next(iter(reasons))
    return ", ".join(f"{reason} {n:,}" for reason, n in reasons.items())


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def _log_width() -> int:
    """A file or a CI log has no width to ask: ``$COLUMNS`` when set, else ``LOG_WIDTH``."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH
