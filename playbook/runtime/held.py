"""The held queue: rows off their workers (held by a provider, or sleeping) until they may run again.

What a row waits for is kept on its :class:`~playbook.runtime.table.RowEntry`; the queue only
orders the rows by the time they may run again.
"""

from __future__ import annotations

import asyncio
import heapq

__all__ = ["HeldQueue"]


class HeldQueue:
    """Held rows ordered by the time they may run again (loop clock); workers take due rows
    ahead of fresh ones and nap until the next is due, or until a row joins the queue."""

    __slots__ = ("_heap", "_seq", "_wake")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []  # (ready at, seq, position)
        self._seq = 0  # keeps rows with the same deadline in the order they were held
        self._wake: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def __repr__(self) -> str:
        head = f", next at {self._heap[0][0]:.3f}" if self._heap else ""
        return f"<HeldQueue {len(self._heap)} rows{head}>"

    def push(self, pos: int, until: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (until, self._seq, pos))
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
