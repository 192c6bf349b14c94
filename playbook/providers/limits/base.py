"""What a provider's governor asks of a limiter, wherever its state lives.

A call takes a :class:`Permit` (:meth:`Limiter.acquire`: a concurrency slot and a rate slot),
goes on the wire, and gives the permit back with the limiter's verdict on how it went::

    permit = await limiter.acquire(weight)      # None: a hold arrived while it waited
    ... send ...
    await limiter.settle(permit, actual)        # answered: the real weight; the rate recovers
    await limiter.refused(permit, hinted=...)   # a 429: a lone one, or a verdict on concurrency or the rate
    await limiter.release(permit)               # neither (5xx, timeout, cancelled)
    await limiter.hold(until)                   # nothing goes before ``until`` (a Retry-After)

Times are the running loop's clock (``loop.time()``), in this process; a limiter whose state is
shared with other processes translates them to its own clock, so the governor never sees another
machine's time.  Every call counts 1 against the request rate; ``weight`` is what it counts
against the token budgets (``tpm``: all tokens; ``itpm`` and ``otpm``: input and output tokens
apart), when there are any: a call weighed by its tokens (a
:class:`~playbook.providers.limits.weights.Tokens`, input and output apart) is charged its
estimate at :meth:`Limiter.acquire` and its usage at :meth:`Limiter.settle`.  Limits a provider
announces in its answers (``x-ratelimit-limit-*``, ``anthropic-ratelimit-*-limit``) reach the
limiter through :meth:`Limiter.learn`.
"""

from __future__ import annotations

import enum
import math
from typing import Protocol, runtime_checkable

from playbook.providers.limits.weights import Rates

__all__ = ["HEADROOM", "LONE", "Limiter", "Permit", "Verdict", "rate_news"]

# Calls are paced a little under the configured rate: sent at exactly the provider's limit, the
# network's jitter alone turns some of them into 429s, and each costs a hold and a rate cut.
HEADROOM = 0.98
# A 429 whose hint is this short (seconds) may be a lone one: see :class:`Verdict`.
LONE = 1.0


class Verdict(enum.Enum):
    """What a 429 says, as the limiter judges it (:meth:`Limiter.refused`).

    ``LONE``: one call among many let in at a known rate was refused with a short hint: the jitter
    of calls that left evenly and arrived together (a strict bucket with a burst of 1 or 2 refuses
    a pair that the network bunched), not a wrong rate.  That call alone waits its hint; the
    provider is not held and the rate stays.  Holding everyone for a ``Retry-After: 1`` that only
    meant "not this instant" would cost a second of the whole account's sending per refusal.
    ``LOWERED``: a limit came down (calls in flight, or the rate).  ``NOTED``: nothing came down
    (this episode's cut is made, or it says nothing about the rate): the hint, if any, holds calls.
    """

    LONE = "lone"
    LOWERED = "lowered"
    NOTED = "noted"


class Permit:
    """One call's place with its limiter, from :meth:`Limiter.acquire` until it is given back."""

    __slots__ = ("weight", "level", "sent_at", "key", "done", "offset", "weighed")

    def __init__(
        self, weight: float, level: int, sent_at: float, key: str = "", *, weighed: bool = False
    ) -> None:
        self.weight = weight  # units charged so far
        # charged to token budgets when granted (a call granted before any was known is settled against none)
        self.weighed = weighed
        self.level = level  # calls in flight when it went, itself included (the account's, when shared)
        self.sent_at = sent_at  # loop clock
        self.key = key  # its name in shared state ("" for a local permit)
        self.done = False  # given back: settled, refused or released
        # Shared time minus loop time when it was granted (a shared limiter's): the grant's own
        # measure, so a later answer read late on a busy loop cannot date the call before its grant.
        self.offset = 0.0

    def land(self) -> bool:
        """Mark it given back; False when it was already (a call settles once)."""
        if self.done:
            return False
        self.done = True
        return True

    def __repr__(self) -> str:
        state = " done" if self.done else ""
        key = f" {self.key}" if self.key else ""
        return f"<Permit{key} weight={self.weight:g} level={self.level} sent_at={self.sent_at:.3f}{state}>"


@runtime_checkable
class Limiter(Protocol):
    """Rate, concurrency and holds for one provider account, in this process or shared."""

    @property
    def rate(self) -> float | None:
        """Units a second it lets through now; ``None`` while unlimited."""

    @property
    def in_flight_limit(self) -> int | None:
        """Calls it lets be in flight at once now (configured or discovered); ``None``: no bound
        known."""

    @property
    def in_flight(self) -> int:
        """This process's calls on the wire."""

    @property
    def hold_until_t(self) -> float:
        """Loop clock: nothing goes before this (0.0 or a past time: no hold)."""

    @property
    def ceiling(self) -> float | None:
        """Calls a second it never goes past (configured or announced); ``None``: discovered."""

    @property
    def token_rate(self) -> float | None:
        """Tokens a second it lets through (configured or announced); ``None``: no token limit."""

    @property
    def token_rates(self) -> Rates:
        """Tokens a second of each budget (all, input and output tokens; configured or announced)."""

    async def acquire(self, weight: float = 1.0, patience: float = math.inf) -> Permit | None:
        """Wait for a concurrency slot and a rate slot for a call of ``weight`` units; ``None``
        when a hold arrived meanwhile, or the slot is further than ``patience`` seconds away (the
        caller decides how to wait for it, by :meth:`expected_wait`, then asks again)."""

    async def settle(self, permit: Permit, actual: float | None = None, left: Rates | None = None) -> bool:
        """The call was answered: give its slot back, charge its real weight (``actual``; None:
        as acquired) and let the rate and the concurrency limit recover.  ``left``: the tokens
        each of the provider's buckets held as it answered (Anthropic's ``remaining``), which
        the budgets' own count is corrected from.  True when either grew noticeably."""

    async def refused(
        self, permit: Permit, *, hinted: bool, short: bool = False, coarse: bool = False
    ) -> Verdict:
        """The call got a 429 (``hinted``: it said when to come back; ``short``: within ``LONE``
        seconds; ``coarse``: in whole seconds, the server's rounding): give its slot back and
        judge it (:class:`Verdict`): a lone refusal, one that lowers calls in flight or the
        rate, or one that lowers nothing."""

    async def busy(self, permit: Permit) -> bool:
        """The call was refused for want of room, without a hint (a 503 from a server whose queue
        is full): give its slot back; True when that bounds calls in flight
        (:meth:`~playbook.providers.limits.gates.Window.busy`), False when it says nothing of
        them (nothing went through lately: an outage, for the provider's health to judge)."""

    async def release(self, permit: Permit) -> None:
        """The call ended with no word on the limits (a 5xx, a timeout, cancelled): give its
        slot back."""

    async def hold(self, until: float) -> float:
        """Let nothing go before ``until`` (loop clock); returns the hold in force (a later one
        set before stays)."""

    def turn_away(self) -> None:
        """Wake every call waiting here for its turn or its slot, with no permit: each asks its
        governor again (a pool retired this key).  A limiter whose waiters find out by
        themselves when their slot comes may do nothing."""

    def expected_wait(self, weight: float) -> float:
        """Seconds a call of ``weight`` tokens would wait for its rate and token slots if it asked
        now, behind the calls already waiting (0.0 when it cannot tell without asking)."""

    def learn(self, requests: float | None, tokens: float | Rates | None) -> bool:
        """The provider announced its limits (requests a second; tokens a second, one budget or
        :class:`~playbook.providers.limits.weights.Rates`; headroom taken): pace under them where
        nothing lower is configured.  True when a limit changed."""


def rate_news(shown: float | None, rate: float | None, ceiling: float | None) -> bool:
    """Whether ``rate`` is worth telling the views, against the ``shown`` one: a change of 5% or
    more, a limit set or lifted, or the configured ceiling reached.  (Every AIMD step would be noise.)"""
    if shown == rate:
        return False
    return shown is None or rate is None or rate == ceiling or abs(rate - shown) >= 0.05 * shown
