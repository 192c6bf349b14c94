"""How many rows a run keeps in flight: the number given (``concurrency=N``, a hard cap), or,
when none is, a level the run finds for itself (:class:`Level`).

A run of paced calls goes as fast as its providers allow only with enough rows in flight to
keep them busy: by Little's law, rows in flight = rows a second x seconds a row.  Neither is known
before the run (a row's time is its calls' latencies; the rate is the slowest provider's, per
call of a row), so the level is found by watching the rows, every ``PERIOD`` seconds:

- while rows wait for a place (fresh rows are queued, the places are all taken) and the calls of
  the rows in flight hardly wait for their providers (under ``GROW_BELOW`` of the rows' time went
  waiting for a rate slot, a slot in flight, tokens or a hold), the places are the bound, not the
  providers: the level grows by ``GROW``, up to ``ceiling``;
- once calls wait for their providers (they are the bound now) it stops growing; when most of
  the rows' time goes waiting for them (over ``SHRINK_ABOVE``), rows in flight only queue there
  (holding memory, spending their wait budgets), and the level comes down by ``SHRINK``, never
  under ``START``.

It grows only where every provider the rows called has a limit that is known (configured, or
learnt from its headers or its 429s): a provider with no known limit would meet more calls at
once than the default ever sent it, and answer with 429s.  Rows that call no provider (local
tools, receipts) keep ``START``.  Rows set aside (held, sleeping) hold no place, so they count
for nothing here.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from playbook.runtime.state.upstream import provider_view
from playbook.tools.transport import connection_budget

if TYPE_CHECKING:
    from playbook.providers.provider import Provider

__all__ = ["CEILING", "START", "Level", "Waiting"]

T = TypeVar("T")

START = 16  # rows in flight a run starts with when no concurrency is given (the old default)
CEILING = 256  # the most it grows to (and no more than the connections the open-file limit leaves)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class Level:
    """The rows a run keeps in flight (:attr:`size`), fixed or found (see the module docstring).
    Told when rows start and end (:meth:`started`, :meth:`ended`) and when their calls wait for a
    provider (:meth:`waiting`); asked at the end of each row (:meth:`adjust`).  Times are the
    loop's clock, read through ``clock``."""

    __slots__ = (
        "size",
        "fixed",
        "ceiling",
        "_clock",
        "_since",
        "_last",
        "_live",
        "_waits",
        "_busy",
        "_waited",
        "_held",
        "_called",
        "_unknown",
    )

    PERIOD = 0.5  # seconds between adjustments
    GROW_BELOW = 0.1  # share of the rows' time spent waiting for providers under which the level grows
    SHRINK_ABOVE = 0.5  # ... over which it comes down
    GROW = 1.5
    SHRINK = 0.8

    def __init__(
        self, fixed: int | None, clock: Callable[[], float] = _loop_time, ceiling: int | None = None
    ) -> None:
        self.fixed = fixed is not None
        self.size = fixed if fixed is not None else START
        if ceiling is None:
            budget = connection_budget()
            ceiling = CEILING if budget is None else max(START, min(CEILING, budget))
        self.ceiling = ceiling
        self._clock = clock
        self._since = self._last = math.nan  # from the first row (a run is made before its loop runs)
        self._live = 0  # rows in flight
        self._waits = 0  # of their calls, those waiting for their provider
        self._busy = 0.0  # row-seconds in flight this period
        self._waited = 0.0  # call-seconds waiting for a provider this period
        self._held = False  # a call met a hold this period
        self._called: dict[str, Provider] = {}  # the providers called this period, by name
        self._unknown = False  # a call went to a remote tool with no provider (no limit known)

    def __repr__(self) -> str:
        how = "fixed" if self.fixed else f"found, ceiling {self.ceiling}"
        return f"<Level {self.size} ({how}) live={self._live} waiting={self._waits}>"

    # -- what the rows tell it ------------------------------------------------------------------

    def started(self) -> None:
        if not self.fixed:
            self._tick()
            self._live += 1

    def ended(self) -> None:
        if not self.fixed:
            self._tick()
            self._live -= 1

    def waiting(self, provider: Provider) -> Waiting | None:
        """A call goes to ``provider``: the time until it is on the wire is time waited for the
        provider (see :class:`Waiting`).  None for a fixed level."""
        if self.fixed:
            return None
        self._called[provider.name] = provider
        return Waiting(self)

    def unlimited(self) -> None:
        """A call went to a remote tool with no provider: no limit is known for it."""
        self._unknown = True

    def held(self) -> None:
        """A call met a provider's hold (its row steps aside): the provider is the bound."""
        self._held = True

    def _wait(self, change: int) -> None:
        self._tick()
        self._waits += change

    def _tick(self) -> None:
        now = self._clock()
        dt = now - self._last
        if math.isnan(dt):
            self._since = self._last = now
        elif dt > 0:
            self._busy += self._live * dt
            self._waited += self._waits * dt
            self._last = now

    # -- the level ------------------------------------------------------------------------------

    def adjust(self, queued: bool) -> bool:
        """At the end of a row: a new level, once a period is over; True when it grew.
        ``queued``: fresh rows wait for a place."""
        if self.fixed:
            return False
        self._tick()
        period = self._last - self._since
        if period < self.PERIOD:
            return False
        before = self.size
        share = self._waited / self._busy if self._busy > 0 else 0.0
        full = self._busy >= 0.9 * self.size * period  # the places were taken, on average
        if queued and full and share < self.GROW_BELOW and not self._held and self._bounded():
            self.size = min(self.ceiling, max(self.size + 1, math.ceil(self.size * self.GROW)))
        elif share > self.SHRINK_ABOVE or self._held:
            self.size = max(START, min(self.size, math.floor(self.size * self.SHRINK)))
        self._since = self._last
        self._busy = self._waited = 0.0
        self._held = self._unknown = False
        self._called.clear()
        return self.size > before

    def _bounded(self) -> bool:
        """Every provider called this period has a known limit (and there was one)."""
        if self._unknown or not self._called:
            return False
        for provider in self._called.values():
            status = provider_view(provider)
            if status.rate is None and status.in_flight_limit is None and status.tpm is None:
                return False
        return True


class Waiting:
    """One call's time before it is on the wire: waiting from its creation until :meth:`sent`,
    again after :meth:`back` (a try failed: the next waits for its backoff), until :meth:`done`."""

    __slots__ = ("_level", "_on")

    def __init__(self, level: Level) -> None:
        self._level = level
        self._on = True
        level._wait(1)

    def sent(self) -> None:
        if self._on:
            self._on = False
            self._level._wait(-1)

    def back(self) -> None:
        if not self._on:
            self._on = True
            self._level._wait(1)

    done = sent

    def around(self, send: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """``send``, telling this when its call is on the wire and when it is off it again."""

        async def timed() -> T:
            self.sent()
            try:
                return await send()
            finally:
                self.back()

        return timed
