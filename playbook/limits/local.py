"""The limiter whose state lives in this process: :class:`~playbook.limits.pace.Pace` (GCRA and
AIMD) and :class:`~playbook.limits.gates.Window` (calls in flight), on the running loop's clock.

Calls waiting for a paced slot queue in order and one timer lets them out a slot at a time, so
a rate that rises while they wait speeds them up at once, and a hold stops them where they are.
"""

from __future__ import annotations

import asyncio
from collections import deque

from .base import Permit
from .gates import Window
from .pace import Pace

__all__ = ["LocalLimiter", "token_burst"]


class LocalLimiter:
    """``LocalLimiter(rate, burst, concurrency, tokens=None)``: the
    :class:`~playbook.limits.base.Limiter` of one process.  ``rate`` in calls a second (None:
    discovered from 429s); ``tokens`` in tokens a second (None: calls are not weighed)."""

    __slots__ = ("pace", "tokens", "window", "hold_until", "in_flight", "_loop", "_waiters", "_queued", "_timer")

    def __init__(
        self, rate: float | None = None, burst: int | None = None, concurrency: int | None = None, tokens: float | None = None
    ) -> None:
        self.pace = Pace(rate, burst)
        self.tokens = _token_pace(tokens) if tokens is not None else None
        self.window = Window(concurrency)
        self.hold_until = 0.0  # loop clock
        self.in_flight = 0  # calls on the wire
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[tuple[asyncio.Future[None], float]] = deque()  # (slot, weight), in order
        self._queued = 0.0  # the waiters' weights, summed
        self._timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        tokens = f" tokens={self.tokens.rate:.4g}/s" if self.tokens is not None else ""
        return f"<LocalLimiter {self.pace!r}{tokens} {self.window!r} on_wire={self.in_flight} hold_until={self.hold_until:.3f}>"

    @property
    def rate(self) -> float | None:
        return self.pace.rate

    @property
    def in_flight_limit(self) -> int | None:
        return self.window.known_limit

    @property
    def token_rate(self) -> float | None:
        return self.tokens.rate if self.tokens is not None else None

    def expected_wait(self, weight: float) -> float:
        loop = self._loop
        if loop is None or (self.pace.rate is None and self.tokens is None):
            return 0.0
        wait = self._delay(loop.time(), weight)
        if self._waiters:  # the queue ahead goes first
            if self.pace.rate is not None:
                wait += len(self._waiters) / self.pace.rate
            if self.tokens is not None and self.tokens.rate is not None:
                wait += self._queued / self.tokens.rate
        return wait

    def learn(self, requests: float | None, tokens: float | None) -> bool:
        changed = requests is not None and self.pace.learn(requests)
        if tokens is not None:
            if self.tokens is None:
                self.tokens = _token_pace(tokens)
                changed = True
            elif self.tokens.learn(tokens):
                self.tokens.burst = token_burst(tokens)
                changed = True
        if changed:
            self._rearm()
        return changed

    async def acquire(self, weight: float = 1.0) -> Permit | None:
        loop = asyncio.get_running_loop()
        self._bind(loop)
        window = self.window
        if not window.enter():
            await window.acquire(loop)
        try:
            if self.hold_until > loop.time():
                window.release()
                return None  # a hold arrived while this call waited at the gate
            if self.pace.rate is not None or self.tokens is not None:
                await self._paced(loop, weight)
                if self.hold_until > loop.time():
                    window.release()
                    return None  # a hold arrived while this call waited for its slot
            else:
                self.pace.take(loop.time())
        except BaseException:
            window.release()
            raise
        self.in_flight += 1
        return Permit(weight, self.in_flight, loop.time())

    async def settle(self, permit: Permit, actual: float | None = None) -> bool:
        if not self._landed(permit):
            return False
        now = asyncio.get_running_loop().time()
        if actual is not None and actual != permit.weight:
            if self.tokens is not None:
                self.tokens.charge(actual - permit.weight)
                self._rearm()  # a call that used fewer tokens than estimated lets the next one go sooner
            permit.weight = actual
        self.window.release()
        grew = self.window.success(permit.level, now)
        if self.pace.success(now):
            self._rearm()
            grew = True
        return grew

    async def refused(self, permit: Permit, *, hinted: bool) -> bool:
        if not self._landed(permit):
            return False
        now = asyncio.get_running_loop().time()
        try:
            if permit.level and self.window.refused(permit.level, now, hinted=hinted):
                return True
            if hinted and self.tokens is not None:
                return False  # a token limit's refusal, most likely: its hold says when, the request rate is not to blame
            if self.pace.limited(now, permit.sent_at, pending=self.in_flight):
                self._rearm()
                return True
            return False
        finally:
            self.window.release()

    async def release(self, permit: Permit) -> None:
        if self._landed(permit):
            self.window.release()

    async def hold(self, until: float) -> float:
        if until > self.hold_until:
            self.hold_until = until
            self.pace.hold(until, asyncio.get_running_loop().time())
        return self.hold_until

    def _landed(self, permit: Permit) -> bool:
        """The call is off the wire; False when its permit was given back already."""
        landed = permit.land()
        self.in_flight -= landed
        return landed

    # -- the paced queue ---------------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # Bound lazily: a notebook may run one map under asyncio.run and the next in the kernel's loop.
        if self._loop is not loop:
            self._loop = loop
            self._waiters, self._queued, self._timer = deque(), 0.0, None

    def _delay(self, now: float, weight: float) -> float:
        """Seconds until a call of ``weight`` tokens has both a request slot and its tokens."""
        wait = self.pace.delay(now)
        return wait if self.tokens is None else max(wait, self.tokens.delay(now, weight))

    def _take(self, now: float, weight: float, *, queued: bool = False) -> None:
        self.pace.take(now, queued=queued)
        if self.tokens is not None:
            self.tokens.take(now, queued=queued, weight=weight)

    async def _paced(self, loop: asyncio.AbstractEventLoop, weight: float) -> None:
        """Wait for a slot at the current rate (and for the call's tokens)."""
        if not self._waiters:
            now = loop.time()
            if self._delay(now, weight) <= 0:
                self._take(now, weight)
                return
        slot = loop.create_future()
        self._waiters.append((slot, weight))
        self._queued += weight
        self._arm(loop)
        await slot

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None and self._waiters:
            self._timer = loop.call_later(self._delay(loop.time(), self._waiters[0][1]), self._release, loop)

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now, waiters = loop.time(), self._waiters
        while waiters and self._delay(now, waiters[0][1]) <= 0:
            slot, weight = waiters.popleft()
            self._queued -= weight
            if not slot.done():  # a cancelled waiter gives its turn to the next
                self._take(now, weight, queued=True)
                slot.set_result(None)
        self._arm(loop)

    def _rearm(self) -> None:
        """The rate changed: the next slot may be due sooner than the timer thinks."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self._arm(self._loop)


def _token_pace(rate: float) -> Pace:
    return Pace(rate, token_burst(rate))


def token_burst(rate: float) -> int:
    """Tokens are paced evenly, with at most half a second's worth at once: providers enforce a
    per-minute token limit over much shorter periods (a minute's worth sent at once is refused),
    and calls that leave evenly may still arrive together, or use more tokens than estimated."""
    return max(1, int(rate / 2))
