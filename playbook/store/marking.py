"""A store's side of its mark (marks.py): checked when it is opened, written when a run ends.

A mixin of :class:`~playbook.store.engine.StoreEngine`: a store that lost its receipts is
noticed before anything is paid, and a run's end, a clearing or a reset marks what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from .io import StoreIO
from .location import is_url
from .marks import Mark, lost, newest, read_registry, write_registry
from .protocol import Backend, StoreFailure

__all__ = ["Marked"]


class Marked:
    """What a store needs to keep its mark; the store sets these."""

    _opened: tuple[str | os.PathLike[str], bool, str | None]
    _backend: Backend
    _io: StoreIO
    location: str
    lost: str | None

    def _mark_key(self) -> str | None:
        """What names this store in the user's marks: a directory's real path, a server's
        address and database (no password, no options); None for a store in memory."""
        where = os.fspath(self._opened[0])
        if where == "memory" or self._backend.location == "memory":
            return None
        if not is_url(where):
            return str(Path(where).resolve())
        parts = urlsplit(where)
        return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"

    def check_mark(self) -> str | None:
        """Why the store is lost (it holds fewer receipts than its newest mark), or None."""
        key, backend = self._mark_key(), self._backend
        if key is None:
            return None
        try:
            expected = newest(backend.read_mark(), read_registry(key))
            return lost(self.location, expected, backend.receipt_count(), backend.identity)
        except StoreFailure:
            return None  # a store that cannot answer says so when it is used

    def remember(self, *, wait: bool = False) -> None:
        """Mark how many receipts the store holds now, beside its data and in the user's marks
        (at the end of each run, after a clearing or a reset).  On a loop, a remote store counts
        on its own thread, after what is queued there; ``wait``, or outside a loop, at once."""
        key, backend = self._mark_key(), self._backend
        if key is None or self.lost is not None or backend.readonly:
            return

        def mark() -> None:
            now = Mark(backend.receipt_count(), time.time(), backend.identity)
            backend.write_mark(now)
            write_registry(key, now)

        if not wait:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                wait = True
        if not wait:
            self._io.submit(mark, lambda _, __: None)
            return
        self._io.drain()
        with contextlib.suppress(StoreFailure):  # a store that cannot answer says so when it is used
            mark()

    def reset(self) -> None:
        """Accept what a lost store holds now (see :attr:`lost`): its mark starts again from here,
        and runs on it go on (paying again for the calls whose receipts are gone)."""
        self.lost = None
        self.remember(wait=True)
