"""The fan-out of a run's events: each event is counted, then handed to every view that subscribed.

A view subscribes to every event, or to some kinds only (a view that redraws on a timer need not
pay a call per row).  :meth:`RunFanout.emit` runs for every event of every row, so it applies the
reducer's step and calls the listeners inline, with no function between.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from playbook.events import Event, RowFinished, RowStarted
from playbook.runtime.state.reducer import APPLY, RunCounters

__all__ = ["Listener", "RunFanout"]

Listener = Callable[[Event], None]


class RunFanout(RunCounters):
    """Applies each event to the counters, then hands it to every subscribed view."""

    __slots__ = ("_listeners", "_by_kind", "_settled", "starts_unheard", "oks_unheard")

    def __init__(
        self,
        *,
        play: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(play=play, clock=clock, wall=wall)
        self._listeners: list[Listener] = []
        self._by_kind: dict[type, list[Listener]] = {}  # listeners that asked for some kinds only
        self._settled: list[Listener] = []  # of those, the ones that need no row that simply went ok
        # No view hears a row start, or a row simply going ok (no calls, never waiting): those
        # events need not be made, the counters are changed as they would change them.
        self.starts_unheard = True
        self.oks_unheard = True

    def subscribe(
        self, listener: Listener, kinds: tuple[type, ...] | None = None, *, every_row: bool = True
    ) -> Callable[[], None]:
        """Call ``listener(event)`` for every event from now on (or only those of ``kinds``: a view
        that redraws on a timer need not pay a call per row); returns an unsubscribe function.
        ``every_row=False``: the listener ignores a ``RowFinished`` of a row that simply went ok
        (a tally of what went wrong), so those rows need not make one for it."""
        if kinds is not None:
            for kind in kinds:
                self._by_kind.setdefault(kind, []).append(listener)
            if not every_row:
                self._settled.append(listener)

            def unsubscribe() -> None:
                for kind in kinds:
                    self._by_kind[kind].remove(listener)
                if not every_row:
                    self._settled.remove(listener)
                self._hearing()

            self._hearing()
            return unsubscribe
        self._listeners.append(listener)

        def unsubscribe_all() -> None:
            self._listeners.remove(listener)
            self._hearing()

        self._hearing()
        return unsubscribe_all

    def _hearing(self) -> None:
        every = bool(self._listeners)
        self.starts_unheard = not every and not self._by_kind.get(RowStarted)
        finished = self._by_kind.get(RowFinished, ())
        self.oks_unheard = not every and all(listener in self._settled for listener in finished)

    def heard(self, kind: type) -> bool:
        """Whether a view listens to events of ``kind`` (else the counters alone count them, and
        may count many at once)."""
        return bool(self._listeners or self._by_kind.get(kind))

    def emit(self, event: Event) -> None:
        """Count ``event``, then hand it to the views."""
        kind = type(event)
        apply = APPLY.get(kind)
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
