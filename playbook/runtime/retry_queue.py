"""The held queue: rows off their workers (held by a provider, or sleeping) until they may run
again, and the rows stepped back (another process pays for one of their calls) until the fresh
rows are taken.

What a row waits for is kept in the :class:`~playbook.runtime.table.RowTable`; the queue only
orders the rows by the time they may run again.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque

__all__ = ["RetryQueue"]


class RetryQueue:
    """Held rows ordered by the time they may run again (loop clock); workers take due rows
    ahead of fresh ones and nap until the next is due, or until a row joins the queue."""

    __slots__ = ("_heap", "_seq", "_wake", "_back", "_stepped")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []  # (ready at, seq, position)
        self._seq = 0  # keeps rows with the same deadline in the order they were held
        self._wake: asyncio.Future[None] | None = None
        self._back: deque[int] = deque()  # rows stepped back, in order: after the fresh rows
        self._stepped: set[int] = set()  # rows that stepped back once: the next time they wait

    def __len__(self) -> int:
        return len(self._heap)

    def __repr__(self) -> str:
        head = f", next at {self._heap[0][0]:.3f}" if self._heap else ""
        back = f", {len(self._back)} stepped back" if self._back else ""
        return f"<RetryQueue {len(self._heap)} rows{head}{back}>"

    def push(self, pos: int, until: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (until, self._seq, pos))
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

    def due(self, now: float) -> int | None:
        """The first row whose time has come, taken off the queue; else ``None``."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)[2]
        return None

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    async def nap(self, until: float) -> None:
        """Sleep until ``until`` (loop clock) or until a row joins the queue."""
        loop = asyncio.get_running_loop()
        if self._wake is None:
            self._wake = loop.create_future()
        await asyncio.wait((self._wake,), timeout=max(0.0, until - loop.time()))

    def clear(self) -> None:
        """Forget the queued rows (a stop)."""
        self._heap.clear()
        self._back.clear()
