"""What the governor keeps of one logical call across the replays of its row (:class:`Ticket`:
its tries, its backoff, its wait budget, what it weighs, whether it fails on its own), and what it
reads of its provider's description (:class:`Described`)."""

from __future__ import annotations

from typing import Any, Protocol

from playbook._internal.flow import WaitBudget
from playbook.providers.limits import Rates, Standing

__all__ = ["Described", "Elsewhere", "Ticket"]


class Elsewhere(Exception):
    """Raised to the pool a key's governor belongs to: this call goes under another key (its key
    holds it longer than another would, or was retired while the call waited for a slot)."""


class Ticket:
    """One logical call's standing with its provider, kept across the row's replays.  A call
    weighed by its tokens carries its estimate (``weight``) and, once answered, its real usage
    (``actual``), which the limiter is charged."""

    __slots__ = (
        "tool",
        "budget",
        "tries",
        "refusals",
        "not_before",
        "suspend",
        "falls_through",
        "weight",
        "actual",
        "left",
        "carry",
        "cause",
        "lanes",
        "standing",
    )

    def __init__(
        self,
        tool: str,
        budget: WaitBudget,
        *,
        suspend: bool = True,
        falls_through: bool = False,
        request: str | None = None,
    ) -> None:
        self.tool = tool
        self.budget = budget
        self.tries = 0  # transient failures so far
        self.refusals = 0  # 429s without a hint so far
        self.not_before = 0.0  # this call's own backoff (loop clock)
        self.suspend = suspend  # may this call's own long backoff suspend its row (False: wait in place)
        # A waterfall's leg: a provider that is down passes to the next leg at once, waiting for no probe.
        self.falls_through = falls_through
        self.cause: Exception | None = None  # the failure that took the provider down, under this call
        self.weight: float | None = None  # estimated tokens; None: not weighed
        self.actual: float | None = None  # tokens used, once answered
        # what its provider's token buckets held when it answered (Anthropic's remaining-*)
        self.left: Rates | None = None
        self.carry: Any = None  # what the caller keeps with the call across its row's replays
        self.lanes: Any = None  # what a pool of keys keeps of this call: its backoff on each key
        # what its provider's health makes of its failures: its own, or the provider's
        self.standing = Standing(request)

    def __repr__(self) -> str:
        return f"<Ticket {self.tool!r} tries={self.tries} refusals={self.refusals} {self.budget!r}>"


class Described(Protocol):
    """What the governor reads of its provider's description (a
    :class:`~playbook.providers.provider.Provider`)."""

    @property
    def name(self) -> str: ...

    @property
    def max_wait(self) -> float: ...

    @property
    def retries(self) -> int: ...
