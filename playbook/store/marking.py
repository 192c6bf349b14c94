"""A store's side of its mark (marks.py): checked when it is opened and when a run starts,
written when a run ends.

A mixin of :class:`~playbook.store.engine.StoreEngine`: a store that lost its receipts is
noticed before anything is paid, and a run's end, a clearing or a reset marks what it holds.

What the store should hold is the larger of its newest mark and what it held when this process
last looked (opening it, starting a run, marking it) plus the receipts this process added since,
as the backend counts them in each write.  That is a floor, never a guess: receipts other
processes add only raise the count (so they can hide a loss smaller than what they added), and
a clearing or a reset lowers it on purpose, with an accepted mark.  One made elsewhere after this
process last looked (another kernel's ``store.clear()``, ``cache accept-loss``) is the new floor: the
receipts added here before it are not counted against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from playbook.store.io import StoreIO
from playbook.store.location import is_url
from playbook.store.marks import Mark, lost, lost_during, newest, read_registry, write_registry
from playbook.store.protocol import Backend, StoreFailure

__all__ = ["Marked"]


class Marked:
    """What a store needs to keep its mark; the store sets these (and calls :meth:`start_marking`)."""

    _opened: tuple[str | os.PathLike[str], bool, str | None]
    _backend: Backend
    _io: StoreIO
    location: str
    lost: str | None
    _notice: Callable[[str], None]

    def start_marking(self) -> None:
        self._counting = threading.Lock()  # a count and the receipts added since it: read and reset together
        self._held: Mark | None = None  # what the store held when this process last looked
        self._added = 0  # receipts this process added since
        self._added_at = 0.0

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

    def counted(self, write: Callable[[], int]) -> None:
        """Run ``write`` (a backend's write, which returns the receipts it added) and count what it added."""
        with self._counting:
            added = write()
            if added:
                self._added += added
                self._added_at = time.time()

    def check_mark(self) -> str | None:
        """Why the store is lost (it holds fewer receipts than it should), or None; when it is
        not, what it holds now is what the next check expects, with what is added here since."""
        key, backend = self._mark_key(), self._backend
        if key is None:
            return None
        try:
            with self._counting:
                count = backend.receipt_count()
                expected, _ = self._expected(key)
                identity = backend.identity
                if expected is not None and count < expected.receipts:
                    return lost(self.location, expected, count, identity)
                self._held, self._added = Mark(count, time.time(), identity), 0
        except StoreFailure:
            return None  # a store that cannot answer says so when it is used
        return None

    def _expected(self, key: str) -> tuple[Mark | None, float]:
        """The fewest receipts the store may hold now (module docstring), as a mark; and when it
        was last cleared or reset, as its newest mark says (carried on in the next)."""
        backend, held = self._backend, self._held
        found = newest(backend.read_mark(), read_registry(key))
        cleared = found.cleared() if found is not None else 0.0
        if held is None or (found is not None and cleared > held.at):
            return found, cleared
        here = Mark(held.receipts + self._added, max(held.at, self._added_at), held.identity)
        return (here if found is None or here.receipts > found.receipts else found), cleared

    def remember(self, *, wait: bool = False, accepted: bool = False) -> None:
        """Mark how many receipts the store holds now, beside its data and in the user's marks
        (at the end of each run; ``accepted``: after a clearing or a reset, fewer on purpose).
        A store that holds fewer than it should is not marked lower: it is lost (its run says
        so, the next is refused).  On a loop, a remote store counts on its own thread, after
        what is queued there; ``wait``, or outside a loop, at once."""
        key, backend = self._mark_key(), self._backend
        if key is None or self.lost is not None or backend.readonly:
            return

        def mark() -> None:
            with self._counting:
                count = backend.receipt_count()
                expected, cleared = self._expected(key)
                if not accepted and expected is not None and count < expected.receipts:
                    self._lost_meanwhile(key, expected, count, cleared)
                    return
                now = Mark(count, time.time(), backend.identity, accepted, cleared)
                backend.write_mark(now)
                write_registry(key, now)
                self._held, self._added = now, 0

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

    def _lost_meanwhile(self, key: str, expected: Mark, count: int, cleared: float) -> None:
        """The store holds fewer receipts than it should: keep the higher count as its mark
        (newer than any, so that every process that opens it finds it), and say so."""
        backend = self._backend
        self.lost = lost(self.location, expected, count, backend.identity)
        self._notice(lost_during(self.location, expected.receipts, count))
        kept = Mark(expected.receipts, time.time(), expected.identity, cleared_at=cleared)
        write_registry(key, kept)
        backend.write_mark(kept)

    def accept_loss(self) -> None:
        """Accept what a lost store holds now (see :attr:`lost`): its mark starts again from here,
        and runs on it go on (paying again for the calls whose receipts are gone)."""
        self.lost = None
        self.remember(wait=True, accepted=True)
