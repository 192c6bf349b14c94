"""What a provider's state is at one moment (:class:`ProviderStatus`): a plain snapshot, so a view
or a user reads it without reaching the live governor."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Budget", "ProviderStatus", "merge_budgets"]


class Budget(NamedTuple):
    """One limit a provider's calls are paced under, by its own name ("requests", "tokens",
    "input tokens", "output tokens"), with what the last minute used of it."""

    name: str
    used: float  # requests sent, or tokens answered, over the last minute
    limit: float | None  # per minute, configured or announced; None: not known


def merge_budgets(groups: list[tuple[Budget, ...]]) -> tuple[Budget, ...]:
    """The budgets of several keys (or workers) as one: each name's use summed, and its limit
    summed when every one that has the budget knows it."""
    merged: dict[str, Budget] = {}
    for budgets in groups:
        for b in budgets:
            seen = merged.get(b.name)
            if seen is None:
                merged[b.name] = b
            else:
                limit = None if seen.limit is None or b.limit is None else seen.limit + b.limit
                merged[b.name] = Budget(b.name, seen.used + b.used, limit)
    return tuple(merged.values())


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
    tokens: float  # tokens answered over the last minute, as the provider counts them (LLM calls)
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
    # Each budget of a provider whose calls are weighed by their tokens, by its own name: requests
    # (when its limit is known), then tokens, input tokens and output tokens (those it has).
    budgets: tuple[Budget, ...] = ()
