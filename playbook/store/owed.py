"""Receipts of paid calls that the store refused, kept in memory until it takes them.

A lookup finds them there (no call is paid twice in this process), the store's health writes them
again while it waits for the store (health.py), and the end of a run tries once more; those still
not written are what ``receipts_lost`` counts.
"""

from __future__ import annotations

from collections.abc import Callable

from playbook.errors import ReceiptError
from playbook.store.health import WriteHealth
from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, StoreFailure
from playbook.store.records import Record

__all__ = ["Owed"]


class Owed:
    """The unwritten receipts of :class:`~playbook.store.engine.StoreEngine`."""

    _backend: Backend
    _io: StoreIO
    _unwritten: dict[str, Record]  # receipt key -> paid for, not yet written
    health: WriteHealth
    location: str
    notices: list[str]  # what the store has to say to the runs on it (engine.py)
    counted: Callable[[Callable[[], int]], None]  # a write, counted for the store's mark (marking.py)

    def unwritten(self) -> int:
        """Receipts of paid calls that could not be written (yet)."""
        return len(self._unwritten)

    def write_unwritten(self) -> int:
        """Try once more to write the receipts that failed to be written; returns how many are still not written."""
        if not self._unwritten:
            return 0
        rows = list(self._unwritten.values())
        if self._io.remote:
            # Queued behind the writes not done yet: a server that does not answer must not hold
            # up the end of the run.  They stay counted until the store confirms them.
            def confirmed(_: None, exc: BaseException | None) -> None:
                if exc is None:
                    self.written_back(rows)
                    self.health.mended()

            self._io.submit(lambda: self.counted(lambda: self._backend.write(rows)), confirmed)
            return len(self._unwritten)
        try:
            self.counted(lambda: self._backend.write(rows))
        except (StoreFailure, ReceiptError):
            return len(self._unwritten)
        self.written_back(rows)
        self.health.mended()
        return 0

    async def rewrite(self) -> bool:
        """Write the receipts kept in memory again (the store's health probes with them); True if it took them."""
        rows = list(self._unwritten.values())
        try:
            await self._io.run(lambda: self.counted(lambda: self._backend.write(rows)))
        except (StoreFailure, ReceiptError):
            return False
        self.written_back(rows)
        self.health.mended()
        if rows:  # their rows failed saying the answers were not recorded: say they are now
            self.notices.append(
                f"{len(rows)} receipts of paid calls that could not be written before were written once the store at "
                f"{self.location} took writes again: a rerun reuses them"
            )
        return True

    def keep(self, rows: list[Record]) -> None:
        """Paid for, and refused (or not written yet): kept until the store takes them."""
        for row in rows:
            self._unwritten[row.key] = row

    def written_back(self, rows: list[Record]) -> None:
        """The store took these: no longer kept (unless a newer record of the same key came meanwhile)."""
        for row in rows:
            if self._unwritten.get(row.key) is row:
                del self._unwritten[row.key]
