"""The SQLite file a store lives in: one connection per thread, the schema, write transactions,
and what a failure means, in words a user can act on.

playbook owns this layer (``sqlite3`` directly): every statement on the store's tables is in
this package, and the tables are playbook's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from playbook.store.protocol import StoreFailure

__all__ = ["FILE", "FORMAT", "Database", "StoreFailure"]

T = TypeVar("T")

FILE = "receipts.db"
_BUSY = 60.0  # seconds to wait for another process's lock on the store before giving up
_CHECKPOINT_PAGES = 16_384  # pages of the write-ahead log (4 kB each) between two checkpoints: 64 MB
_WINDOW = 256  # lookups that share one read transaction, at most (see Database.snapshot)
FORMAT = 2  # 1 was a diskcache directory (cache.db); see legacy.py
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    # Receipts ("r…") and step records ("s…"), one column per field (records.py): a replay reads
    # and parses only what it returns.  Outputs can be large (a whole JSON answer), so a rowid
    # table, which keeps big rows out of the key index.
    "CREATE TABLE IF NOT EXISTS receipt (key TEXT PRIMARY KEY, tool TEXT NOT NULL, version TEXT NOT NULL, "
    "account TEXT NOT NULL, at REAL NOT NULL, cost REAL NOT NULL, miss INTEGER NOT NULL, flags INTEGER NOT NULL, "
    "input TEXT, output TEXT NOT NULL, error TEXT)",
    "CREATE INDEX IF NOT EXISTS receipt_tool ON receipt (tool)",
    # Row memos are small and many: a table clustered on the key.  ``tools`` is " a=fp b=fp ":
    # the tools the row used, so clearing a tool finds its memos in SQL.
    "CREATE TABLE IF NOT EXISTS memo (key TEXT PRIMARY KEY, play TEXT NOT NULL, tools TEXT NOT NULL, calls INTEGER NOT NULL, "
    "cost REAL NOT NULL, flags INTEGER NOT NULL, output TEXT NOT NULL) WITHOUT ROWID",
    # Memos as a run writes them, appended (a memo's place in the table above is wherever its
    # digest falls: written there one flush at a time, a page per memo); moved there in key order
    # when a run ends or starts (SqliteBackend.fold_memos).
    "CREATE TABLE IF NOT EXISTS memo_log (key TEXT NOT NULL, play TEXT NOT NULL, tools TEXT NOT NULL, calls INTEGER NOT NULL, "
    "cost REAL NOT NULL, flags INTEGER NOT NULL, output TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS lease (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL) WITHOUT ROWID",
    # What runs paid and reused, per UTC day, provider ("": none) and tool: added to as runs end.
    "CREATE TABLE IF NOT EXISTS spend (day TEXT NOT NULL, provider TEXT NOT NULL, tool TEXT NOT NULL, calls_paid INTEGER NOT NULL, "
    "cost_paid REAL NOT NULL, calls_reused INTEGER NOT NULL, cost_saved REAL NOT NULL, "
    "calls_unpriced INTEGER NOT NULL DEFAULT 0, reused_unpriced INTEGER NOT NULL DEFAULT 0, "
    "PRIMARY KEY (day, provider, tool)) WITHOUT ROWID",
)
# Columns added since a table was first made: a store made by an older playbook gains them when opened.
_ADDED = (
    ("spend", "calls_unpriced", "INTEGER NOT NULL DEFAULT 0"),
    ("spend", "reused_unpriced", "INTEGER NOT NULL DEFAULT 0"),
)

_REASONS = {
    "SQLITE_FULL": "the disk is full (ENOSPC)",
    "SQLITE_READONLY": "it is read-only (EROFS, or no permission to write)",
    "SQLITE_CANTOPEN": "its files cannot be opened (the directory was removed, or no permission)",
    "SQLITE_IOERR": "the disk reported an I/O error (EIO)",
    "SQLITE_BUSY": "another process has kept it locked for more than a minute",
    "SQLITE_LOCKED": "another connection has kept it locked",
    "SQLITE_CORRUPT": "its database is damaged",
    "SQLITE_NOTADB": "its database file is not an SQLite database",
    "SQLITE_PERM": "no permission (EACCES)",
    "SQLITE_AUTH": "no permission (EACCES)",
}


_forks = 0  # bumped in a forked child: a connection must not cross a fork, so every thread reconnects


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def reason(exc: BaseException) -> StoreFailure:
    """What went wrong, from an sqlite3 or OS error."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorname", None) or ""
        for prefix, words in _REASONS.items():
            if code.startswith(prefix):
                detail = f"{code}: {exc}" if str(exc) not in words else code
                return StoreFailure(f"{words} ({detail})", code)
        return StoreFailure(str(exc), code or None)
    if isinstance(exc, OSError):
        import errno

        name = errno.errorcode.get(exc.errno or 0, "")
        return StoreFailure(f"{exc.strerror or exc} ({name})" if name else str(exc), name or None)
    return StoreFailure(f"{type(exc).__name__}: {exc}")


class Database:
    """``receipts.db`` in a store directory."""

    def __init__(
        self,
        directory: Path,
        *,
        readonly: bool = False,
        synced: bool = True,
        on_moved: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.directory = directory
        # Writes asked to be synced reach the disk (fsync) before they return: a receipt survives
        # a machine crash, not only a killed process.  False: SQLite's NORMAL, for every write.
        self.synced = synced
        self.file = directory / FILE
        self.readonly = readonly
        # Told when a write finds the file gone or replaced (see moved()), once the file is made
        # again, with a connection still open on the old one (an unlinked file stays readable).
        self.on_moved = on_moved
        self._local = threading.local()
        self._generation = 0  # bumped when the file is reopened: every thread then reconnects
        self._identity: tuple[int, int] | None = None

    def open(self) -> None:
        """Create the directory and the file if needed, and the tables (read-only: neither);
        raises sqlite3/OS errors."""
        deadline = time.monotonic() + _BUSY
        while True:
            try:
                self._open()
                return
            except sqlite3.OperationalError as exc:
                # Two processes making one new store: switching it to WAL takes a lock that
                # SQLite reports as busy at once, without waiting.  Wait here instead.
                if (
                    getattr(exc, "sqlite_errorname", "") not in ("SQLITE_BUSY", "SQLITE_LOCKED")
                    or time.monotonic() > deadline
                ):
                    raise
                self.close()
                time.sleep(0.01)

    def _open(self) -> None:
        if self.readonly:
            self.connection().execute("SELECT 1 FROM meta LIMIT 1")  # a table of ours: this is a store
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            con = self.connection()
            # Space freed by clearing receipts goes back to the disk (PRAGMA incremental_vacuum).
            con.execute("PRAGMA auto_vacuum = INCREMENTAL")
            for statement in SCHEMA:
                con.execute(statement)
            for table, column, kind in _ADDED:
                if column not in {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        stat = os.stat(self.file)
        self._identity = (stat.st_dev, stat.st_ino)

    def reopen(self) -> None:
        """Start over on whatever is (or is not) at the path now: the old file is gone."""
        self._generation += 1
        self.open()

    def connection(self) -> sqlite3.Connection:
        local = self._local
        con = getattr(local, "con", None)
        if con is None or local.generation != self._generation + _forks:
            con = self._connect()
            # NORMAL in WAL mode: a commit survives the process being killed, but a machine crash
            # (a power cut, a kernel panic, a disk remounted read-only) can take the last ones.
            # What must survive those too is written with synced=True (see write()).
            con.execute("PRAGMA synchronous = NORMAL")
            # Reads on the replay path are B-tree lookups: keep the pages in memory, up to 16 MB
            # (the inner pages of a store of millions of receipts).  Not memory-mapped: mapped pages
            # of a large store count in the process's memory (190 bytes a row at a million rows)
            # and read no faster here.
            con.execute("PRAGMA cache_size = -16384")
            local.con, local.generation = con, self._generation + _forks
            local.cursor = con.cursor()
            local.window = 0  # lookups left in the read transaction they share (snapshot()); 0: none open
            local.loop = local.ending = None  # its loop; the loop whose turn's end will end it
        return con

    def _connect(self) -> sqlite3.Connection:
        # timeout: how long to wait for another process's write lock before giving up.
        connect = functools.partial(
            sqlite3.connect, timeout=_BUSY, isolation_level=None, check_same_thread=False
        )
        if not self.readonly:
            con = connect(self.file)
            con.execute("PRAGMA journal_mode = WAL")
            # The log is copied into the file (a checkpoint) every 64 MB, not every 4 MB.  A
            # receipt's address falls anywhere in the key index, so every commit rewrites pages all
            # over it: a longer log copies each page once for many commits (a first run of a
            # million rows 13% faster).  The log file is cut back to 64 MB after a checkpoint.
            con.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
            con.execute(f"PRAGMA journal_size_limit = {_CHECKPOINT_PAGES * 4096}")
            return con
        if not self.file.is_file():
            raise sqlite3.OperationalError(f"no store file {self.file}")
        # a file: URI names an absolute path; a store may be given as "named_store"
        uri = self.file.absolute().as_uri()
        try:
            con = connect(f"{uri}?mode=ro", uri=True)
            con.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        except sqlite3.OperationalError:
            # A WAL database on a read-only disk cannot take the reader's lock: read it as it is.
            con = connect(f"{uri}?immutable=1", uri=True)
        return con

    def cursor(self) -> sqlite3.Cursor:
        """This thread's reusable cursor: the hot read path skips making one per query."""
        local = self._local
        if getattr(local, "generation", None) != self._generation + _forks:
            self.connection()
        return local.cursor  # type: ignore[no-any-return]

    def snapshot(self) -> sqlite3.Cursor:
        """This thread's cursor for a lookup on the event loop, in a read transaction that the
        lookups of one turn of the loop share (at most ``_WINDOW`` of them).  Outside a
        transaction, each statement begins and ends one of its own: in WAL mode, that is half of
        what a point lookup costs.  A snapshot kept longer would hide what other processes write
        meanwhile, and hold back their checkpoints: it ends with the turn, at this thread's next
        write or other read, or after ``_WINDOW`` lookups.  With no loop running, a lookup is a
        statement of its own."""
        cursor = self.cursor()
        local = self._local
        # (A loop kept between runs stops with the end of its last turn still to come: its window
        # ends here, not at the next run.)
        if local.window and local.loop.is_running():
            local.window -= 1
            return cursor
        con = cursor.connection
        if con.in_transaction:  # this window's lookups are done: a new snapshot
            con.execute("COMMIT")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            local.window = 0
            return cursor
        con.execute("BEGIN")
        local.window, local.loop = _WINDOW - 1, loop
        if local.ending is not loop:
            local.ending = loop
            loop.call_soon(self._turn_ended)
        return cursor

    def end_snapshot(self) -> None:
        """End this thread's lookups' read transaction, if one is open (before any other statement:
        outside :meth:`write`, a transaction open on this thread's connection is theirs)."""
        local = self._local
        con = getattr(local, "con", None)
        if con is not None:
            local.window = 0
            if con.in_transaction:
                con.execute("COMMIT")

    def _turn_ended(self) -> None:
        self._local.ending = None
        with contextlib.suppress(sqlite3.Error):  # only reads end: the next statement says what is wrong
            self.end_snapshot()

    def moved(self) -> bool:
        """True when the file opened is no longer at the path (the directory was removed, or
        the file replaced): writes would go to a file nobody will read again."""
        try:
            stat = os.stat(self.file)
        except OSError:
            return True
        return (stat.st_dev, stat.st_ino) != self._identity

    def write(self, work: Callable[[sqlite3.Connection], T], *, synced: bool = False) -> T:
        """Run ``work`` in one write transaction; raises :class:`StoreFailure`.  Every writer
        (receipts, memos, leases) first notices a file removed or replaced from outside.

        ``synced``: the commit is on the disk when this returns (SQLite's FULL: the log is
        fsync'd at the commit), unless the store was opened with ``synced=False``.  One commit
        holds every record written in a turn of the event loop, and those that finish while a
        sync is under way go in the next: the syncs grow fewer as the rows grow faster."""
        try:
            self.end_snapshot()
            if self.on_moved is not None and self.moved():
                self._made_again()
            con = self.connection()
            full = synced and self.synced
            if full:
                con.execute("PRAGMA synchronous = FULL")
            con.execute("BEGIN IMMEDIATE")
            try:
                result = work(con)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            finally:
                if full:
                    con.execute("PRAGMA synchronous = NORMAL")
            return result
        except (sqlite3.Error, OSError) as exc:
            raise reason(exc) from None

    def _made_again(self) -> None:
        old = self.connection()
        try:
            self.reopen()
            self.on_moved(old)  # type: ignore[misc]
        finally:
            old.close()

    def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on this thread's connection; raises :class:`StoreFailure`."""
        try:
            self.end_snapshot()
            return work(self.connection())
        except (sqlite3.Error, OSError) as exc:
            raise reason(exc) from None

    def size(self) -> int:
        """Bytes the database holds (its pages, whether checkpointed from the log or not)."""
        (pages,) = self.read(lambda con: con.execute("PRAGMA page_count").fetchone())
        (page,) = self.read(lambda con: con.execute("PRAGMA page_size").fetchone())
        return int(pages) * int(page)

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            try:
                con.close()
            except sqlite3.Error:
                pass
            self._local.con = None
