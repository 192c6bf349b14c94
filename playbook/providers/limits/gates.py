"""What a provider's governor knows besides its rate: how many calls it may have in flight
(:class:`Window`); whether the provider is up at all is :mod:`~playbook.providers.limits.health`'s.

Like :class:`~playbook.providers.limits.pace.Pace`, it reads no clock: it takes ``now`` from its
caller (the running loop's time), so tests drive it in virtual time.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

__all__ = ["Window"]


class Window:
    """Calls in flight: a gate whose limit is configured (``concurrency=``), discovered from
    429s that track calls in flight, or both (the discovered limit never exceeds the configured).

    It *opens* like TCP's slow start: ``INITIAL`` calls at first, one more per success (doubling
    each round trip), so a provider with limits meets a handful of calls, not the whole run's
    concurrency at once; the first 429 ends the opening.

    A 429 for a call sent while ``level`` calls were in flight (itself included) is a verdict on
    concurrency when calls sent at lower levels went through lately and none at this level did:
    a rate limit refuses calls whatever the level, so its refusals fall among successes at the
    same levels; and it says when to come back (``Retry-After``), which no concurrency limit
    can.  The limit is then set to the highest level that went through (the level *is*
    the measurement, so no multiplicative cut is needed).  A success at a level above the limit
    says the limit was read too low and raises it by one, and ``PROBE`` seconds at the limit
    without a refusal raise it by a quarter: a raised limit is found at the cost of a refusal
    every few seconds.  A refusal below the limit, among levels that went through, is the
    rate's.

    Its waiters may sit on several threads' loops; it takes no lock and wakes nobody itself: its
    owner serialises the calls to it and wakes the waiters it hands over (:meth:`handed`).
    """

    limit: int | None

    __slots__ = (
        "configured",
        "limit",
        "in_flight",
        "opening",
        "_waiters",
        "_handed",
        "_oks",
        "_changed",
        "_blind",
        "_single",
        "_probe",
        "_probed_from",
    )

    HORIZON = 2.0  # seconds of successes that say which levels went through
    INITIAL = 8
    OPEN = 256  # an opening that gets this far without a 429 has found no limit
    PROBE = 2.0  # seconds at the limit without a refusal before it grows
    PROBE_MAX = 32.0  # ... doubling, up to this, while each probe is refused back to where it began

    def __init__(self, configured: int | None = None) -> None:
        self.configured = configured
        self.opening = configured is None or configured > self.INITIAL
        self.limit = min(configured or self.INITIAL, self.INITIAL)
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()  # calls waiting for room, on any thread's loop
        self._handed: list[asyncio.Future[bool]] = []  # let in, not yet woken
        self._oks: deque[tuple[float, int]] = deque()  # (when, level) of recent successes
        self._changed = -math.inf  # when the limit last fell
        self._blind = False  # halved on a refusal before anything went through
        self._single = False  # one call at a time, whatever the limit (a window's allowance is used up)
        self._probe = self.PROBE  # seconds at the limit before the next probe
        self._probed_from: int | None = None  # the limit the last probe grew from

    def __repr__(self) -> str:
        limit = "unbounded" if self.limit is None else str(self.limit)
        how = " opening" if self.opening else " discovered" if self.discovered else ""
        return f"<Window {self.in_flight}/{limit}{how} waiting={len(self._waiters)}>"

    @property
    def discovered(self) -> bool:
        return not self.opening and self.limit is not None and self.limit != self.configured

    @property
    def known_limit(self) -> int | None:
        """The limit to show: ``None`` while opening with no configured one.  (A new provider
        meets a growing handful of calls first, like TCP's slow start, but that opening is not a
        limit it has shown.)"""
        return None if self.opening and self.configured is None else self.limit

    def _open(self) -> bool:
        if self._single:
            return self.in_flight < 1
        return self.limit is None or self.in_flight < self.limit

    def single(self, single: bool) -> None:
        """One call at a time while ``single`` (see :class:`~playbook.providers.limits.allowance.Allowance`),
        else as the limit says: lifted, it lets waiters in."""
        if single != self._single:
            self._single = single
            if not single:
                self._wake()

    def enter(self) -> bool:
        """Take room for one more call if there is some now, without waiting (the hot path)."""
        if self._waiters or not self._open():
            return False
        self.in_flight += 1
        return True

    def wait(self, turn: asyncio.Future[bool]) -> None:
        """Queue ``turn`` for room: it is counted in and handed over (:meth:`handed`) when room
        frees, in order, or dropped by :meth:`kick`."""
        self._waiters.append(turn)

    def handed(self) -> list[asyncio.Future[bool]]:
        """The waiters let in since the last ask, each already counted in flight: the owner wakes
        them with True (outside its lock), or gives their room back if they are gone."""
        handed = self._handed
        if handed:
            self._handed = []
        return handed

    def kick(self) -> list[asyncio.Future[bool]]:
        """Let every waiter go without room (a hold arrived): the owner wakes them with False."""
        kicked = [turn for turn in self._waiters if not turn.done()]
        self._waiters.clear()
        return kicked

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._open():
            turn = waiters.popleft()
            if not turn.done():  # a waiter cancelled meanwhile gives its turn to the next
                self.in_flight += 1  # counted here, so no later arrival takes the room first
                self._handed.append(turn)

    def _set(self, limit: int | None) -> None:
        if limit is not None and self.configured is not None:
            limit = min(limit, self.configured)
        probed = self._probed_from
        if probed is not None and limit is not None and limit <= probed:
            # the last probe was refused back to where it began: the next waits twice as long
            self._probe, self._probed_from = min(2 * self._probe, self.PROBE_MAX), None
        if limit == self.configured:
            limit = self.configured
        self.limit = limit
        self._wake()

    def success(self, level: int, now: float, sent_at: float = math.inf) -> bool:
        """A call sent at ``level`` (at ``sent_at``) went through; True when the limit changed."""
        oks = self._oks
        oks.append((now, level))
        while oks[0][0] < now - self.HORIZON:
            oks.popleft()
        self._blind = False
        if self._probed_from is not None and level > self._probed_from:
            self._probe, self._probed_from = self.PROBE, None  # the probe found room
        limit = self.limit
        if limit is None or (limit == self.configured and not self.opening):
            return False
        if self.opening:  # growing by one per success says nothing worth showing until it ends
            if limit + 1 < min(self.configured or self.OPEN, self.OPEN):
                self._set(limit + 1)
                return False
            self.opening = False
            self._set(self.configured)
            return True
        if level > limit and sent_at >= self._changed:  # sent before the limit fell: an old level
            self._set(limit + 1)
        elif level == limit and now - self._changed >= self._probe:
            self._changed, self._probed_from = now, limit
            self._set(limit + max(1, limit // 4))
        else:
            return False
        return True

    def busy(self, level: int, holding: int, now: float) -> bool:
        """A call sent at ``level`` was refused for want of room without a hint (a 503 from a
        local server whose short queue is full) while ``holding`` other calls were still out:
        those are what the server holds (of a burst refused together, the last answered reads
        it, the others' refusals being back by then), though a level alone is no measure of it,
        as refusals come back at once and a call sent among many refused ones still finds room.
        So the limit comes down to them.  It is a verdict on concurrency only when the call
        filled the window or went above every level that went through lately (a request that
        fails on its own, sent among them, is not one; one that filled the window fails again
        at a lower level, and its standing says so), and only while calls go through or others
        are still out (a run's first calls): with neither it is an outage's failure, not a
        bound's (the provider's health judges it; in an outage the bound falls to one call,
        whose refusal is then judged so)."""
        oks = self._oks
        while oks and oks[0][0] < now - self.HORIZON:
            oks.popleft()
        top = max((lvl for _, lvl in oks), default=0)
        filled = level > top or (self.limit is not None and level >= self.limit)
        if not (filled and (top or holding)):
            return False
        self.opening = False
        self._changed = now
        limit = max(1, holding)
        if self.limit is None or limit < self.limit:
            self._set(limit)
        return True

    def refused(self, level: int, now: float, *, hinted: bool = False) -> bool:
        """A call sent at ``level`` got a 429 (``hinted``: saying when to come back); True when
        that is a verdict on concurrency (the limit is set), False when it is the rate's."""
        oks = self._oks
        while oks and oks[0][0] < now - self.HORIZON:
            oks.popleft()
        top = max((lvl for _, lvl in oks), default=0)
        if hinted:
            # A time to come back is a rate's or a quota's answer: a slot in flight frees in no
            # time anyone could name.  (Calls sent in a burst make a rate look like a level.)
            if top:  # what went through lately says the window was not what refused it
                self.opening = False
                self._set(self.configured)
            return False
        self.opening = False
        self._changed = now
        if not top:
            # Nothing went through lately, so no level to read: calls sent together reach the
            # provider in any order.  Halve the window, once until something goes through.
            if not self._blind:
                self._blind = True
                self._set(max(1, (self.limit if self.limit is not None else level) // 2))
            return True
        if level > top:
            self._set(top)
            return True
        if self.discovered and self.limit is not None and level >= self.limit:
            # At the limit read before: the provider counts a call until its answer has left, so
            # a level that went through once (an answer in transit) may not the next time.
            self._set(max(1, level - 1))
            return True
        return False
