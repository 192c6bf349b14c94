"""Leases: which process is paying for a call right now, so that two never pay for the same one.

Before a call is dispatched, its process takes a lease on the call's receipt key: a row in a
small table next to the receipts, with an owner and an expiry.  Taking it is one atomic
``INSERT … ON CONFLICT DO UPDATE … WHERE expired``; the leases asked for in one turn of the event
loop share one transaction, as receipts do.  While calls are in flight (or waiting behind their
provider's gate) the owner renews all its leases in one statement every third of the lease time.
A process that finds a call leased by another waits for its receipt instead of dispatching; if
the owner dies, its leases lapse (at once when it was a process on this machine, else when they
expire) and a waiting process takes the call over.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ReceiptError
from .db import Database, StoreFailure

__all__ = ["Leases"]

_TABLE = "lease"  # made with the other tables (db.py)
_TAKE = (
    f"INSERT INTO {_TABLE} (key, owner, expires) VALUES (?, ?, ?) "
    f"ON CONFLICT(key) DO UPDATE SET owner = excluded.owner, expires = excluded.expires "
    f"WHERE {_TABLE}.expires < ? OR {_TABLE}.owner = excluded.owner"
)
_HOST = socket.gethostname()


class Leases:
    """The leases of one store, as seen from this process."""

    def __init__(self, db: Database, path: Path, ttl: float = 30.0) -> None:
        self._db = db
        self._path = path
        self.ttl = ttl
        self._token = uuid.uuid4().hex[:8]
        self._pid = 0
        self._owner = ""
        self.held: set[str] = set()
        self._asks: list[tuple[str, asyncio.Future[bool]]] = []
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
            self._pid, self._owner, self.held = pid, f"{_HOST}:{pid}:{self._token}", set()
        return self._owner

    async def take(self, key: str) -> bool:
        """Lease ``key`` for this process; False while another live process holds it."""
        loop = asyncio.get_running_loop()
        asked = loop.create_future()
        self._asks.append((key, asked))
        if len(self._asks) == 1:
            loop.call_soon(self._grant)
        return await asked

    def _grant(self) -> None:
        asks, self._asks = self._asks, []
        owner, now = self.owner, time.time()
        try:
            got = self._sql(lambda con: [con.execute(_TAKE, (key, owner, now + self.ttl, now)).rowcount == 1 for key, _ in asks])
        except ReceiptError as exc:
            for _, asked in asks:
                if not asked.done():
                    asked.set_exception(exc)
            return
        for (key, asked), ok in zip(asks, got):
            if ok:
                self.held.add(key)
            if not asked.done():
                asked.set_result(ok)
            elif ok:  # the caller went away (cancelled): give the lease back
                self.release(key)
        if self.held and self._renewer is None:
            self._renewer = asyncio.get_running_loop().call_later(self.ttl / 3, self._renew)

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
        try:
            self._sql(lambda con: con.executemany(f"DELETE FROM {_TABLE} WHERE key = ? AND owner = ?", [(k, owner) for k in keys]))
        except ReceiptError:
            pass  # an unreleased lease only expires later; the receipt is what matters

    def _renew(self) -> None:
        """Extend every lease this process holds, then again in ttl/3 while it holds any."""
        self._renewer = None
        if not self.held:
            return
        owner = self.owner
        try:
            self._sql(lambda con: con.execute(f"UPDATE {_TABLE} SET expires = ? WHERE owner = ?", (time.time() + self.ttl, owner)))
        except ReceiptError:
            pass  # try again at the next turn; a lease that lapses meanwhile is only taken over
        self._renewer = asyncio.get_running_loop().call_later(self.ttl / 3, self._renew)

    async def settle(self) -> None:
        """Stop renewing once nothing is held (the end of a run), so no timer outlives its loop."""
        if self._renewer is not None and not self.held:
            self._renewer.cancel()
            self._renewer = None

    async def wait(self, key: str, check: Callable[[], Any], missing: Any) -> Any:
        """Wait while another process holds ``key``: returns what ``check()`` finds (its receipt)
        as soon as it is there, or ``missing`` once this process holds the lease instead."""
        delay = 0.01
        while True:
            found = check()
            if found is not missing:
                return found
            row = self._sql(lambda con: con.execute(f"SELECT owner, expires FROM {_TABLE} WHERE key = ?", (key,)).fetchone())
            if row is None or row[1] < time.time() or _dead(row[0]):
                if row is not None and _dead(row[0]):
                    self._sql(lambda con: con.execute(f"DELETE FROM {_TABLE} WHERE key = ? AND owner = ?", (key, row[0])))
                if await self.take(key):
                    found = check()  # it may have finished between our two looks
                    if found is not missing:
                        self.release(key)
                    return found
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    def _sql(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        try:
            return self._db.write(work)
        except StoreFailure as exc:
            raise ReceiptError(f"cannot use the leases of the receipt store at {self._path}: {exc.reason}") from None


def _dead(owner: str) -> bool:
    """True when ``owner`` is a process on this machine that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != _HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
