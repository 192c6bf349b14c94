"""Reading receipts ahead of the rows that will ask for them, on a store across the network."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence

from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, Damaged, Found, StoreFailure, cannot_read

__all__ = ["ReadAhead"]


class ReadAhead:
    """Receipts read before they are asked for, for rows that run in a known order: a part of
    :class:`~playbook.store.engine.StoreEngine`, whose lookups :meth:`pop` them.

    The plan is the addresses each row used when it last finished (hints), in the order the
    rows will run.  Receipts are read a chunk of rows at a time, the next chunk once half of the
    last one was used; the cache is bounded, so a play that no longer makes those calls costs
    one chunk of memory, not the whole run's.
    """

    CHUNK = 512  # rows per read
    MOST = 8192  # receipts kept at most

    def __init__(self, backend: Backend, io: StoreIO) -> None:
        self._backend = backend
        self._io = io
        self._plan: deque[list[str]] = deque()
        self._cache: dict[str, Found | Damaged] = {}
        self._used = 0
        self._read = 0
        self.filling: asyncio.Future[None] | None = None  # the chunk being read, once asked for

    def __repr__(self) -> str:
        return f"<ReadAhead rows planned={len(self._plan)} cached={len(self._cache)}>"

    def __bool__(self) -> bool:
        return bool(self._cache) or bool(self._plan)

    def warm(self, play: str, rows: Callable[[], Sequence[str]]) -> None:
        """The rows ``rows()`` of ``play`` are about to run, in this order: a remote store reads
        the receipts each used last time ahead of them, a chunk of rows per round trip, so a
        rerun of an edited play does not wait on the network for every call.  (Asked for only
        then: a million row ids cost 90 MB.)"""
        if self._backend.remote:
            try:
                self.plan(play, rows())
            except StoreFailure as exc:
                raise cannot_read(self._backend.location, exc) from None

    def plan(self, play: str, rows: Sequence[str]) -> None:
        hinted = self._backend.hints(play, rows)
        self._plan = deque(hinted[row] for row in rows if row in hinted)
        self._cache.clear()
        self._used = self._read = 0

    def due(self) -> bool:
        """Whether the next chunk should be read now (before the next lookup)."""
        return bool(self._plan) and (not self._cache or self._used * 2 >= self._read)

    def pop(self, key: str) -> Found | Damaged | None:
        """The receipt read ahead for ``key``, or ``None`` (ask the store)."""
        found = self._cache.pop(key, None)
        self._used += found is not None
        return found

    def read(self) -> asyncio.Future[None]:
        """The next chunk of receipts, read on the store's thread, one read at a time, awaited by
        the rows that need it.  A read that fails only leaves those rows to ask for their receipts
        (which says why)."""
        filling, loop = self.filling, asyncio.get_running_loop()
        if filling is None or filling.get_loop() is not loop:
            # none under way for this loop (an earlier run's may never end)
            filling = self.filling = loop.create_future()

            def filled(_: None, exc: BaseException | None) -> None:
                if self.filling is filling:
                    self.filling = None
                if not filling.done():
                    filling.set_result(None)

            self._io.submit(self.fill, filled)
        return filling

    def fill(self) -> None:
        """Read the next chunk of rows' receipts (one round trip)."""
        if not self.due():
            return  # another lookup filled it meanwhile
        keys = [key for _ in range(min(self.CHUNK, len(self._plan))) for key in self._plan.popleft()]
        read = {key: found for key, found in zip(keys, self._backend.lookup_many(keys)) if found is not None}
        # Runs on the store's thread while the loop pops: whole-dict steps only (each one call
        # under the GIL).  Past MOST, the oldest go: rows that no longer make those calls.
        cache = {**self._cache, **read}
        self._cache = cache if len(cache) <= self.MOST else dict(list(cache.items())[-self.MOST :])
        self._used, self._read = 0, len(keys)
