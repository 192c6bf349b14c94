"""A store's row memos: found for the rows about to run, and written buffered (half a second at
most), because losing one only means a row replays against its receipts, for free."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from playbook.store.io import StoreIO
from playbook.store.protocol import Backend, StoreFailure, cannot_read
from playbook.store.records import OUTPUT_TAGGED, Memo, MemoRow, memo_local, memo_unpriced, parse_tools
from playbook.tagged import decode, loads

__all__ = ["RowMemos"]

_logger = logging.getLogger("playbook.store")
_new = tuple.__new__  # MemoRow(...) is a Python call, once per row finished: this is a C one (records.py)


class RowMemos:
    """The row memos of one store: a part of :class:`~playbook.store.engine.StoreEngine`, which
    finds them (:meth:`find`), buffers new ones (:meth:`add`) and writes them (:meth:`flush`,
    :meth:`fold`).  ``notice`` hears memos that could not be written."""

    def __init__(
        self, backend: Backend, io: StoreIO, *, location: str, notice: Callable[[str], None]
    ) -> None:
        self._backend = backend
        self._io = io
        self._location = location
        self._notice = notice
        self._pending: list[MemoRow] = []
        self._hints: list[tuple[str, str, str]] = []  # (play, row, "addresses it used"): remote stores
        self._flushed = time.monotonic()

    def __repr__(self) -> str:
        return f"<RowMemos pending={len(self._pending)}>"

    def find(self, keys: list[str]) -> dict[str, Memo]:
        """Row memos for the keys that have one.

        A memo that cannot be read is left out (with a warning): its row runs again, against
        its receipts, so that costs nothing.
        """
        self._io.drain()  # memos of a run that just ended may still be on their way
        try:
            rows, bad = self._backend.memos(keys)
        except StoreFailure as exc:
            raise cannot_read(self._location, exc) from None
        found: dict[str, Memo] = {}
        new = tuple.__new__  # Memo(...) is a Python call: this is a C one (records.py)
        for key, _, tools, calls, cost, flags, output in rows:
            try:
                out = loads(output)
                if type(out) is not dict:
                    raise ValueError("not a row's output")
                value = decode(out) if flags & OUTPUT_TAGGED else out
                found[key] = new(
                    Memo, (value, calls, cost, memo_local(flags), parse_tools(tools), memo_unpriced(flags))
                )
            except (ValueError, TypeError, KeyError, IndexError):
                bad.append(key)
        if bad:
            _logger.warning(
                "%d row memo(s) in %s cannot be read (first: %s); those rows run again, against their receipts",
                len(bad),
                self._location,
                bad[0],
            )
        return found

    def add(
        self,
        key: str,
        play: str,
        tools: str,
        calls: int,
        cost: float,
        flags: int,
        output: str,
        *,
        row: str = "",
        used: Sequence[str] = (),
    ) -> None:
        """Remember a finished row (``output``: its output as JSON text; ``tools``: " a=fp b=fp ");
        written at the next flush, at most half a second later.  A crash loses at most the last
        half second of memos, and those rows replay from their receipts for free; a run that
        starts in another process finds them once it has folded them in (:meth:`fold`).  ``row``
        and ``used`` (its row id and the addresses it looked up) let a remote store read those
        receipts ahead next time."""
        pending = self._pending
        pending.append(_new(MemoRow, (key, play, tools, calls, cost, flags, output)))
        if used and row and self._backend.remote:
            self._hints.append((play, row, " ".join(used)))
        if len(pending) >= 16384 or time.monotonic() - self._flushed > 0.5:
            self.flush()
        elif len(pending) == 1:
            # Written within half a second even when no other row finishes after it (the rest
            # held, or waiting on a slow provider): a kill then loses at most that half second.
            with contextlib.suppress(RuntimeError):  # no loop: the next memo or the run's end writes it
                asyncio.get_running_loop().call_later(0.5, self._flush_due)

    def _flush_due(self) -> None:
        if self._pending and time.monotonic() - self._flushed >= 0.5:
            self.flush()

    def flush(self) -> None:
        """Write buffered row memos in one transaction (a remote store: on its thread, the run
        goes on).  If they cannot be written, they are dropped with a warning: the rows run again
        next time, against their receipts."""
        pending, self._pending = self._pending, []
        hints, self._hints = self._hints, []
        self._flushed = time.monotonic()
        if not pending or self._backend.readonly:
            return
        if self._io.remote:
            # A failure is a notice, appended from the store's thread (list.append is atomic).
            self._io.submit(lambda: self._write_memos(pending, hints), lambda *_: None)
        else:
            self._write_memos(pending, hints)

    def _write_memos(self, pending: list[MemoRow], hints: list[tuple[str, str, str]]) -> None:
        try:
            self._backend.write_memos(pending)
            if hints:
                self._backend.write_hints(hints)
        except StoreFailure as exc:
            self._notice(
                f"{len(pending)} row memos could not be written to the receipt store at {self._location}: {exc.reason}. "
                "Those rows run again next time, against their receipts (no call is paid for twice)"
            )

    def fold(self) -> None:
        """Put the memos written so far, by this process or another, where :meth:`find` finds
        them: a run does so when it starts and once its last memos are written (SQLite appends
        memos as they come, and moves them into its keyed table in one pass).  If they cannot be
        moved now, they stay where they are (with a warning) and are moved next time."""
        if self._backend.readonly:
            return
        try:  # (what a store that folds was given is written: it writes as it is given, on this thread)
            self._backend.fold_memos()
        except StoreFailure as exc:
            self._notice(
                f"row memos could not be put in place in the receipt store at {self._location}: {exc.reason}; they are kept, and put in place when a run next starts"
            )
