"""Text progress on stderr (tqdm), for terminals, scripts and CI logs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from ..models import Event, ProviderHoldLifted, ProviderHoldSet, RowFinished, RowHeld, RowRequeued, RunFinished, RunStarted, time_of_day
from ..runtime.state import RunState

__all__ = ["TextView", "summary"]

_INTERVAL = 0.1  # at most 10 refreshes a second


class TextView:
    """A progress bar with the run's counters, refreshed at most 10 times a second."""

    def __init__(self, state: RunState, *, file: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._state = state
        self._file = file if file is not None else sys.stderr
        self._clock = clock
        self._bar: tqdm | None = None
        self._last = 0.0
        self.unsubscribe = state.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        kind = type(event)
        if kind is RunStarted:
            if self._bar is None:
                self._bar = tqdm(total=event.total, desc=event.play, unit="row", file=self._file, leave=True, dynamic_ncols=False, ncols=100)
            self._refresh(force=True)
        elif kind is ProviderHoldSet or kind is ProviderHoldLifted:
            self._refresh()
        elif kind is RowFinished or kind is RowRequeued or kind is RowHeld:
            now = self._clock()
            if now - self._last >= _INTERVAL:
                self._last = now
                self._refresh()
        elif kind is RunFinished:
            self._refresh(force=True)
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            print(summary(self._state), file=self._file, flush=True)

    def _refresh(self, force: bool = False) -> None:
        bar, s = self._bar, self._state
        if bar is None:
            return
        bar.n = s.done
        postfix = f"ok={s.ok} reused={s.reused} failed={s.failed}"
        if s.held:
            postfix += f" held={s.held}"
        if s.parked:
            postfix += f" parked={s.parked}"
        postfix += f" | calls {s.calls_executed} paid, {s.calls_reused} from receipts"
        for p in s.providers.values():
            if p.held:
                postfix += f" | {p.name} holds until {time_of_day(p.hold_wall)}"
        bar.set_postfix_str(postfix, refresh=False)
        bar.refresh()


def summary(state: RunState) -> str:
    """One line: what the run did and what it cost."""
    s = state
    parts = [f"{s.play}: {s.total} rows", f"ok {s.ok}", f"reused {s.reused}", f"failed {s.failed}"]
    if s.parked:
        parts.append(f"parked {s.parked}")
    if s.skipped:
        parts.append(f"skipped {s.skipped}")
    parts.append(f"calls executed {s.calls_executed}, reused {s.calls_reused}")
    parts.append(f"cost {s.cost_spent:g} spent, {s.cost_saved:g} saved")
    parts.append(f"{s.elapsed:.1f}s")
    line = " | ".join(parts)
    holds = [p for p in s.providers.values() if p.held]
    for p in holds:
        when = time_of_day(p.hold_wall)
        status = f" (HTTP {p.last_status})" if p.last_status else ""
        line += f"\nprovider {p.name!r} holds calls until {when}{status}; parked rows retry with run.retry() or a rerun"
    for note in s.notices:
        line += f"\nwarning: {note}"
    return line
