"""The waiting queue: rows off their workers (held by a provider, or sleeping) until they may run
again, and the rows stepped back (another process pays for one of their calls) until the fresh
rows are taken.  A row whose call fails on its own (its provider answers the others) is held
*behind*: once its time has come, it runs when no fresh row is waiting, so the provider's rate
goes to rows that may succeed first.

What a row waits for is kept in the :class:`~playbook.runtime.rows.table.RowTable`; the queue only
orders the rows by the time they may run again.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque

__all__ = ["RetryQueue"]


class RetryQueue:
    """Waiting rows ordered by the time they may run again (loop clock); workers take due rows
    ahead of fresh ones and nap until the next is due, or until a row joins the queue."""

    __slots__ = ("_heap", "_behind", "_seq", "_wake", "_back", "_stepped")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []  # (ready at, seq, position)
        self._behind: list[tuple[float, int, int]] = []  # the same, for rows that wait for the fresh ones too
        self._seq = 0  # keeps rows with the same deadline in the order they were held
        self._wake: asyncio.Future[None] | None = None
        self._back: deque[int] = deque()  # rows stepped back, in order: after the fresh rows
        self._stepped: set[int] = set()  # rows that stepped back once: the next time they wait

    def __len__(self) -> int:
        return len(self._heap) + len(self._behind)

    def __repr__(self) -> str:
        head = f", next at {self.next_at():.3f}" if self else ""
        behind = f", {len(self._behind)} behind the fresh rows" if self._behind else ""
        back = f", {len(self._back)} stepped back" if self._back else ""
        return f"<RetryQueue {len(self)} rows{head}{behind}{back}>"

    def push(self, pos: int, until: float, *, behind: bool = False) -> None:
        """Hold the row at ``pos`` until ``until`` (``behind``: and until no fresh row waits)."""
        self._seq += 1
        heapq.heappush(self._behind if behind else self._heap, (until, self._seq, pos))
        self._woken()

    def may_step_back(self, pos: int) -> bool:
        """Once: a row that comes back to a call still leased waits for it (no row bounces)."""
        return pos not in self._stepped

    def step_back(self, pos: int) -> None:
        """A row that another process's lease turned away: it runs again after the fresh rows."""
        self._stepped.add(pos)
        self._back.append(pos)
        self._woken()

    def stepped_back(self) -> list[int]:
        """Every row stepped back, taken off the queue."""
        back, self._back = list(self._back), deque()
        return back

    def _woken(self) -> None:
        if self._wake is not None:
            self._wake.set_result(None)
            self._wake = None

    def due(self, now: float, *, fresh: bool = False) -> int | None:
        """The first row whose time has come, taken off the queue; else ``None``.  ``fresh``:
        rows not started yet wait, and go before the rows held behind them."""
        for heap in (self._heap,) if fresh else (self._heap, self._behind):
            if heap and heap[0][0] <= now:
                return heapq.heappop(heap)[2]
        return None

    def next_at(self) -> float | None:
        return min((heap[0][0] for heap in (self._heap, self._behind) if heap), default=None)

    async def nap(self, until: float) -> None:
        """Sleep until ``until`` (loop clock) or until a row joins the queue."""
        loop = asyncio.get_running_loop()
        if self._wake is None:
            self._wake = loop.create_future()
        await asyncio.wait((self._wake,), timeout=max(0.0, until - loop.time()))

    def clear(self) -> None:
        """Forget the queued rows (a stop)."""
        self._heap.clear()
        self._behind.clear()
        self._back.clear()
