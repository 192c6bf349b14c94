"""Everything the runtime reads of a provider, in one place.

The runtime sends calls through a provider's governor (:func:`dispatch`), listens to its events
(:func:`watch`) and shows its state; views get that state as a plain :class:`ProviderView`
snapshot, never the provider itself, so what a provider keeps (and where: this process or a
shared limiter) can change without touching a view.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from playbook.providers.provider import governor
from playbook.providers.status import Budget
from playbook.providers.status import ProviderStatus as ProviderView

if TYPE_CHECKING:
    from playbook.providers.limits import Announced
    from playbook.providers.provider import Provider, Ticket

__all__ = ["Budget", "ProviderView", "dispatch", "is_down", "learn", "probe_due", "provider_view", "watch"]

T = TypeVar("T")


def provider_view(provider: Provider) -> ProviderView:
    """A snapshot of ``provider`` for a view."""
    return provider.status()


def watch(provider: Provider, listener: Callable[[Any], None]) -> Callable[[], None]:
    """Follow ``provider``'s events for one execution; returns the unsubscribe function.  Called
    on the execution's loop, ``listener`` hears them there, even when a call of another thread's
    run (the provider is the process's) is what set the hold."""
    gov = governor(provider)
    unsubscribe = gov.subscribe(listener)
    gov.retest()  # a rerun or run.retry() tries a down provider (a refused key of a pool) again at once
    return unsubscribe


def dispatch(provider: Provider, send: Callable[[], Awaitable[T]], ticket: Ticket) -> Awaitable[T]:
    """Send one call through ``provider``'s governor (down, hold, gate, pace, retries)."""
    return governor(provider).dispatch(send, ticket)


def learn(provider: Provider, limits: Announced) -> None:
    """``provider`` announced its limits in an answer (``x-ratelimit-limit-*``, ``anthropic-ratelimit-*``)."""
    governor(provider).learn(limits)


def is_down(provider: Provider) -> bool:
    return governor(provider).down


def probe_due(provider: Provider, loop_now: float) -> float:
    """When (loop clock) the next probe of a down provider may go.  Read on the loop's clock, not
    turned back from the epoch ``probe_at``: that round trip drifts by the real time between the
    two readings, and a timer that fires a moment early meets the provider still down."""
    return max(governor(provider).probe_t, loop_now)
