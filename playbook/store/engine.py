"""The receipt store: every paid tool result, and every finished row, as JSON.

Where: a directory (``.playbook/``, ``$PLAYBOOK_HOME`` or one you name) holding ``receipts.db``
(SQLite), or a Redis server (``redis://host:6379/0``) that many kernels and machines share; the
backends (protocol.py) only keep records, and everything said here holds for each.  Every
record is tagged JSON text (:mod:`playbook.tagged`): never a pickle, and a replay gives back
exactly the value first stored.

Damage never stops a run.  A store that cannot be opened (not a database, a newer format) raises
:class:`ReceiptError` naming the directory and what to do.  One record that cannot be read (bad
JSON, bad UTF-8, a tag from a newer playbook) counts as missing, with a warning naming it: the
call is made again and its new receipt replaces the bad one.  A store that refuses writes while a
run goes on (disk full, read-only, out of memory) is waited for, a few seconds (health.py); past
that, the receipts waiting fail their rows, with the reason and the path, and the rows that would
pay park.  Receipts of calls already paid for are kept in memory and written at the end of the run.

The engine does the receipts' hot path itself (lookups, group commits) and holds the rest as
parts, each an object with its own state: :class:`~playbook.store.leases.Leases` (which process
pays for a call), :class:`~playbook.store.row_memos.RowMemos`, :class:`~playbook.store.marks.Marks`
(the store's high-water mark), :class:`~playbook.store.ahead.ReadAhead` (a remote store's
receipts read ahead), :class:`~playbook.store.owed.Owed` (receipts paid for and not written yet,
with the store's :class:`~playbook.store.health.WriteHealth`),
:class:`~playbook.store.spending.Spending` and :class:`~playbook.store.inspection.Inspection`.
Its methods of the same names hand the work to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from playbook.errors import ReceiptError
from playbook.store.ahead import ReadAhead
from playbook.store.health import GRACE_S
from playbook.store.inflight import InFlight
from playbook.store.inspection import Inspection, StoreStats, unreadable
from playbook.store.io import StoreIO
from playbook.store.leases import Leases
from playbook.store.location import home, is_url, masked_in, open_backend
from playbook.store.marks import Marks
from playbook.store.owed import Owed
from playbook.store.protocol import Backend, Damaged, Found, StoreFailure, Tally, cannot_read, elsewhere
from playbook.store.records import (
    MISSING,
    OUTPUT_TAGGED,
    REFUSED,
    Hit,
    Memo,
    Missing,
    Record,
    Refusal,
    damage,
)
from playbook.store.row_memos import RowMemos
from playbook.store.spending import Spending, SpendLines
from playbook.tagged import decode, loads
from playbook.tools.protocol import NO_INPUT

if TYPE_CHECKING:
    from playbook.records import Receipt
    from playbook.tools.tool import Tool

__all__ = ["StoreEngine"]

_threads = threading.Lock()
_new = tuple.__new__  # Hit(...) is a Python call, once per receipt replayed; this is a C one (records.py)

_logger = logging.getLogger("playbook.store")
_told_about: set[str] = set()  # what stores are (StoreEngine.about) already said by a run in this process


class StoreEngine:
    """What a :class:`~playbook.store.receipts.ReceiptStore` runs on.

    The same records, with what a run needs beside what users look at: lookups batched per turn
    of the loop, group commits, receipts kept while a store refuses them, leases, row memos and
    the store's mark.  Runs, the command line and the cluster work on this; users hold the
    :class:`ReceiptStore` in front of it (``engine(store)`` reaches it).  Locations and
    ``durability`` are as the public class documents.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = 30.0,
        readonly: bool = False,
        durability: str | None = None,
        write_grace: float = GRACE_S,
        backend: Backend | None = None,
    ) -> None:
        # backend: one already open over the same records (a store in memory, for another thread).
        where = home() if location is None else location
        self._opened = (where, readonly, durability)  # for the same store in another thread (see for_thread)
        self._thread: int | None = None  # the thread that runs on this store
        self._others: dict[int, StoreEngine] = {}
        self.location = os.fspath(where)
        # A directory as a Path; a URL as it was given (messages and the CLI show either).
        self.path: Path | str = self.location if is_url(where) else Path(where)
        self.clock = clock
        self._backend = backend if backend is not None else self._open(where, readonly, durability)
        location = self.location = self._backend.location  # a URL's password masked
        # What went wrong, for the runs that use it.
        self.notices: list[str] = list(getattr(self._backend, "notices", ()))
        # What the store cannot promise (a Redis server without an append-only file): every run says it.
        self.standing: list[str] = list(getattr(self._backend, "standing", ()))
        # What the store is (a Redis Cluster, and what a failover loses): said by the first run in
        # this process that uses it, and by stats(); not logged each time it is opened.
        self.about: list[str] = list(getattr(self._backend, "about", ()))
        self.told = 0  # how many of them a run has said already (the first run says those found at opening)
        # Told of each new notice (from any thread), by the run under way.
        self.heard: Callable[[], None] | None = None
        for note in (*self.standing, *self.notices):
            _logger.warning("%s", note)
        # Where a cluster job counts the paid calls of the partition running on this store:
        # (Redis hash, field), or None.  Counted with their receipts (protocol.Tally).
        self.tally: tuple[str, str] | None = None
        self.inflight = InFlight()  # the calls being paid for now in this process
        self._io = StoreIO(remote=self._backend.remote)
        # Across the network (Redis): a lookup is awaited (alookup).  On this machine, it answers at once.
        self.remote = self._backend.remote
        self._lookup = self._backend.lookup
        self._asks: list[tuple[str, float | None, asyncio.Future[Hit | Missing]]] = []
        self._writes: list[tuple[Record, asyncio.Future[None], int, float]] = []
        self._warned: set[str] = set()  # unreadable records already reported

        # The parts.  Said when it holds fewer receipts than its mark (marks.py): a run on it
        # refuses to start, and what only looks at it says so.
        self._marks = Marks(where, self._backend, self._io, location=location, notice=self._notice)
        self.leases = Leases(self._backend, self._io, ttl=lease_ttl)  # which process pays for a call
        self._memos = RowMemos(self._backend, self._io, location=location, notice=self._notice)
        self._ahead = ReadAhead(self._backend, self._io)
        self._owed = Owed(
            self._backend,
            self._io,
            location=location,
            counted=self._marks.counted,
            notices=self.notices,
            grace_s=write_grace,
        )
        self.health = self._owed.health  # whether it takes writes: a call checks before it pays
        self._unwritten = self._owed.kept  # the same dict: a lookup that misses reads it
        self._spending = Spending(self._backend, self._io, location=location, notice=self._notice)
        # A clearing leaves fewer receipts on purpose: the store is marked with an accepted mark.
        cleared = functools.partial(self._marks.remember, wait=True, accepted=True)
        self._inspection = Inspection(
            self._backend, location=location, drain=self.drain, cleared=cleared, about=self.about
        )
        # Bound, not wrapped: called once per row finished.
        self.add_memo = self._memos.add

    def __repr__(self) -> str:
        return f"StoreEngine({self.location!r})"

    def for_thread(self) -> StoreEngine:
        """This store for the calling thread: itself in the first thread that runs on it, else one
        per thread over the same records.  A store batches its work on the loop running it, and
        each thread blocking on ``map()`` has its own: one object shared by a server's threads
        would wake the wrong loop and hang."""
        me = threading.get_ident()
        with _threads:
            if self._thread in (None, me):
                self._thread = me
                return self
            other = self._others.get(me)
            if other is None:
                where, readonly, durability = self._opened
                other = self._others[me] = StoreEngine(
                    where,
                    clock=self.clock,
                    lease_ttl=self.leases.ttl,
                    readonly=readonly,
                    durability=durability,
                    write_grace=self.health.grace_s,
                    # In memory, nothing else holds its records: share them.
                    backend=self._backend if self._backend.location == "memory" else None,
                )
            return other

    def _open(self, where: str | os.PathLike[str], readonly: bool, durability: str | None) -> Backend:
        try:
            return open_backend(where, readonly=readonly, notify=self._notice, durability=durability)
        except StoreFailure as exc:
            at = "" if self.location in exc.reason or masked_in(exc.reason) else f" at {self.location}"
            # a location or option at fault (EINVAL) is fixed where it is given, not elsewhere
            raise ReceiptError(
                f"cannot open the receipt store{at}: {exc.reason}"
                + ("" if exc.code == "EINVAL" else f"; {elsewhere(self.location)}")
            ) from None

    def untold(self) -> list[str]:
        """What the store is (:attr:`about`) that no run in this process has said yet, now said."""
        with _threads:
            new = [note for note in self.about if note not in _told_about]
            _told_about.update(new)
        return new

    @property
    def address(self) -> str:
        """Where it was opened, as given (a URL with its password): what another process opens
        to reach the same records (with its ``durability``).  Never shown; ``location`` is the
        form to show."""
        where, _, durability = self._opened
        url = os.fspath(where)
        if durability is None or not is_url(url) or url == "memory":
            return url
        return url + ("&" if "?" in url else "?") + f"durability={durability}"

    @property
    def backend(self) -> Backend:
        """Where the records live (SQLite, Redis or memory): the store protocol, for tools and tests."""
        return self._backend

    def _notice(self, note: str) -> None:
        _logger.warning("%s", note)
        self.notices.append(note)  # atomic: a remote store's thread may say it
        heard = self.heard
        if heard is not None:
            heard()

    # -- receipts (hot path) -------------------------------------------------------------

    def lookup(self, key: str, ttl: float | None = None) -> Hit | Missing:
        """The receipt stored for ``key`` (its value as first returned, and when it was), or
        ``MISSING`` (also when older than ``ttl`` seconds).  A hit's ``error`` is set when the
        answer was paid for but had no JSON form (its text), or was a refusal (a :class:`Refusal`).

        A record that cannot be read is ``MISSING`` too, with a warning naming it, so the call
        is made again and its new receipt replaces the bad one.  Failing the row instead would
        fail it again on every rerun, and the only way out, clearing the tool's receipts, would
        throw away every other call of that tool already paid for.
        """
        try:
            found = self._lookup(key)
        except StoreFailure as exc:
            raise cannot_read(self.location, exc) from None
        return self._answer(key, found, ttl)

    async def alookup(self, key: str, ttl: float | None = None) -> Hit | Missing:
        """:meth:`lookup`, for the event loop: on this machine, at once; across the network, the
        receipts read ahead answer (see :meth:`warm`), and the lookups asked for in one turn of
        the loop travel together, in one round trip."""
        if not self._io.remote:
            return self.lookup(key, ttl)
        ahead = self._ahead
        if ahead:
            read = ahead.pop(key)
            if read is None and (ahead.filling is not None or ahead.due()):
                # Its chunk may be on its way, or next: one round trip for many rows.  Shielded: a
                # row cancelled meanwhile must not cancel the read the others wait for.
                await asyncio.shield(ahead.read())
                read = ahead.pop(key)
            elif ahead.due():
                ahead.read()  # the next chunk, read while these rows go on
            if read is not None:
                return self._answer(key, read, ttl)
        loop = asyncio.get_running_loop()
        asked: asyncio.Future[Hit | Missing] = loop.create_future()
        self._asks.append((key, ttl, asked))
        if len(self._asks) == 1:
            loop.call_soon(self._lookup_asks)
        return await asked

    def _lookup_asks(self) -> None:
        asks, self._asks = self._asks, []
        keys = [key for key, _, _ in asks]

        def answer(found: list[Found | Damaged | None] | None, exc: BaseException | None) -> None:
            if found is None:
                error = cannot_read(self.location, exc) if isinstance(exc, StoreFailure) else exc
                for _, _, asked in asks:
                    if not asked.done():
                        asked.set_exception(error or RuntimeError("no answer"))
                return
            for (key, ttl, asked), one in zip(asks, found):
                if not asked.done():
                    asked.set_result(self._answer(key, one, ttl))

        self._io.submit(lambda: self._backend.lookup_many(keys), answer)

    def answer(self, key: str, found: Found | Damaged | None, ttl: float | None = None) -> Hit | Missing:
        """What :meth:`lookup` returns for ``key`` when the store read ``found`` for it (with a
        lease: :meth:`~playbook.store.leases.Leases.ask`)."""
        return self._answer(key, found, ttl)

    def _answer(self, key: str, found: Found | Damaged | None, ttl: float | None) -> Hit | Missing:
        if found is None:
            row = self._unwritten.get(key) if self._unwritten else None
            if row is None:
                return MISSING
            found = Found(row.output, row.miss, row.flags, row.error, row.at)
        elif type(found) is Damaged:
            self._warn_unreadable(key, found.problem)
            return MISSING
        output, miss, flags, error, at = found
        if ttl is not None and self.clock() - at > ttl:
            return MISSING
        try:
            value = loads(output)
            if flags & REFUSED:
                status, literal = (
                    (value[0], (value[1], value[2])) if isinstance(value, list) else (value, None)
                )
                return _new(Hit, (None, False, Refusal(int(status), error or "", literal), at))
            return _new(Hit, ((decode(value) if flags & OUTPUT_TAGGED else value), bool(miss), error, at))
        except (
            ValueError,
            TypeError,
            KeyError,
            IndexError,
        ) as exc:  # bad JSON, or a tag this playbook does not know
            self._warn_unreadable(key, damage(exc))
            return MISSING

    def _warn_unreadable(self, key: str, problem: str) -> None:
        if key not in self._warned:  # a call looks its receipt up more than once (before and after its lease)
            self._warned.add(key)
            _logger.warning(
                "%s; it counts as missing: a run that needs it makes the call again and replaces it",
                unreadable(self._backend, key, problem),
            )

    async def commit(self, record: Record, *, paid: int = 0, cost: float = 0.0) -> None:
        """Write one record durably; returns once it is committed (``ReceiptError`` if it cannot be).
        ``paid``: the requests it answered (what ``calls_executed`` counts), ``cost`` what they cost.

        Records written in the same turn of the event loop share one transaction (group
        commit): each row still waits for its own receipt to be on disk, but a burst of 64
        finishing calls costs one commit instead of 64.  A record the store refuses is written
        again for the store's grace before the error is raised (health.py).
        """
        try:
            await self.write(record, paid=paid, cost=cost)
        except ReceiptError as exc:
            await self.rewrite(record, exc)

    def write(self, record: Record, *, paid: int = 0, cost: float = 0.0) -> asyncio.Future[None]:
        """:meth:`commit`'s first try: done once the record is on disk, or failed with the
        ``ReceiptError`` to give :meth:`rewrite`.  The group commit's future itself, no coroutine
        around it: a caller on the hot path awaits it and calls :meth:`rewrite` only when it fails."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._writes.append((record, done, paid, cost))
        if len(self._writes) == 1:
            loop.call_soon(self._commit_writes)
        return done

    async def rewrite(self, record: Record, exc: ReceiptError) -> None:
        """The store refused ``record`` (``exc``): it is written again for the store's grace, then
        the error is raised."""
        if not await self.health.retry(lambda: record.key not in self._unwritten):
            grace = f"{self.health.grace_s:g}s"
            raise ReceiptError(
                f"{exc} (for {grace}); this call was paid for: its answer is kept in memory and written once "
                "the store takes writes again"
            ) from None

    def sending(self) -> None:
        """A request is about to go to a provider: a cluster job's partition counts it first, where
        its client reads it should the worker die with the request on the wire (``tally``).  In
        place, not on the store's thread: what runs between the count and the request is what a
        worker killed then counts without sending, and a turn of a busy loop is most of that."""
        if self.tally is not None:
            key, field = self.tally
            with contextlib.suppress(StoreFailure):
                # the count is what a dead worker leaves: never worth the call
                self._backend.count(key, f"{field}:sent", 1)  # type: ignore[attr-defined]

    def _commit_writes(self) -> None:
        writes, self._writes = self._writes, []
        rows = [write[0] for write in writes]
        tally = None
        if self.tally is not None and (calls := sum(write[2] for write in writes)):
            tally = Tally(*self.tally, calls, sum(write[3] for write in writes))
        owed = self._owed
        if self._io.remote:  # written later, on the store's thread: kept meanwhile, and found by lookups
            owed.keep(rows)
        # The leases of these calls go in the receipts' transaction (not one of their own).
        released = self.leases.among([row.key for row in rows])

        def written(_: None, exc: BaseException | None) -> None:
            if exc is not None:
                owed.keep(rows)  # paid for: written again at the end of the run
                problem = exc.reason if isinstance(exc, StoreFailure) else str(exc)
                self.health.failed(problem)
                error = ReceiptError(f"cannot write to the receipt store at {self.location}: {problem}")
                for _row, done, *_rest in writes:
                    if not done.done():
                        done.set_exception(error)
                return
            if self.health.reason is not None:
                self.health.mended()
            if self._unwritten:
                owed.written_back(rows)
            if released:
                self.leases.given_back(released)
            for _row, done, *_rest in writes:
                if not done.done():  # a row cancelled while waiting: its receipt is written anyway
                    done.set_result(None)

        self._io.submit(lambda: self._write(rows, tally, released), written)

    def _write(self, rows: list[Record], tally: Tally | None, released: list[str]) -> None:
        backend, owner = self._backend, self.leases.owner
        if tally is None:
            self._marks.counted(lambda: backend.write(rows, released, owner))
        else:  # only a Redis store is given a tally (a cluster job's): it takes one
            self._marks.counted(lambda: backend.write(rows, released, owner, tally=tally))  # type: ignore[call-arg]

    async def written(self, timeout: float) -> bool:
        """Await what this store still has to write (memos, queued receipts), at most ``timeout``
        seconds: a finished run is there for other processes.  False if not (it stays queued)."""
        self.flush()
        watch = getattr(self._backend, "watch", None)
        if watch is not None:  # a server that evicts keys: what it evicted, told with the run's end
            self._io.submit(lambda: watch(final=True), lambda _, __: None)
        caught_up = await self._io.caught_up(timeout)
        self.fold()  # the run's memos, where the next run finds them (SQLite: 4 s at a million)
        return caught_up

    def drain(self) -> None:
        """Everything buffered or queued is written (what looking at the store needs first)."""
        self.flush()
        self._io.drain()

    def close(self) -> None:
        self.drain()  # a remote store's last writes and lease releases, still queued
        self._backend.close()

    # -- row memos (row_memos.py; add_memo is bound in __init__) ---------------------------------

    def memos(self, keys: list[str]) -> dict[str, Memo]:
        """Row memos for the keys that have one (:meth:`~playbook.store.row_memos.RowMemos.find`)."""
        return self._memos.find(keys)

    def flush(self) -> None:
        """Write the row memos buffered (:meth:`~playbook.store.row_memos.RowMemos.flush`)."""
        self._memos.flush()

    def fold(self) -> None:
        """Put the memos written so far where :meth:`memos` finds them
        (:meth:`~playbook.store.row_memos.RowMemos.fold`)."""
        self._memos.fold()

    def warm(self, play: str, rows: Callable[[], Sequence[str]]) -> None:
        """The rows ``rows()`` of ``play`` are about to run: a remote store reads their receipts
        ahead (:meth:`~playbook.store.ahead.ReadAhead.warm`)."""
        self._ahead.warm(play, rows)

    # -- its mark (marks.py) ---------------------------------------------------------------------

    @property
    def lost(self) -> str | None:
        """Why the store is taken for one that lost its receipts (a run on it refuses to start), or None."""
        return self._marks.lost

    @lost.setter
    def lost(self, why: str | None) -> None:
        self._marks.lost = why

    def check_mark(self) -> str | None:
        """Why the store is lost, or None (:meth:`~playbook.store.marks.Marks.check`)."""
        return self._marks.check()

    def remember(self, *, wait: bool = False, accepted: bool = False) -> None:
        """Mark how many receipts the store holds now (:meth:`~playbook.store.marks.Marks.remember`)."""
        self._marks.remember(wait=wait, accepted=accepted)

    def accept_loss(self) -> None:
        """Accept what a lost store holds now (:meth:`~playbook.store.marks.Marks.accept`)."""
        self._marks.accept()

    # -- receipts paid for and not written (owed.py) ---------------------------------------------

    def unwritten(self) -> int:
        """Receipts of paid calls that could not be written (yet)."""
        return len(self._owed)

    def write_unwritten(self) -> int:
        """Try once more to write them; returns how many are still not written."""
        return self._owed.write()

    # -- what runs spent (spending.py) -----------------------------------------------------------

    def add_spend(self, lines: SpendLines, when: float) -> None:
        """Add a run's figures to the ledger (:meth:`~playbook.store.spending.Spending.add`)."""
        self._spending.add(lines, when)

    def spend(self, by: str | Sequence[str] = ("provider", "tool", "day")) -> pd.DataFrame:
        """Calls and money per ``by`` (:meth:`~playbook.store.spending.Spending.read`)."""
        return self._spending.read(by)

    # -- looking at it (inspection.py) -----------------------------------------------------------

    def get(self, tool: Tool[object], input: object = NO_INPUT, /, **kwargs: object) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None``
        (:meth:`~playbook.store.inspection.Inspection.get`)."""
        return self._inspection.get(tool, input, **kwargs)

    def records(self, tool: str | None = None) -> Iterator[tuple[str, Record | None]]:
        """Every receipt (or one tool's) as ``(key, record)``, oldest first, in stored form."""
        return self._inspection.records(tool)

    def receipts(self, tool: str | Tool[object] | None = None) -> pd.DataFrame:
        """All readable receipts (or one tool's) as a DataFrame, oldest first."""
        return self._inspection.receipts(tool)

    def stats(self) -> StoreStats:
        """How many receipts (per tool) and row memos the store holds, and its size (bytes)."""
        return self._inspection.stats()

    def clear(self, tool: str | Tool[object] | None = None) -> int:
        """Remove one tool's receipts and the memos of rows that used it, or everything."""
        return self._inspection.clear(tool)

    def memo_count(self, tool: str) -> int:
        """How many row memos used ``tool``."""
        return self._inspection.memo_count(tool)
