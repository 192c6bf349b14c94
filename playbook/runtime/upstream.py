"""Everything the runtime reads of a provider, in one place.

The runtime sends calls through a provider's governor (:func:`dispatch`), listens to its events
(:func:`watch`) and shows its state; views get that state as a plain :class:`ProviderView`
snapshot, never the provider itself, so what a provider keeps (and where: this process or a
shared limiter) can change without touching a view.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from ..providers import Provider, Ticket

__all__ = ["ProviderView", "dispatch", "is_down", "learn", "probe_due", "provider_view", "watch"]

T = TypeVar("T")


class ProviderView(NamedTuple):
    """A provider's state at one moment, as views show it (times in epoch seconds)."""

    name: str
    down: bool
    down_error: str | None
    probe_at: float  # while down: when the next probe may go (0: not known)
    held: bool
    hold_wall: float  # while held: when the hold ends
    last_status: int | None
    rate: float | None  # calls per second now; None while unlimited
    in_flight_limit: int | None  # calls in flight it allows now; None while no bound is known
    in_flight: int
    refused: int  # 429s so far
    tokens: float  # tokens answered over the last minute (LLM calls)
    tpm: float | None  # the token limit per minute, configured or announced; None: none
    # Cumulative over the process (a provider outlives runs): a timeline takes differences.
    # Last, with defaults, so a view built from an older worker's list still fits.
    sent: int = 0  # requests this process sent to the provider
    failed: int = 0  # transient failures so far (5xx, timeouts, connection errors)


def provider_view(provider: Provider) -> ProviderView:
    """A snapshot of ``provider`` for a view."""
    tokens, tpm = provider.tokens_per_minute
    return ProviderView(
        name=provider.name,
        down=provider.down,
        down_error=provider.down_error,
        probe_at=provider.probe_at,
        held=provider.held,
        hold_wall=provider.hold_wall,
        last_status=provider.last_status,
        rate=provider.rate,
        in_flight_limit=provider.in_flight_limit,
        in_flight=provider.in_flight,
        refused=provider.refused,
        tokens=tokens,
        tpm=tpm,
        sent=provider.sent,
        failed=provider.failed,
    )


def watch(provider: Provider, listener: Callable[[Any], None]) -> Callable[[], None]:
    """Follow ``provider``'s events for one execution; returns the unsubscribe function.  Called
    on the execution's loop, ``listener`` hears them there, even when a call of another thread's
    run (the provider is the process's) is what set the hold."""
    unsubscribe = provider.subscribe(listener)
    provider.health.retest()  # a rerun or run.retry() tries a down provider again at once
    return unsubscribe


def dispatch(provider: Provider, send: Callable[[], Awaitable[T]], ticket: Ticket) -> Awaitable[T]:
    """Send one call through ``provider``'s governor (down, hold, gate, pace, retries)."""
    return provider.dispatch(send, ticket)


def learn(provider: Provider, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
    """``provider`` announced its limits in an answer (``x-ratelimit-limit-*``)."""
    provider.governor.learn(requests_per_minute, tokens_per_minute)


def is_down(provider: Provider) -> bool:
    return provider.down


def probe_due(provider: Provider, loop_now: float) -> float:
    """When (loop clock) the next probe of a down provider may go.  Read on the loop's clock, not
    turned back from the epoch ``probe_at``: that round trip drifts by the real time between the
    two readings, and a timer that fires a moment early meets the provider still down."""
    return max(provider.health.probe_at, loop_now)
