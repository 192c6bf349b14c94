"""What a provider's state is at one moment (:class:`ProviderStatus`): a plain snapshot, so a view
or a user reads it without reaching the live governor."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ProviderStatus"]


class ProviderStatus(NamedTuple):
    """A provider's state at one moment, in this process (times in epoch seconds): what
    ``provider.status()`` returns and what views show."""

    name: str
    down: bool
    down_error: str | None
    probe_at: float  # while down: when the next probe may go (0: not known)
    held: bool
    hold_until_at: float  # while held: when the hold ends
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
    # A provider with several keys (keys=[...]): one status per key, each named by its masked key.
    keys: tuple[ProviderStatus, ...] = ()
    retired: str | None = None  # a key's: why it is out of its pool for this run (None: in use)
    window: tuple[int, float] | None = None  # a key's or a lone key's configured window=(calls, seconds)
    # The most requests sent within any one second lately (on the clock the pace keeps): a peak
    # counted as a provider counts, to set beside the rate.  0: none sent, or not known.
    busiest: int = 0
