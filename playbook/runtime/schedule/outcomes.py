"""Row outcomes: how a row's attempt ends reaches the rows table and the run's events.

A row settles (``ok``, ``reused``, ``failed``, ``parked``, ``skipped``), or steps aside into the
waiting queue (held by a provider, or sleeping) and comes back at its time.  Rows sharing its key
share the outcome.  Each change is one event: views and counters follow from those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from playbook.events import (
    RowDeferred,
    RowFinished,
    RowHeld,
    RowParked,
    RowRequeued,
    RowResumed,
    RowSleeping,
    RowStarted,
)
from playbook.records import Status
from playbook.runtime.rows.grouping import message_group
from playbook.runtime.rows.table import Parking, RowTable, Waiting
from playbook.runtime.schedule.retry_queue import RetryQueue
from playbook.store.records import Memo

if TYPE_CHECKING:
    from playbook.runtime.state.reading import RunState

__all__ = ["Outcomes", "clashing"]

_SLEEP = Waiting("sleep", None)


class Outcomes:
    """Settles, parks, holds and re-admits rows: the table and the events change together."""

    __slots__ = ("table", "queue", "state", "emit", "_parked_down", "guarded", "play")

    def __init__(
        self, table: RowTable, queue: RetryQueue, state: RunState, parked_down: Callable[[int, str], None]
    ) -> None:
        self.table = table
        # input columns an output may not replace (overwrite=False)
        self.guarded: frozenset[Any] = frozenset()
        self.play = ""
        self.queue = queue
        self.count_in(state)
        self._parked_down = parked_down  # a row parked on a down provider: it may come back in this run

    def __repr__(self) -> str:
        return f"<Outcomes {self.table!r} {self.queue!r}>"

    def count_in(self, state: RunState) -> None:
        """Count the rows' events in ``state`` (a retry counts in its own)."""
        self.state = state
        self.emit = state.emit

    def started(self, pos: int) -> int:
        """A worker took the row; returns its attempt number."""
        attempt = self.table.started(pos)
        state = self.state
        if state.starts_unheard:  # no view would hear it: counted as RowStarted counts
            state.in_flight += 1
        else:
            self.emit(tuple.__new__(RowStarted, (pos,)))  # a C call: RowStarted(pos) is a Python one
        return attempt

    def finish(
        self,
        pos: int,
        status: Status,
        output: dict[str, Any] | None,
        error: str | None,
        *,
        ran: bool = True,
        held: bool = False,
        calls: int = 0,
        cost: float = 0.0,
        group: str | None = None,
        cost_failed: float = 0.0,
        unpriced: int = 0,
    ) -> None:
        """``group``: a failed row's error group; by default its message's.  ``cost_failed``: what
        the attempt paid that bought nothing kept (see :class:`RowFinished`)."""
        if output and self.guarded and status in ("ok", "reused") and (clash := self._clashing(pos, output)):
            status, output, error = "failed", None, clashing(self.play, clash)
        if status == "failed" and group is None:
            group = message_group(error or "")
        rows = self.table.set_outcome(pos, status, output, error, group, cost_failed)
        state = self.state
        if status == "ok" and state.oks_unheard and not (held or calls):  # counted as RowFinished counts
            state.in_flight -= ran
            state.ok += rows
            if cost_failed:
                state.cost_failed += cost_failed
            return
        self.emit(
            tuple.__new__(
                RowFinished, (pos, status, error, rows, ran, held, calls, cost, group, cost_failed, unpriced)
            )
        )

    def _clashing(self, pos: int, output: dict[str, Any]) -> list[Any]:
        """The input columns ``output`` would change in row ``pos`` (a value passed through as it
        was changes nothing)."""
        table, guarded = self.table, self.guarded
        if guarded.isdisjoint(output):  # the usual case: no output is named like an input column
            return []
        named = [c for c in output if c in guarded]
        values = table.values(pos)
        return [c for c in named if not _same(output[c], values[table.columns[c]])]

    def park(self, pos: int, reason: str, message: str, provider: str | None, ready_at: float | None) -> None:
        self.table.park(pos, Parking(reason, provider, ready_at))
        self.emit(RowParked(pos, reason, provider, ready_at))
        self.finish(pos, "parked", None, message)
        if reason == "down" and provider is not None:
            self._parked_down(pos, provider)

    def hold(
        self, pos: int, until: float, wall: float, provider: str, status: int | None, *, behind: bool = False
    ) -> None:
        """Held by ``provider`` until ``until`` (loop clock; ``wall``: the same in epoch seconds;
        ``behind``: then after the rows not started yet)."""
        self._aside(pos, until, Waiting("provider", provider), behind=behind)
        self.emit(RowHeld(pos, provider, wall, status))

    def sleep(self, pos: int, until: float, wall: float) -> None:
        """In ``ctx.sleep`` until ``until`` (loop clock)."""
        self._aside(pos, until, _SLEEP)
        self.emit(RowSleeping(pos, wall))

    def step_back(self, pos: int) -> None:
        """Another process is paying for one of the row's calls: it runs again after the fresh rows."""
        self.table.running.discard(pos)
        self.queue.step_back(pos)
        self.emit(RowDeferred(pos))

    def _aside(self, pos: int, until: float, waiting: Waiting, *, behind: bool = False) -> None:
        table = self.table
        table.running.discard(pos)
        table.waiting[pos] = waiting
        self.queue.push(pos, until, behind=behind)

    def resume(self, pos: int) -> None:
        """A waiting row's time has come: a worker takes it again."""
        self.table.waiting.pop(pos, None)
        self.emit(RowResumed(pos))

    def requeue(self, pos: int, previous: Status) -> None:
        """A settled row runs again (``run.retry()``, or its down provider is back)."""
        self.emit(RowRequeued(pos, previous, self.table.unsettle(pos)))

    def reused(self, found: Sequence[tuple[int, Memo]]) -> None:
        """Settle rows by their memos (``finish``, the short way: a million rows may come this way
        at once).  With no view listening to each row's ``RowFinished``, the state counts them
        all at once."""
        if self.state.heard(RowFinished):
            for pos, memo in found:
                self._reused(pos, memo)
            return
        table, guarded = self.table, self.guarded
        settle = table.settle_reused
        rows = calls = unpriced = 0
        costs: list[float] = []
        for pos, memo in found:
            output = memo.output
            if output and guarded and self._clashing(pos, output):
                self._reused(pos, memo)  # it fails, saying why
                continue
            rows += settle(pos, output)
            # Its calls of free local tools were not answered by receipts: neither run nor reused
            # now, they count in neither.
            saved = memo.calls - memo.local
            if saved:
                calls += saved
                costs.append(memo.cost)
                unpriced += memo.unpriced
        self.state.rows_reused(rows, calls, costs, unpriced)

    def _reused(self, pos: int, memo: Memo) -> None:
        output, calls, cost, local, _, unpriced = memo
        calls -= local
        if output and self.guarded and self._clashing(pos, output):
            # it fails, saying why
            self.finish(pos, "reused", output, None, ran=False, calls=calls, cost=cost, unpriced=unpriced)
            return
        rows = self.table.settle_reused(pos, output)
        # tuple.__new__: a C call (RowFinished(...) is a Python one)
        self.emit(
            tuple.__new__(
                RowFinished, (pos, "reused", None, rows, False, False, calls, cost, None, 0.0, unpriced)
            )
        )

    def unfinished(self, positions: Sequence[int], why: str) -> None:
        """Settle every row of ``positions`` not settled yet as skipped (a stop, a fatal error)."""
        table = self.table
        statuses, waiting = table.statuses, table.waiting
        for pos in positions:  # a copy comes after its lead, so settling the lead settles it
            if not statuses[pos]:
                held = waiting.pop(pos, None) is not None
                self.finish(pos, "skipped", None, why, ran=pos in table.running, held=held)
        self.queue.clear()


def _same(a: Any, b: Any) -> bool:
    """``a`` is ``b``'s value (NaN is NaN; an array or a value that cannot say is not)."""
    if a is b:
        return True
    try:
        return bool(a == b) or (a != a and b != b)
    except (TypeError, ValueError):
        return False


def clashing(play: str, columns: list[Any]) -> str:
    """Why a row's output may not stand: it names input columns."""
    named = ", ".join(repr(c) for c in columns)
    which = "an input column" if len(columns) == 1 else "input columns"
    return (
        f"OutputError: play {play!r} returned {named}, {which} of the frame, with another value: the result would lose "
        "the input. Rename the "
        "output (return {'new_name': ...}), or pass overwrite=True to replace the input where the row returns it "
        "(nothing is paid again: the row's calls have their receipts)"
    )
