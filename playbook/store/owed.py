"""Receipts of paid calls that the store refused, kept in memory until it takes them.

A lookup finds them there (no call is paid twice in this process), the store's health writes them
again while it waits for the store (health.py), and the end of a run tries once more; those still
not written are what ``receipts_lost`` counts.
"""

from __future__ import annotations

from collections.abc import Callable

from playbook.errors import ReceiptError
from playbook.store.health import GRACE_S, WriteHealth
from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, StoreFailure
from playbook.store.records import Record

__all__ = ["Owed"]


class Owed:
    """The receipts a store owes: paid for, not written yet, by address (``kept``).

    A part of :class:`~playbook.store.engine.StoreEngine`.  ``health`` (health.py) writes them
    again while the store refuses writes, for ``grace_s`` seconds; ``counted`` runs a write so that
    the store's mark counts what it added (marks.py); ``notices`` hears what a run should say.
    """

    def __init__(
        self,
        backend: Backend,
        io: StoreIO,
        *,
        location: str,
        counted: Callable[[Callable[[], int]], None],
        notices: list[str],
        grace_s: float = GRACE_S,
    ) -> None:
        self._backend = backend
        self._io = io
        self._location = location
        self._counted = counted
        self._notices = notices
        # Read by every receipt lookup that misses (the engine holds this same dict): never replaced.
        self.kept: dict[str, Record] = {}
        # Whether the store takes writes (a call checks before it pays); it writes these again.
        self.health = WriteHealth(self.rewrite, grace_s)

    def __repr__(self) -> str:
        return f"<Owed receipts={len(self.kept)}>"

    def __len__(self) -> int:
        return len(self.kept)

    def keep(self, rows: list[Record]) -> None:
        """Paid for, and refused (or not written yet): kept until the store takes them."""
        for row in rows:
            self.kept[row.key] = row

    def written_back(self, rows: list[Record]) -> None:
        """The store took these: no longer kept (unless a newer record of the same key came meanwhile)."""
        kept = self.kept
        for row in rows:
            if kept.get(row.key) is row:
                del kept[row.key]

    def write(self) -> int:
        """Try once more to write the receipts kept; returns how many are still not written."""
        if not self.kept:
            return 0
        rows = list(self.kept.values())
        if self._io.remote:
            # Queued behind the writes not done yet: a server that does not answer must not hold
            # up the end of the run.  They stay counted until the store confirms them.
            def confirmed(_: None, exc: BaseException | None) -> None:
                if exc is None:
                    self._taken(rows)

            self._io.submit(lambda: self._counted(lambda: self._backend.write(rows)), confirmed)
            return len(self.kept)
        try:
            self._counted(lambda: self._backend.write(rows))
        except (StoreFailure, ReceiptError):
            return len(self.kept)
        self._taken(rows)
        return 0

    async def rewrite(self) -> bool:
        """Write the receipts kept again (the store's health probes with them); True if it took them."""
        rows = list(self.kept.values())
        try:
            await self._io.run(lambda: self._counted(lambda: self._backend.write(rows)))
        except (StoreFailure, ReceiptError):
            return False
        self._taken(rows)
        if rows:  # their rows failed saying the answers were not recorded: say they are now
            self._notices.append(
                f"{len(rows)} receipts of paid calls that could not be written before were written once the store at "
                f"{self._location} took writes again: a rerun reuses them"
            )
        return True

    def _taken(self, rows: list[Record]) -> None:
        self.written_back(rows)
        self.health.mended()
