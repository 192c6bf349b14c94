"""Providers: one per upstream account, the unit of concurrency, rate limits and holds.

Every call that misses its receipt goes through its provider's governor on the way to the
transport (:meth:`Provider.dispatch`)::

    down?  ── the provider refuses connections or keeps failing: ProviderExhausted("down") at
       │      once (the row parks, a waterfall tries its next leg), but one probe call at a time
    hold?  ── short (<= 1 s): wait in place; long: suspend the row (Held); past the row's
       │      wait budget: ProviderExhausted (a waterfall tries its next leg, a row parks)
    gate   ── calls in flight: ``concurrency`` and/or the limit discovered from 429s (gates.Window)
    pace   ── GCRA slot at the current rate (limits.Pace)
    send   ── 2xx: success, the rate and the window recover
              429: a verdict on concurrency (the window shrinks) or on the rate (cut once per
                   episode); hold the provider until Retry-After / reset, or back off this call
              5xx, timeouts, connection errors: a failure of this call: retried after its hint
                   or a backoff, up to ``retries``; the provider holds only when failures
                   dominate, and goes *down* after several in a row (gates.Health)
              401/402/403: RunFatal, straight up

The governor's clock is the running loop's (``loop.time()``): a test loop with virtual time
drives every wait here, and the pure primitives in :mod:`playbook.limits` take ``now``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .errors import PlayDefinitionError, ProviderExhausted, ProviderUnavailable, RunFatal, ToolError
from .gates import Health, Window
from .limits import Backoff, Pace
from .models import ProviderDown, ProviderHoldLifted, ProviderHoldSet, ProviderUp, RateChanged, time_of_day
from .signals import Held, WaitBudget

__all__ = ["HEADROOM", "IN_PLACE", "Provider", "Ticket"]

T = TypeVar("T")

IN_PLACE = 1.0  # holds up to this long are waited out by the call; longer ones suspend the row
OWN_IN_PLACE = 0.2  # the same for a call's own retry (its row's worker can serve another row meanwhile)
# Calls are paced a little under the configured rps: sent at exactly the provider's limit, the
# network's jitter alone turns some of them into 429s, and each costs a hold and a rate cut.
HEADROOM = 0.98


def _check(name: str, option: str, value: object, *, integer: bool = False, zero: bool = False, optional: bool = True) -> None:
    if value is None and optional:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        what = "whole number" if integer else "finite number"
        bound = ">= 0" if zero else "> 0"
        none = " or None" if optional else " (waiting and retrying are always bounded)"
        raise PlayDefinitionError(f"Provider {name!r}: {option} must be a {what} {bound}{none}, not {value!r}")


class Ticket:
    """One logical call's standing with its provider, kept across the row's replays."""

    __slots__ = ("tool", "budget", "tries", "refusals", "not_before", "suspend")

    def __init__(self, tool: str, budget: WaitBudget, *, suspend: bool = True) -> None:
        self.tool = tool
        self.budget = budget
        self.tries = 0  # transient failures so far
        self.refusals = 0  # 429s without a hint so far
        self.not_before = 0.0  # this call's own backoff (loop clock)
        self.suspend = suspend  # may this call's own long backoff suspend its row (False: wait in place)

    def __repr__(self) -> str:
        return f"<Ticket {self.tool!r} tries={self.tries} refusals={self.refusals} {self.budget!r}>"


class Provider:
    """An upstream account: ``pb.Provider("acme", rps=20, concurrency=8)``.

    ``rps`` and ``burst`` pace the calls, at 98% of ``rps`` (without ``rps`` the rate is
    discovered from 429s);
    ``concurrency`` bounds calls in flight; ``retries`` bounds retries of transient failures;
    ``max_wait`` (seconds) is how long a row may wait on this provider's holds before it parks.
    """

    __slots__ = (
        "name", "rps", "burst", "concurrency", "account", "max_wait", "retries", "pace", "backoff", "window", "health",
        "in_flight", "sent", "refused", "failed", "last_status", "hold_until", "hold_wall", "_holding", "_lift_timer",
        "_loop", "_waiters", "_timer", "_listeners", "down_error", "probe_at",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        *,
        rps: float | None = None,
        burst: int | None = None,
        concurrency: int | None = None,
        account: str = "default",
        max_wait: float = 120.0,
        retries: int = 4,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise PlayDefinitionError(f"Provider name must be a non-empty string, not {name!r}")
        _check(name, "rps", rps)
        _check(name, "burst", burst, integer=True)
        _check(name, "concurrency", concurrency, integer=True)
        _check(name, "max_wait", max_wait, zero=True, optional=False)
        _check(name, "retries", retries, integer=True, zero=True, optional=False)
        if not isinstance(account, str) or not account:
            raise PlayDefinitionError(f"Provider {name!r}: account must be a non-empty string, not {account!r}")
        self.name = name
        self.rps = rps
        self.burst = burst
        self.concurrency = concurrency
        self.account = f"{name}:{account}"
        self.max_wait = float(max_wait)
        self.retries = retries
        self.pace = Pace(rps * HEADROOM if rps is not None else None, burst)
        self.backoff = Backoff()
        self.window = Window(concurrency)
        self.health = Health()
        self.in_flight = 0  # calls on the wire
        self.sent = 0  # requests sent
        self.refused = 0  # 429s
        self.failed = 0  # transient failures (5xx, timeouts, connection errors)
        self.last_status: int | None = None
        self.hold_until = 0.0  # loop clock
        self.hold_wall = 0.0  # the same moment in epoch seconds
        self._holding = False
        self._lift_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()  # calls waiting for a paced slot, in order
        self._timer: asyncio.TimerHandle | None = None
        self._listeners: list[Callable[[Any], None]] = []
        self.down_error: str | None = None  # the failure that took it down, in words
        self.probe_at = 0.0  # epoch seconds: when the next probe may go while down

    def __repr__(self) -> str:
        limits = [f"{k}={getattr(self, k)!r}" for k in ("rps", "burst", "concurrency") if getattr(self, k) is not None]
        rate = "unlimited" if self.pace.rate is None else f"{self.pace.rate:.3g}/s"
        window = self.in_flight_limit
        found = f" in_flight_limit={window}" if window is not None and window != self.concurrency else ""
        state = f" down ({self.down_error})" if self.down else f" held until {time_of_day(self.hold_wall)}" if self.held else ""
        head = " ".join([repr(self.name), *limits])
        return f"<Provider {head} rate={rate}{found} in_flight={self.in_flight} 429s={self.refused}{state}>"

    @property
    def rate(self) -> float | None:
        """The current sending rate (calls per second); ``None`` while unlimited."""
        return self.pace.rate

    @property
    def in_flight_limit(self) -> int | None:
        """Calls in flight it allows now: ``concurrency``, or the window discovered from 429s that
        track calls in flight; ``None`` while no limit is known (a new provider meets a growing
        handful of calls first, like TCP's slow start, but that is not a limit)."""
        window = self.window
        return None if window.opening and window.configured is None else window.limit

    @property
    def down(self) -> bool:
        """True while the provider refuses connections or keeps failing: rows that need it park
        ("down") and one probe call at a time tests whether it is back."""
        return self.health.down

    @property
    def held(self) -> bool:
        """True while a hold the provider asked for is in force."""
        return self._holding and self.hold_wall > time.time()

    def subscribe(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``listener(event)`` on hold set / lifted and rate changes; returns an unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, event: Any) -> None:
        for listener in self._listeners:
            listener(event)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # Bound lazily: a notebook may run one map under asyncio.run and the next in the kernel's loop.
        if self._loop is not loop:
            self._loop = loop
            self._waiters, self._timer = deque(), None

    async def _paced(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a slot at the current rate.  Waiters queue in order and a timer lets them out
        one slot at a time, so a rate that rises while they wait speeds them up at once."""
        pace = self.pace
        if not self._waiters:
            now = loop.time()
            if pace.delay(now) <= 0:
                pace.take(now)
                return
        slot = loop.create_future()
        self._waiters.append(slot)
        self._arm(loop)
        await slot

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None and self._waiters:
            self._timer = loop.call_later(self.pace.delay(loop.time()), self._release, loop)

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now, waiters, pace = loop.time(), self._waiters, self.pace
        while waiters and pace.delay(now) <= 0:
            slot = waiters.popleft()
            if not slot.done():  # a cancelled waiter gives its turn to the next
                pace.take(now, queued=True)
                slot.set_result(None)
        self._arm(loop)

    def _rearm(self, loop: asyncio.AbstractEventLoop) -> None:
        """The rate changed: the next slot may be due sooner than the timer thinks."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm(loop)

    # -- the governor ----------------------------------------------------------------------

    async def dispatch(self, send: Callable[[], Awaitable[T]], ticket: Ticket | None = None) -> T:
        """Send one call through the governor: down, hold, gate, pace, send; retry what may be retried."""
        loop = asyncio.get_running_loop()
        if ticket is None:
            ticket = Ticket("", WaitBudget(self.max_wait), suspend=False)
        self._bind(loop)
        while True:
            now = loop.time()
            until = max(self.hold_until, ticket.not_before)
            if until > now:
                await self._wait(until, now, ticket)
                continue
            if self._holding:
                self._lift()
            health = self.health
            if health.down and health.probing:
                await asyncio.shield(health.outcome(loop))  # the probe's word, then decide
                continue
            probe = health.down and self._probe(now, ticket)
            try:
                result, level, sent_at = await self._send(send, loop, ticket)
            finally:
                if probe:
                    health.unprobe()  # a no-op once the probe's outcome was recorded
            if result is _AGAIN:
                continue
            now = loop.time()
            if health.success(sent_at):
                self._emit(ProviderUp(self.name))
            grew = self.window.success(level, now)
            if self.pace.success(now):
                self._rearm(loop)
                grew = True
            if grew:
                self._emit(RateChanged(self.name, self.pace.rate, self.in_flight_limit))
            return result  # type: ignore[return-value]

    def _probe(self, now: float, ticket: Ticket) -> bool:
        """While down: this call goes as the probe, or its row parks at once."""
        if self.health.may_probe(now):
            return True
        raise self._down(ticket, now)

    async def _send(self, send: Callable[[], Awaitable[T]], loop: asyncio.AbstractEventLoop, ticket: Ticket) -> tuple[Any, int, float]:
        """One try through gate and pace: ``(result, level, sent_at)``, or ``_AGAIN`` first to go round again."""
        window = self.window
        if not window.enter():
            await window.acquire(loop)
        sent_at, level = loop.time(), 0
        try:
            if self.hold_until > loop.time():
                return _AGAIN, 0, 0.0  # a hold arrived while this call waited at the gate
            if self.pace.rate is not None:
                await self._paced(loop)
                if self.hold_until > loop.time():
                    return _AGAIN, 0, 0.0  # a hold arrived while this call waited for its slot
            else:
                self.pace.take(loop.time())
            sent_at = loop.time()
            self.in_flight += 1
            level = self.in_flight
            self.sent += 1
            try:
                return await send(), level, sent_at
            finally:
                self.in_flight -= 1
        except RunFatal:
            raise
        except Exception as exc:  # noqa: BLE001 - classified here, re-raised when final
            if not self._retry(exc, sent_at, level, loop.time(), ticket):
                raise
            return _AGAIN, 0, 0.0
        finally:
            window.release()

    async def _wait(self, until: float, now: float, ticket: Ticket) -> None:
        """Wait for a hold or this call's backoff: in place, by suspending the row, or not at all."""
        wait = until - now
        budget = ticket.budget
        if wait > budget.left + 1e-9:
            wall = time.time() + wait
            when = time_of_day(wall)
            raise ProviderExhausted(
                f"tool {ticket.tool!r}: provider {self.name!r} holds calls until {when} ({wait:.0f}s from now), "
                f"past this row's wait budget ({max(budget.left, 0):.0f}s left of max_wait)",
                tool=ticket.tool or None,
                provider=self.name,
                status=self.last_status,
                retry_at=wall,
            )
        # A call that cannot suspend its row (a batch serves many) still steps aside for a long
        # provider hold; only its own backoff, bounded by the retries, is waited out in place.
        # A row whose own retry waits more than a moment gives its worker up meanwhile.
        own = until > self.hold_until
        if wait <= (OWN_IN_PLACE if own and ticket.suspend else IN_PLACE) or (not ticket.suspend and own):
            budget.left -= wait
            await asyncio.sleep(wait)
            return
        raise Held(self, until, time.time() + wait, self.last_status, budget)

    def _retry(self, exc: Exception, sent_at: float, level: int, now: float, ticket: Ticket) -> bool:
        """Classify a failed call; True to try it again (after any hold or backoff it set)."""
        if isinstance(exc, ToolError):
            status, retryable, hint = exc.status, exc.retryable, exc.retry_after
        else:  # a Python tool's own timeouts and dropped connections are transient too
            status, retryable, hint = None, isinstance(exc, (TimeoutError, ConnectionError)), None
        if not retryable:
            if self.health.success(sent_at):  # an answer, if not the one wanted: the provider is up
                self._emit(ProviderUp(self.name))
            return False
        self.last_status = status
        if hint is not None and hint <= 0:
            hint = None  # "retry after 0s" would spin: back off instead
        if status == 429:
            self._refused(sent_at, level, now, hint, ticket)
            return True
        return self._failed(exc, now, hint, ticket)

    def _refused(self, sent_at: float, level: int, now: float, hint: float | None, ticket: Ticket) -> None:
        """A 429: the provider is up and busy.  Shrink the window or cut the rate, then wait."""
        self.refused += 1
        if self.health.success(sent_at):
            self._emit(ProviderUp(self.name))
        if level and self.window.refused(level, now, hinted=hint is not None):
            self._emit(RateChanged(self.name, self.pace.rate, self.in_flight_limit))
        elif self.pace.limited(now, sent_at, pending=self.in_flight):
            self._rearm(asyncio.get_running_loop())
            self._emit(RateChanged(self.name, self.pace.rate, self.in_flight_limit))
        if hint is not None:
            self._hold(now + hint, hint, 429)
        else:
            ticket.not_before = now + self.backoff.delay(ticket.refusals)
            ticket.refusals += 1

    def _failed(self, exc: Exception, now: float, hint: float | None, ticket: Ticket) -> bool:
        """A 5xx, a timeout, a refused connection: a failure of this call, not a verdict on the rate."""
        self.failed += 1
        ticket.tries += 1
        health = self.health
        if health.failure(now):
            self.down_error = _describe(exc)
            self._emit(ProviderDown(self.name, self.down_error))
        if health.down:
            raise self._down(ticket, now, exc)
        if ticket.tries > self.retries:
            raise self._unavailable(exc, ticket, f"gave up after {ticket.tries} tries")
        wait = hint if hint is not None else self.backoff.delay(ticket.tries - 1)
        if health.dominated():
            self._hold(now + wait, wait, self.last_status)  # most calls fail: spare the provider
        else:
            ticket.not_before = now + wait
            if wait > ticket.budget.left:
                raise self._unavailable(exc, ticket, "the next try would pass the wait budget")
        return True

    def _down(self, ticket: Ticket, now: float, exc: Exception | None = None) -> ProviderExhausted:
        wall = time.time() + max(0.0, self.health.probe_at - now)
        self.probe_at = wall
        error = ProviderExhausted(
            f"tool {ticket.tool!r}: provider {self.name!r} is down ({self.down_error}); "
            f"the row waits for a rerun or run.retry() (the next probe goes at {time_of_day(wall)})",
            tool=ticket.tool or None, provider=self.name, status=self.last_status, retry_at=wall, reason="down",
        )  # fmt: skip
        error.__cause__ = exc
        return error

    def _unavailable(self, exc: Exception, ticket: Ticket, why: str) -> ProviderUnavailable:
        error = ProviderUnavailable(
            f"provider {self.name!r} is unavailable: {exc} ({why})", tool=ticket.tool or None, provider=self.name, status=self.last_status
        )
        error.__cause__ = exc
        return error

    def _hold(self, until: float, seconds: float, status: int | None) -> None:
        """Hold every call to this provider until ``until`` (loop clock)."""
        if until <= self.hold_until:
            return
        loop = asyncio.get_running_loop()
        self.hold_until = until
        self.hold_wall = time.time() + seconds
        self._holding = True
        self.pace.hold(until, loop.time())
        self._emit(ProviderHoldSet(self.name, self.hold_wall, status))
        # Say when it ends even if no call comes to notice (every waiting row may have parked).
        if self._lift_timer is not None:
            self._lift_timer.cancel()
        self._lift_timer = loop.call_later(seconds, self._lift)

    def _lift(self) -> None:
        if self._lift_timer is not None:
            self._lift_timer.cancel()
            self._lift_timer = None
        if self._holding:
            self._holding = False
            self._emit(ProviderHoldLifted(self.name))


_AGAIN: Any = object()  # a try that must go round the governor again


def _describe(exc: BaseException) -> str:
    """A failure in a few words: what a user sees next to a down provider (which is not one tool's:
    a ToolError's "tool 'x': " goes)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ToolError) and exc.tool and text.startswith(prefix := f"tool {exc.tool!r}: "):
        text = text[len(prefix) :]
    return text if len(text) <= 200 else text[:197] + "..."
