"""Leases: which process is paying for a call right now, so that two never pay for the same one.

Before a call is dispatched, its process takes a lease on the call's address: an owner and an
expiry kept by the store's backend (a row next to the receipts in SQLite, a key set with ``PX``
by a Lua script in Redis, a dict in memory), taken atomically; the leases asked for in one turn of
the event loop are taken together, in one transaction or round trip, as receipts are written.  While
calls are in flight (or waiting behind their provider's gate) the owner renews all its leases every
third of the lease time.  A process that finds a call leased by another waits for its receipt
instead of dispatching; if the owner dies, its leases lapse (at once when it was a process on this
machine, else when they expire) and a waiting process takes the call over.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Callable
from typing import TypeVar

from playbook._internal.owners import HOST, dead
from playbook.errors import ReceiptError
from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, Damaged, Found, StoreFailure
from playbook.store.records import MISSING, Hit, Missing

__all__ = ["Leases"]

T = TypeVar("T")
# What a lease asked for answers: whether it was taken, and the receipt read with it (ask) or None.
Granted = tuple[bool, Found | Damaged | None]


class Leases:
    """The leases of one store, as seen from this process: a part of
    :class:`~playbook.store.engine.StoreEngine` (``store.leases``), which gives back those of
    the calls whose receipts it writes, in the same transaction."""

    def __init__(self, backend: Backend, io: StoreIO, ttl: float = 30.0) -> None:
        self._backend = backend
        self._io = io
        self.ttl = ttl
        self._token = uuid.uuid4().hex[:8]
        self._pid = 0
        self._owner = ""
        self.held: set[str] = set()
        self._asks: list[tuple[str, asyncio.Future[Granted], bool]] = []  # (key, answer, whether to read)
        self._releases: list[str] = []
        # Renewal is a timer, not a task: ending it is a cancel that raises nothing.  (Cancelling
        # a task inside a blocking map() leaves a CancelledError whose traceback holds the
        # caller's frames, and with them the Run, until the cyclic garbage collector runs.)
        self._renewer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<Leases owner={self.owner!r} held={len(self.held)} ttl={self.ttl:g}s>"

    @property
    def owner(self) -> str:
        pid = os.getpid()
        if pid != self._pid:  # a forked child is another owner
            self._pid, self._owner, self.held = pid, f"{HOST}:{pid}:{self._token}", set()
        return self._owner

    async def take(self, key: str) -> bool:
        """Lease ``key`` for this process; False while another live process holds it."""
        return (await self.ask(key, False))[0]

    def ask(self, key: str, look: bool) -> asyncio.Future[Granted]:
        """Lease ``key`` (await it): whether it was taken and, with ``look``, ``key``'s receipt as
        the store has it once the lease is taken (another process may have paid and let go just
        before), in the same round trip.  The future of the batch's answer itself, no coroutine
        around it: once per call paid for."""
        loop = asyncio.get_running_loop()
        asked: asyncio.Future[Granted] = loop.create_future()
        self._asks.append((key, asked, look))
        if len(self._asks) == 1:
            loop.call_soon(self._grant)
        return asked

    def _grant(self) -> None:
        asks, self._asks = self._asks, []
        keys, owner, ttl = [key for key, _, _ in asks], self.owner, self.ttl
        looking = any(look for _, _, look in asks)

        def work() -> tuple[list[bool], list[Found | Damaged | None]]:
            if looking:
                return self._backend.take_and_look(keys, owner, ttl)
            return self._backend.take(keys, owner, ttl), [None] * len(keys)

        self._io.submit(work, lambda answer, exc: self._granted(asks, answer, exc))

    def _granted(
        self,
        asks: list[tuple[str, asyncio.Future[Granted], bool]],
        answer: tuple[list[bool], list[Found | Damaged | None]] | None,
        exc: BaseException | None,
    ) -> None:
        if answer is None:
            error = self._error(exc) if isinstance(exc, StoreFailure) else exc
            for _, asked, _ in asks:
                if not asked.done():
                    asked.set_exception(error or RuntimeError("no answer"))
            return
        got, found = answer
        for i, ((key, asked, _), ok) in enumerate(zip(asks, got)):
            if ok:
                self.held.add(key)
            if not asked.done():
                asked.set_result((ok, found[i]))
            elif ok:  # the caller went away (cancelled): give the lease back
                self.release(key)
        if self.held and self._renewer is None:
            self._renewer = asyncio.get_running_loop().call_later(self.ttl / 3, self._renew)

    def among(self, keys: list[str]) -> list[str]:
        """Those of ``keys`` whose lease this process holds."""
        held = self.held
        return [key for key in keys if key in held] if held else []

    def given_back(self, keys: list[str]) -> None:
        """These leases were given back with their receipts (in the same transaction)."""
        self.held.difference_update(keys)

    def release(self, key: str) -> None:
        """Give a lease back (after its receipt is committed, or when the call failed)."""
        if key not in self.held:
            return
        self.held.discard(key)
        self._releases.append(key)
        if len(self._releases) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._drop)
            except RuntimeError:
                self._drop()

    def _drop(self) -> None:
        keys, self._releases = self._releases, []
        owner = self.owner
        # A lease not given back only expires later: the receipt is what matters.
        self._io.submit(lambda: self._backend.release(keys, owner), _ignore)

    def _renew(self) -> None:
        """Extend every lease this process holds, then again in ttl/3 while it holds any."""
        self._renewer = None
        if not self.held:
            return
        keys, owner = sorted(self.held), self.owner
        # Failing, it is tried again at the next turn; a lease that lapses meanwhile is only taken over.
        self._io.submit(lambda: self._backend.renew(keys, owner, self.ttl), _ignore)
        self._renewer = asyncio.get_running_loop().call_later(self.ttl / 3, self._renew)

    async def stop_renewing(self) -> None:
        """Stop renewing once nothing is held (the end of a run), so no timer outlives its loop."""
        if self._renewer is not None and not self.held:
            self._renewer.cancel()
            self._renewer = None

    async def wait(self, key: str, check: Callable[[], Hit | Missing]) -> Hit | Missing:
        """Wait while another process holds ``key``: returns what ``check()`` finds (its receipt)
        as soon as it is there, or ``MISSING`` once this process holds the lease instead."""
        delay = 0.01
        while True:
            found = await self._io.run(check)
            if found is not MISSING:
                return found
            holder = await self._do(functools.partial(self._backend.holder, key))
            if holder is None or holder[1] < 0 or dead(holder[0]):
                if holder is not None and dead(holder[0]):
                    await self._do(functools.partial(self._backend.release, [key], holder[0]))
                if await self.take(key):
                    found = await self._io.run(check)  # it may have finished between our two looks
                    if found is not MISSING:
                        self.release(key)
                    return found
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    async def _do(self, work: Callable[[], T]) -> T:
        try:
            return await self._io.run(work)
        except StoreFailure as exc:
            raise self._error(exc) from None

    def _error(self, exc: StoreFailure) -> ReceiptError:
        return ReceiptError(
            f"cannot use the leases of the receipt store at {self._backend.location}: {exc.reason}"
        )


def _ignore(result: object, exc: BaseException | None) -> None:
    """For work whose failure changes nothing: it is tried again, or expires."""
