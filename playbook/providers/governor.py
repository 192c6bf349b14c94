"""The governor: the state machine every call that misses its receipt goes through on its way to
the transport (:meth:`Governor.dispatch`), acting over its provider's limiter::

    down?  ── the provider refuses connections or keeps failing: one call at a time goes as
       │      the probe; the others wait for the next probe like a hold (in place, or the row
       │      steps aside), and past the row's wait budget ProviderExhausted("down") parks the
       │      row (a waterfall's leg does not wait: it tries its next leg at once)
    hold?  ── short (<= 1 s): wait in place; long: suspend the row (OnHold); past the row's
       │      wait budget: ProviderExhausted (a waterfall tries its next leg, a row parks)
    permit ── the limiter's concurrency slot and rate slot (limits.Limiter.acquire)
    send   ── 2xx: success, the rate and the window recover (settle)
              429: a lone one (jitter: a short hint among many calls let in) waits its hint
                   alone; else a verdict on concurrency (the window shrinks) or on the rate
                   (cut once per episode): hold the provider until Retry-After / reset, or
                   back off this call
              529 (an overload: Anthropic's overloaded_error): the provider's, not the call's:
                   every call waits (a hold, its backoff growing while overloads go on); no
                   try is used up, the row's wait budget bounds it (past it the row parks)
              a call's first 503 without a hint while others go through (a local server's
                   queue is full): a bound on calls in flight, as an unhinted 429 is (the calls
                   sent before it, still out); the provider is up, the call tries again
              a quota no retry beats (ToolError.quota: a per-day quota spent): the provider
                   holds until its reset and the rows park at once, naming it (never retried)
              5xx, timeouts, connection errors: a failure of this call: retried after its hint
                   or a backoff, up to ``retries``; the provider holds only when failures
                   dominate, and goes *down* after several in a row (limits.Health); a call
                   failing again while others are answered fails on its own (limits.Standing)
              401/402/403: RunFatal, straight up (a pool of keys retires the key: providers.pool)

What it keeps is this process's: the provider's health, its counters, the events it tells
subscribers.  Rate, calls in flight and holds are the limiter's, in this process or shared.  Its
clock is the running loop's (``loop.time()``): a loop with virtual time drives every wait here.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from playbook._internal.flow import OnHold, WaitBudget
from playbook._internal.words import time_of_day
from playbook.errors import ProviderExhausted, ProviderUnavailable, RunFatal, ToolError
from playbook.events import ProviderDown, ProviderUp, RateChanged
from playbook.providers.holds import Holds
from playbook.providers.limits import (
    HEADROOM,
    LONE,
    Announced,
    Backoff,
    Health,
    Limiter,
    Permit,
    Rates,
    Verdict,
)
from playbook.providers.limits.waiters import Listeners
from playbook.providers.limits.weights import parts
from playbook.providers.sends import PerMinute, Sends
from playbook.providers.status import Budget, ProviderStatus
from playbook.providers.ticket import Described, Elsewhere, Ticket

__all__ = ["IN_PLACE", "OWN_IN_PLACE", "Elsewhere", "Governor", "Ticket"]

T = TypeVar("T")

IN_PLACE = 1.0  # holds up to this long are waited out by the call; longer ones suspend the row
OWN_IN_PLACE = 0.2  # the same for a call's own retry (its row's worker can serve another row meanwhile)
QUOTA_HOLD = 3600.0  # seconds a spent quota holds the provider when its refusal does not say until when
OVERLOADED = 529  # Anthropic's overloaded_error
# The longest wait between tries of an overloaded provider (as Anthropic's and OpenAI's own clients
# cap theirs): the whole provider idles for what a wait outlasts the overload, and a try while it
# goes on costs only an unbilled 529 per call in flight.
OVERLOAD_CAP = 8.0


class Governor(Holds):
    """The live state of one :class:`~playbook.providers.provider.Provider` in this process."""

    __slots__ = (
        "provider",
        "limiter",
        "backoff",
        "health",
        "sends",
        "minute",
        "refused",
        "failed",
        "last_status",
        "down_error",
        "probe_at",
        "tokens",
        "elsewhere",
        "retired",
        "window",
        "spent",
        "overloads",
        "_overload_t",
        "_listeners",
        "_lock",
        "__weakref__",  # Providers of one description find it in a weak registry
    )

    def __init__(
        self, provider: Described, limiter: Limiter, window: tuple[int, float] | None = None
    ) -> None:
        super().__init__()
        self.provider = provider
        self.limiter = limiter
        self.window = window  # the configured window=(calls, seconds), for what it allows over a long run
        self.backoff = Backoff()
        self.health = Health()
        self.sends = Sends()  # requests sent, and the most within a second
        self.minute = PerMinute()  # weighed requests sent over the last minute (a display's clock)
        self.refused = 0  # 429s
        self.failed = 0  # transient failures (5xx, timeouts, connection errors)
        self.last_status: int | None = None
        self.down_error: str | None = None  # the failure that took it down, in words
        self.probe_at = 0.0  # epoch seconds: when the next probe may go while down
        # (monotonic time, input tokens, output tokens) of answered weighed calls, a minute's worth
        self.tokens: deque[tuple[float, float, float]] = deque()
        # Set by the pool this governor is one key of (None: its provider's only key): a call that
        # would wait here asks it first whether another key could take the call sooner
        # (Pool.elsewhere). A callback, not the pool: the pool is made of governors.
        self.elsewhere: Callable[[Governor, Ticket, float], None] | None = None
        self.retired: str | None = None  # why its pool took this key out for the run (None: in use)
        self.spent: tuple[str, float] | None = None  # a quota no retry beats, and its reset (loop clock)
        self.overloads = 0  # overload episodes in a row: the next one's backoff
        self._overload_t = -math.inf  # loop clock: when the latest overload's backoff began
        self._listeners = Listeners()
        # threads that each run a map() on a loop of their own share this provider
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Governor {self.provider.name!r} sent={self.sends.count} 429s={self.refused} failed={self.failed} {self.limiter!r}>"

    @property
    def name(self) -> str:
        return self.provider.name

    @property
    def down(self) -> bool:
        return self.health.down

    @property
    def probe_t(self) -> float:
        """Loop clock: when the next probe may go while down."""
        return self.health.probe_t

    def retest(self) -> None:
        """A new run: a down provider is tried again at once."""
        self.health.retest()

    def status(self, name: str | None = None, retired: str | None = None) -> ProviderStatus:
        """Its state now, as a snapshot (``name``, ``retired``: a pool's key's)."""
        limiter = self.limiter
        tokens, tpm = self.tokens_per_minute()
        budgets = self.budgets()
        return ProviderStatus(
            name=name or self.name,
            down=self.health.down,
            down_error=self.down_error,
            probe_at=self.probe_at,
            held=self.held,
            hold_until_at=self.hold_until_at,
            last_status=self.last_status,
            rate=limiter.rate,
            in_flight_limit=limiter.in_flight_limit,
            in_flight=limiter.in_flight,
            refused=self.refused,
            tokens=tokens,
            tpm=tpm,
            sent=self.sends.count,
            failed=self.failed,
            retired=retired,
            window=self.window,
            busiest=self.sends.busiest,
            budgets=budgets,
        )

    def subscribe(self, listener: Callable[[Any], None], *, anywhere: bool = False) -> Callable[[], None]:
        """Tell ``listener`` this provider's events; returns the unsubscribe function.  Subscribed
        on a running loop, it hears them on that loop, whichever thread's call they come from
        (``anywhere``: at once, on the thread whose call they come from)."""
        return self._listeners.add(listener, anywhere=anywhere)

    def _rate_changed(self) -> None:
        self.emit(RateChanged(self.name, self.limiter.rate, self.limiter.in_flight_limit))

    # -- the loop ------------------------------------------------------------------------------

    async def dispatch(
        self, send: Callable[[], Awaitable[T]], ticket: Ticket | None = None, *, weight: float = 1.0
    ) -> T:
        """Send one call through the governor: down, hold, permit, send; retry what may be retried.
        ``weight``: the call's estimated tokens (the ticket's, when it carries one)."""
        loop = asyncio.get_running_loop()
        if ticket is None:
            ticket = Ticket("", WaitBudget(self.provider.max_wait), suspend=False)
        if ticket.weight is not None:
            weight = ticket.weight
            self._fits(weight, ticket)
        while True:
            now = loop.time()
            self.notice_hold(now)
            until = max(self.limiter.hold_until_t, ticket.not_before)
            if until > now:
                if self.elsewhere is not None:
                    self.elsewhere(self, ticket, until - now)
                await self._wait(until, now, ticket)
                continue
            if self.holding:  # the hold is over: say so now, if no timer has yet
                self.lift()
            health = self.health
            if health.down and health.probing:
                if self.elsewhere is not None:
                    self.elsewhere(self, ticket, IN_PLACE)
                await asyncio.shield(health.outcome(loop))  # the probe's word, then decide
                continue
            self._paced_past_budget(weight, ticket)
            probe = health.down and health.may_probe(now)  # this call goes as the probe
            if health.down and not probe:
                if self.elsewhere is not None:
                    self.elsewhere(self, ticket, max(0.0, health.probe_t - now))
                await self._until_probe(now, ticket)
                continue
            try:
                result, permit = await self._send(send, loop, ticket, weight)
            finally:
                if probe:
                    health.unprobe()  # a no-op once the probe's outcome was recorded
            if permit is None:
                continue
            if health.success(permit.sent_at, ticket.standing, through=True):
                self.emit(ProviderUp(self.name))
            self.overloads = 0
            if await self.limiter.settle(permit, ticket.actual, ticket.left):
                self._rate_changed()
            if ticket.weight is not None:
                with self._lock:
                    self._metered(time.monotonic(), *parts(permit.weight))
            return result  # type: ignore[no-any-return]

    def _paced_past_budget(self, weight: float, ticket: Ticket) -> None:
        """A call whose rate or token slot is further away than its row may wait (a token debt
        of a minute after one huge prompt) parks its row, as a long hold would."""
        wait = self.limiter.expected_wait(weight)
        if wait > IN_PLACE and wait > ticket.budget.left + 1e-9:
            if self.elsewhere is not None:
                self.elsewhere(self, ticket, wait)
            raise self._past_budget("paces calls: this one could go at", wait, ticket)

    def _past_budget(self, what: str, wait: float, ticket: Ticket) -> ProviderExhausted:
        wall = time.time() + wait
        return ProviderExhausted(
            f"tool {ticket.tool!r}: provider {self.name!r} {what} {time_of_day(wall)} ({wait:.0f}s from now), "
            f"past this row's wait budget ({max(ticket.budget.left, 0):.0f}s left of max_wait)",
            tool=ticket.tool or None,
            provider=self.name,
            status=self.last_status,
            retry_at=wall,
        )

    def _fits(self, weight: float, ticket: Ticket) -> None:
        """A call weighing more tokens than a budget of the provider allows in a minute can never
        go (the provider refuses it too): it fails at once instead of waiting out a minute's worth."""
        input, output = parts(weight)
        rates = self.limiter.token_rates
        for name, rate, n in (
            ("tokens", rates.tokens, input + output),
            ("input tokens", rates.input, input),
            ("output tokens", rates.output, output),
        ):
            if rate is not None and n > rate * 60.0 / HEADROOM:
                fix = (
                    "lower max_tokens"
                    if name == "output tokens"
                    else "shorten the prompt or lower max_tokens"
                )
                raise ToolError(
                    f"tool {ticket.tool!r}: this call needs about {n:,.0f} {name}, more than provider {self.name!r} "
                    f"allows in a minute ({rate * 60.0 / HEADROOM:,.0f} {name}/min): {fix}",
                    tool=ticket.tool or None,
                    provider=self.name,
                )

    def learn(self, limits: Announced) -> None:
        """The provider announced its limits per minute (``x-ratelimit-limit-*``,
        ``anthropic-ratelimit-*-limit``): pace under them."""
        requests, *tokens = (n / 60.0 * HEADROOM if n else None for n in limits[:4])
        if self.limiter.learn(requests, Rates(*tokens)):
            self._rate_changed()

    def tokens_per_minute(self) -> tuple[float, float | None]:
        """Tokens answered over the last minute, and the token limit per minute (None: none)."""
        used, _, _ = self._used()
        limit = self.limiter.token_rate
        return used, (round(limit * 60.0 / HEADROOM, 6) if limit is not None else None)

    def budgets(self) -> tuple[Budget, ...]:
        """Each budget the provider's calls are paced under, by its own name, with what the last
        minute used of it: requests (when its limit is known), then tokens, input tokens and output
        tokens (those it has).  None at all for a provider with no token budget."""
        rates = self.limiter.token_rates
        if rates == Rates():
            return ()
        tokens, input, output = self._used()
        ceiling = self.limiter.ceiling
        shown = []
        if ceiling is not None:
            shown.append(Budget("requests", self.minute.count(time.monotonic()), _per_minute(ceiling)))
        for name, rate, used in zip(
            ("tokens", "input tokens", "output tokens"), rates, (tokens, input, output)
        ):
            if rate is not None:
                shown.append(Budget(name, used, _per_minute(rate)))
        return tuple(shown)

    def _used(self) -> tuple[float, float, float]:
        """Tokens answered over the last minute: all, input and output."""
        with self._lock:
            self._metered(time.monotonic(), 0.0, 0.0)  # a display's clock: views read it from anywhere
            input = sum(t for _, t, _ in self.tokens)
            output = sum(t for _, _, t in self.tokens)
        return input + output, input, output

    def _metered(self, now: float, input: float, output: float) -> None:
        meter = self.tokens
        if input or output:
            meter.append((now, input, output))
        while meter and meter[0][0] < now - 60.0:
            meter.popleft()

    async def _until_probe(self, now: float, ticket: Ticket) -> None:
        """While down, with another call due as the next probe: wait for it (in place when it is
        near, else the row steps aside until then) when it falls within the row's wait budget;
        past it, or for a waterfall's leg (which tries its next provider), the row parks."""
        wait = max(0.0, self.health.probe_t - now)
        budget = ticket.budget
        if ticket.falls_through or wait > budget.left + 1e-9:
            raise self._down(ticket, now)
        if wait <= IN_PLACE:
            budget.left -= wait
            await asyncio.sleep(wait)
            return
        raise OnHold(self.provider, now + wait, time.time() + wait, self.last_status, budget)

    async def _send(
        self, send: Callable[[], Awaitable[T]], loop: asyncio.AbstractEventLoop, ticket: Ticket, weight: float
    ) -> tuple[Any, Permit | None]:
        """One try: ``(result, permit)`` to settle, or ``(None, None)`` to go round again."""
        try:
            permit = await self.limiter.acquire(weight, max(IN_PLACE, ticket.budget.left))
        except ToolError as exc:  # the limiter's own state is out of reach: like a provider that is
            if not await self._retry(exc, None, loop.time(), ticket):
                raise
            return None, None
        if permit is None:
            return None, None  # a hold arrived while this call waited for its permit
        if self.retired is not None:  # its pool took this key out while the call waited for its slot
            await self.limiter.release(permit)
            raise Elsewhere
        self.sends.note(loop.time())
        if ticket.weight is not None:  # a call weighed by its tokens: its requests budget is shown
            self.minute.note(time.monotonic())
        try:
            result = await send()
        except RunFatal:
            await self.limiter.release(permit)
            raise
        except Exception as exc:
            try:
                again = await self._retry(exc, permit, loop.time(), ticket)
            finally:
                if not permit.done:
                    await self.limiter.release(permit)
            if not again:
                raise
            return None, None
        except BaseException:
            await self.limiter.release(permit)  # cancelled on the wire: the slot goes back all the same
            raise
        return result, permit

    async def _wait(self, until: float, now: float, ticket: Ticket) -> None:
        """Wait for a hold or this call's backoff: in place, by suspending the row, or not at all."""
        wait = until - now
        budget = ticket.budget
        spent = self.spent
        if spent is not None and spent[1] > now and self.limiter.hold_until_t > now:
            raise self._quota(ticket, now)  # its hold is a quota's: no wait beats it
        if wait > budget.left + 1e-9:
            raise self._past_budget("holds calls until", wait, ticket)
        # A call that cannot suspend its row (a batch serves many) still steps aside for a long
        # provider hold; only its own backoff, bounded by the retries, is waited out in place.
        # A row whose own retry waits more than a moment gives its worker up meanwhile; one whose
        # call fails on its own (or likely does: limits.Standing) tries again after the fresh rows.
        own = until > self.limiter.hold_until_t
        behind = own and ticket.suspend and ticket.standing.behind
        if not behind and (
            wait <= (OWN_IN_PLACE if own and ticket.suspend else IN_PLACE) or (not ticket.suspend and own)
        ):
            budget.left -= wait
            await asyncio.sleep(wait)
            return
        raise OnHold(self.provider, until, time.time() + wait, self.last_status, budget, behind=behind)

    # -- verdicts ------------------------------------------------------------------------------

    async def _retry(self, exc: Exception, permit: Permit | None, now: float, ticket: Ticket) -> bool:
        """Classify a failed call; True to try it again (after any hold or backoff it set).
        ``permit`` is None when the limiter itself failed before the call went."""
        if isinstance(exc, ToolError):
            if exc.quota is not None and permit is not None and not exc.own:
                await self._spent(exc, exc.quota, permit, now, ticket)
            status, retryable, hint = exc.status, exc.retryable, exc.retry_after
            if exc.own and retryable:  # a host the row chose: the request's own failure from the first
                ticket.standing.site()
        else:  # a Python tool's own timeouts and dropped connections are transient too
            status, retryable, hint = None, isinstance(exc, (TimeoutError, ConnectionError)), None
        if not retryable:
            if permit is not None and self.health.success(permit.sent_at, ticket.standing):
                # an answer, if not the one wanted: it is up
                self.emit(ProviderUp(self.name))
            return False
        self.last_status = status
        if hint is not None and hint <= 0:
            hint = None  # "retry after 0s" would spin: back off instead
        if permit is not None and not ticket.standing.host:
            if status == 429:
                await self._refused(permit, now, hint, ticket)
                return True
            if status == OVERLOADED or (isinstance(exc, ToolError) and exc.overloaded):
                await self._overloaded(permit, now, hint, ticket)
                return True
            # a call's first 503 without a hint (one failing again is judged as a failure: limits.Standing)
            if status == 503 and hint is None and not ticket.tries and await self.limiter.busy(permit):
                self._busy(permit, now, ticket)
                return True
        return await self._failed(exc, now, hint, ticket)

    async def _refused(self, permit: Permit, now: float, hint: float | None, ticket: Ticket) -> None:
        """A 429: the provider is up and busy.  Shrink the window or cut the rate, then wait: this
        call alone when the refusal is a lone one, else every call until the hint says."""
        self.refused += 1
        if self.health.success(permit.sent_at, ticket.standing):
            self.emit(ProviderUp(self.name))
        verdict = await self.limiter.refused(
            permit,
            hinted=hint is not None,
            short=hint is not None and hint <= LONE,
            coarse=hint is not None and float(hint).is_integer(),
        )
        if verdict is Verdict.LOWERED:
            self._rate_changed()
        if verdict is Verdict.LONE and hint is not None:
            ticket.not_before = now + hint
        elif hint is not None:
            await self.hold_calls(now + hint, 429)
        else:
            ticket.not_before = now + self.backoff.delay(ticket.refusals)
            ticket.refusals += 1

    async def _overloaded(self, permit: Permit, now: float, hint: float | None, ticket: Ticket) -> None:
        """An overload (529): the provider's, not this call's.  Every call waits, as for a hold,
        the backoff growing once per episode (the calls sent before it began say nothing new)
        until a call goes through; no try is used up: a row waits while its budget lasts, then
        parks, never fails on it."""
        self.failed += 1
        if self.health.success(permit.sent_at, ticket.standing):  # it answered: it is up
            self.emit(ProviderUp(self.name))
        if permit.sent_at >= self._overload_t:
            self._overload_t = now
            self.overloads += 1
        wait = hint if hint is not None else self.backoff.delay(self.overloads - 1, OVERLOAD_CAP)
        await self.hold_calls(now + wait, OVERLOADED)

    def _busy(self, permit: Permit, now: float, ticket: Ticket) -> None:
        """A call's first 503 without a hint, and it bounded calls in flight (a server's queue is
        full while it answers other calls): not the provider's failure (its health does not count
        it), but the call's (its standing does: failing again while others are answered, it fails
        on its own), and it tries again when there is room, after a short backoff."""
        self.failed += 1
        ticket.tries += 1
        ticket.standing.failed(self.health, now)
        self._rate_changed()
        ticket.not_before = now + self.backoff.delay(0)

    async def _spent(
        self, exc: ToolError, quota: str, permit: Permit, now: float, ticket: Ticket
    ) -> NoReturn:
        """A quota no retry beats before it resets: hold the provider until then and park the
        row at once, naming it; the calls waiting meanwhile park too (:meth:`_wait`)."""
        self.last_status = exc.status
        self.refused += exc.status == 429
        if self.health.success(permit.sent_at, ticket.standing):
            self.emit(ProviderUp(self.name))
        await self.limiter.release(permit)
        hint = exc.retry_after
        until = now + (hint if hint is not None and hint > 0 else QUOTA_HOLD)
        if self.spent is None or self.spent[1] < until:
            self.spent = (quota, until)
        await self.hold_calls(until, exc.status)
        error = self._quota(ticket, now)
        error.__cause__ = exc
        raise error

    def _quota(self, ticket: Ticket, now: float) -> ProviderExhausted:
        assert self.spent is not None
        quota, until = self.spent
        wait = max(0.0, until - now)
        wall = time.time() + wait
        return ProviderExhausted(
            f"tool {ticket.tool!r}: provider {self.name!r} refused: its quota {quota!r} is spent until "
            f"{time_of_day(wall)} ({wait:.0f}s from now), and no retry beats it: the row waits for a "
            f"rerun or run.retry()",
            tool=ticket.tool or None,
            provider=self.name,
            status=self.last_status,
            retry_at=wall,
            reason=f"quota: {quota}",
        )

    async def _failed(self, exc: Exception, now: float, hint: float | None, ticket: Ticket) -> bool:
        """A 5xx, a timeout, a refused connection: a failure of this call, not a verdict on the rate
        (nor on the provider, when the call fails on its own: limits.Standing)."""
        self.failed += 1
        health = self.health
        # A failed probe (or a call still out when the provider went down) is the outage's, not
        # this call's: it does not use up the call's tries, so a long outage parks rows, never fails them.
        ticket.tries += not health.down
        if health.failure(now, ticket.standing):
            self.down_error = _describe(exc)
            self._next_probe(now)
            self.emit(ProviderDown(self.name, self.down_error))
        if health.down:
            # the loop waits for the next probe (a failed probe's is later), or parks the row past its budget
            self._next_probe(now)
            ticket.cause = exc
            return True
        if ticket.tries > self.provider.retries:
            raise self._unavailable(exc, ticket, f"gave up after {ticket.tries} tries")
        wait = hint if hint is not None else self.backoff.delay(ticket.tries - 1)
        if health.dominated() and not ticket.standing.own:
            await self.hold_calls(now + wait, self.last_status)  # most calls fail: spare the provider
        else:
            ticket.not_before = now + wait
            if wait > ticket.budget.left:
                raise self._unavailable(
                    exc, ticket, f"gave up after {ticket.tries} tries: the next would pass the wait budget"
                )
        return True

    def _next_probe(self, now: float) -> float:
        self.probe_at = time.time() + max(0.0, self.health.probe_t - now)  # epoch seconds, for people
        return self.probe_at

    def _down(self, ticket: Ticket, now: float) -> ProviderExhausted:
        wall = self._next_probe(now)
        why = (
            ""
            if ticket.falls_through
            else f", past this row's wait budget ({max(ticket.budget.left, 0):.0f}s left of max_wait)"
        )
        error = ProviderExhausted(
            f"tool {ticket.tool!r}: provider {self.name!r} is down ({self.down_error}); the next probe goes at "
            f"{time_of_day(wall)}{why}: the row waits for a rerun or run.retry()",
            tool=ticket.tool or None,
            provider=self.name,
            status=self.last_status,
            retry_at=wall,
            reason="down",
        )
        error.__cause__ = ticket.cause
        return error

    def _unavailable(self, exc: Exception, ticket: Ticket, why: str) -> ProviderUnavailable:
        text = f"provider {self.name!r} is unavailable: {exc} ({why})"
        if ticket.standing.own:
            # the provider answers others (or a host the row chose failed): this request is what fails
            whose = (
                "the host this row chose failed"
                if ticket.standing.host
                else f"this request fails on its own (provider {self.name!r} answers other calls)"
            )
            text = f"{f'tool {ticket.tool!r}: ' if ticket.tool else ''}{whose}: {_describe(exc)} ({why})"
        error = ProviderUnavailable(
            text, tool=ticket.tool or None, provider=self.name, status=self.last_status
        )
        error.__cause__ = exc
        return error


def _per_minute(rate: float | None) -> float | None:
    """A limit a second, headroom taken, as the provider says it: per minute."""
    return round(rate * 60.0 / HEADROOM, 6) if rate is not None else None


def _describe(exc: BaseException) -> str:
    """A failure in a few words, without a ToolError's "tool 'x': " (a down provider is not one tool's)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ToolError) and exc.tool and text.startswith(prefix := f"tool {exc.tool!r}: "):
        text = text[len(prefix) :]
    return text if len(text) <= 200 else text[:197] + "..."
