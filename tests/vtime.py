"""An event loop with virtual time, for testing rates, holds and retry queues without waiting.

``loop.time()`` starts at 0 and only moves when nothing is ready to run: then it jumps to the
next scheduled timer.  ``asyncio.sleep(3600)`` returns at once, in order with every other timer,
and the governor (which reads ``loop.time()``) sees an hour pass.  Use it only with code that
does no real I/O: async Python tools, no HTTP, no threads.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        # Idle with timers pending: jump to the earliest one instead of sleeping until it.  A
        # cancelled timer first in line is dropped first, as the base loop would: jumping to it
        # would leave the loop waiting, in real time, for the next one.
        scheduled = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False
        if not self._ready and scheduled:  # type: ignore[attr-defined]
            self._now = max(self._now, scheduled[0]._when)
        super()._run_once()  # type: ignore[misc]


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class FrozenClock:
    """Monotonic seconds that move only when a test says so (a demo server's injected clock)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class LoopClock:
    """Seconds on the clock of the event loop that reads it (a demo provider's injected clock):
    virtual under ``run_virtual``, the monotonic clock under a real loop.

    A provider served in process answers in its caller's loop, so its rate windows and holds
    pass in the run's own time.  Read outside a loop (``stats()`` from the test), it says the
    last time a loop read; a new loop (each ``run_virtual`` starts at 0) carries on from there,
    so the provider's time never runs backwards.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._offset = 0.0
        self.now = 0.0

    def __call__(self) -> float:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self.now
        if loop is not self._loop:
            self._loop, self._offset = loop, self.now - loop.time()
        self.now = max(self.now, loop.time() + self._offset)
        return self.now
