"""Holds: a provider that says "come back at T" (a 429's ``Retry-After``, failures that dominate)
holds every call until then.  :class:`Holds` is the part of a governor that sets a hold, notices
one another process set, tells its listeners (on every loop that listens) and lifts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from playbook.events import ProviderHoldLifted, ProviderHoldSet
from playbook.providers.limits import Limiter
from playbook.providers.limits.waiters import Listeners, here

__all__ = ["Holds"]


class Holds:
    """What a :class:`~playbook.providers.governor.Governor` does with holds (its state is the governor's)."""

    __slots__ = ("hold_until_at", "_seen_hold", "holding", "_lift_timer")

    limiter: Limiter
    _listeners: Listeners
    _lock: threading.Lock

    def __init__(self) -> None:
        self.hold_until_at = 0.0  # the hold's end in epoch seconds
        self._seen_hold = 0.0  # loop clock: the latest hold announced to subscribers
        self.holding = False
        self._lift_timer: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def held(self) -> bool:
        return self.holding and self.hold_until_at > time.time()

    def emit(self, event: Any) -> None:
        self._listeners.tell(event)

    async def hold_calls(self, until: float, status: int | None) -> None:
        """Hold every call to this provider until ``until`` (loop clock)."""
        if until <= self.limiter.hold_until_t:
            return
        self._announce(await self.limiter.hold(until), status)

    def notice_hold(self, now: float) -> None:
        """A hold this process did not set (another process sharing the limiter did): say so."""
        until = self.limiter.hold_until_t
        if until > self._seen_hold and until > now:
            self._announce(until, None)

    def _announce(self, until: float, status: int | None) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if until <= self._seen_hold:
                return  # another thread announced it (or a later one) first
            self._seen_hold = until
            self.hold_until_at = time.time() + (until - loop.time())
            self.holding = True
            listening = self._listeners.loops() - {loop}
            previous, self._lift_timer = self._lift_timer, (loop, loop.call_at(until, self.lift, until))
        if previous is not None and previous[0] is loop:
            previous[1].cancel()
        self.emit(ProviderHoldSet(self.name, self.hold_until_at, status))
        # Say when it ends even if no call comes to notice (every waiting row may have parked),
        # and on every loop that listens: this one may stop first (its thread's map() is over).
        for other in listening:
            with contextlib.suppress(RuntimeError):
                other.call_soon_threadsafe(other.call_at, until, self.lift, until)

    def lift(self, until: float | None = None) -> None:
        """The hold ended (``until``: the one a timer was set for; a later one stays)."""
        with self._lock:
            if not self.holding or (until is not None and until < self._seen_hold):
                return
            self.holding = False
            timer, self._lift_timer = self._lift_timer, None
        if timer is not None and timer[0] is here():
            timer[1].cancel()
        self.emit(ProviderHoldLifted(self.name))
