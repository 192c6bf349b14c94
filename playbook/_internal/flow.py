"""Internal control flow: a row stepping aside (held by a provider, sleeping, or leased by another
process) or out of the run (parked).

These are ``BaseException``s, not ``Exception``s, so a play's ``except Exception:`` around
``ctx.tool`` cannot swallow them; the context also remembers them (sticky suspension).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Leased", "OnHold", "Parked", "Sleeping", "Suspend", "WaitBudget"]


class WaitBudget:
    """Seconds a row may still spend waiting on one provider's holds (``max_wait``, counted down)."""

    __slots__ = ("left",)

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    def __repr__(self) -> str:
        return f"<WaitBudget {self.left:.3g}s left>"


class Suspend(BaseException):
    """Base of the signals that take a row off its worker."""


class OnHold(Suspend):
    """The row waits for ``provider`` until ``until`` (loop clock): re-admit it then (``behind``:
    then, after the rows not started yet: its call fails on its own, and gives way to them)."""

    def __init__(
        self,
        provider: Any,
        until: float,
        wall: float,
        status: int | None,
        budget: WaitBudget,
        *,
        behind: bool = False,
    ) -> None:
        super().__init__(f"held by provider {provider.name!r}")
        self.provider = provider
        self.until = until
        self.wall = wall  # the same moment in epoch seconds, for people
        self.status = status
        self.budget = budget
        self.behind = behind


class Leased(Suspend):
    """Another process is paying for one of the row's calls right now (it holds the call's
    lease): the row steps back and runs again once the rows not started yet are taken, when
    that process has most likely written the receipt.  Processes running the same rows on one
    store so share them out instead of queueing behind each other's leases."""


class Parked(Suspend):
    """The row steps out of this run (``reason``: ``budget``, ``hold``); a rerun picks it up."""

    def __init__(
        self, reason: str, message: str, *, provider: str | None = None, ready_at: float | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.provider = provider
        self.ready_at = ready_at


class Sleeping(Suspend):
    """The row sleeps (``ctx.sleep``) until ``until`` (loop clock); ``wall`` is the same moment in
    epoch seconds, as stored, so a rerun after a restart wakes it at the right time."""

    def __init__(self, until: float, wall: float) -> None:
        super().__init__("sleeping")
        self.until = until
        self.wall = wall
