"""The calls this process is paying for now, by address, so that a row asking for one of them waits
for its receipt instead of paying again (leases do the same across processes).

A call in flight is kept as itself (any object standing for it), not as a future: most calls are
waited for by nobody, so a future is made only when a row waits, one per address, and it is done
when the call ends.  Two calls of one address at once (both paid again with ``refresh=True``) are
told apart by that object: the one that ends first does not remove the other.
"""

from __future__ import annotations

import asyncio

__all__ = ["InFlight"]


class InFlight:
    """``store.inflight``: the calls being paid for in this process."""

    __slots__ = ("_calls", "_waits")

    def __init__(self) -> None:
        self._calls: dict[str, object] = {}  # address -> the call paying for it
        self._waits: dict[str, asyncio.Future[None]] = {}  # address -> done when its call ends

    def __repr__(self) -> str:
        return f"<InFlight {len(self._calls)} calls, {len(self._waits)} waited for>"

    def __contains__(self, key: str) -> bool:
        return key in self._calls

    def start(self, key: str, call: object) -> None:
        """``call`` is being paid for: rows asking for ``key`` wait for it."""
        self._calls[key] = call

    def end(self, key: str, call: object) -> None:
        """``call`` is over (its receipt is on disk, or it never went out): its waiters look again."""
        if self._calls.get(key) is call:
            del self._calls[key]
        if self._waits:
            waiting = self._waits.pop(key, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    def ended(self, key: str) -> asyncio.Future[None] | None:
        """A future done when the call paying for ``key`` ends (``None``: none is in flight).  Await
        it through ``asyncio.wait``: it is shared by every row waiting for ``key``."""
        if key not in self._calls:
            return None
        waiting = self._waits.get(key)
        if waiting is None:
            waiting = self._waits[key] = asyncio.get_running_loop().create_future()
        return waiting
