"""Providers: one per upstream account, the unit of concurrency, rate limits and holds.

Every call that misses its receipt goes through its provider's governor on the way to the
transport (``Provider.dispatch``).  The governor applies the concurrency gate; rates, holds and
retries plug in at the same place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .errors import PlayDefinitionError

__all__ = ["Provider"]

T = TypeVar("T")


def _check(name: str, option: str, value: object, *, integer: bool = False, zero: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or (value == 0 and not zero):
        what = "a whole number" if integer else "a number"
        bound = ">= 0" if zero else "> 0"
        raise PlayDefinitionError(f"Provider {name!r}: {option} must be {what} {bound} or None, not {value!r}")


class Provider:
    """An upstream account: ``pb.Provider("acme", rps=20, concurrency=8)``."""

    __slots__ = ("name", "rps", "burst", "concurrency", "account", "max_wait", "retries", "_loop", "_gate", "in_flight")

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
        _check(name, "max_wait", max_wait, zero=True)
        _check(name, "retries", retries, integer=True, zero=True)
        if not isinstance(account, str) or not account:
            raise PlayDefinitionError(f"Provider {name!r}: account must be a non-empty string, not {account!r}")
        self.name = name
        self.rps = rps
        self.burst = burst
        self.concurrency = concurrency
        self.account = f"{name}:{account}"
        self.max_wait = max_wait
        self.retries = retries
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Semaphore | None = None
        self.in_flight = 0

    def __repr__(self) -> str:
        limits = [f"{k}={getattr(self, k)!r}" for k in ("rps", "burst", "concurrency") if getattr(self, k) is not None]
        return f"<Provider {self.name!r} {' '.join(limits)} in_flight={self.in_flight}>".replace("  ", " ")

    def _bound_gate(self) -> asyncio.Semaphore | None:
        # Bound lazily: a notebook may run one map under asyncio.run and the next in the kernel's loop.
        if self.concurrency is None:
            return None
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._gate = loop, asyncio.Semaphore(self.concurrency)
        return self._gate

    async def dispatch(self, send: Callable[[], Awaitable[T]]) -> T:
        """Send one call through the governor."""
        gate = self._bound_gate()
        if gate is None:
            self.in_flight += 1
            try:
                return await send()
            finally:
                self.in_flight -= 1
        async with gate:
            self.in_flight += 1
            try:
                return await send()
            finally:
                self.in_flight -= 1
