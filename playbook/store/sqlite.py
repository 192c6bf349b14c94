"""The default backend: one SQLite file (``receipts.db``) in a directory.

Every SQL statement on the store's tables is here, in db.py (the file and its schema), in
opening.py (its format marker) or in legacy.py (copying a store of playbook 0.1 in), so the tables
are playbook's own and no library's internals are relied on.  The store's mark is a file beside
``receipts.db`` (``receipts.mark``), not a row in it: a file replaced or emptied takes its rows
with it, the mark stays.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from playbook.addresses import RECEIPT
from playbook.store.db import Database, reason
from playbook.store.opening import initialise, open_store
from playbook.store.protocol import Counts, Damaged, Found, SpendRow
from playbook.store.records import COLUMNS, MemoFields, MemoRow, Record

__all__ = ["MARK", "SqliteBackend"]

MARK = "receipts.mark"  # beside receipts.db: how many receipts the store held, and when (marks.py)

_LOOKUP = "SELECT output, miss, flags, error, at FROM receipt WHERE key = ?"
_LOOKUP_MANY = "SELECT key, output, miss, flags, error, at FROM receipt WHERE key IN ({})"
_CHUNK = 500  # keys per query (SQLite allows 32,766 parameters)
_UPSERT = f"INSERT OR REPLACE INTO receipt ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# A receipt not there yet is inserted (counted by the statement's changes); one already there is
# replaced after (a refreshed call, a damaged record written again).
_ADD = _UPSERT.replace("OR REPLACE", "OR IGNORE")
_SPEND = (
    "INSERT INTO spend (day, provider, tool, calls_paid, cost_paid, calls_reused, cost_saved, calls_unpriced, "
    "reused_unpriced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (day, provider, tool) DO UPDATE SET "
    "calls_paid = calls_paid + excluded.calls_paid, cost_paid = cost_paid + excluded.cost_paid, "
    "calls_reused = calls_reused + excluded.calls_reused, cost_saved = cost_saved + excluded.cost_saved, "
    "calls_unpriced = calls_unpriced + excluded.calls_unpriced, reused_unpriced = reused_unpriced + excluded.reused_unpriced"
)
_MEMO_COLUMNS = "key, play, tools, calls, cost, flags, output"
_MEMOS = f"SELECT {_MEMO_COLUMNS} FROM memo WHERE key IN ({{}})"
# Receipt keys start with addresses.RECEIPT ("r"), step records with addresses.STEP ("s"): a range of
# the index.
_RECEIPTS = f"key >= '{RECEIPT}' AND key < '{chr(ord(RECEIPT) + 1)}'"
# Text columns read as bytes: one record that is not UTF-8 must not stop a listing of the others.
_AS_BYTES = ", ".join(
    c if c in ("at", "cost", "miss", "flags") else f"CAST({c} AS BLOB)" for c in COLUMNS.split(", ")
)
# Leases given back: only by their owner, one statement per chunk of keys.
_RELEASE = "DELETE FROM lease WHERE owner = ? AND key IN ({})"
# A lease is taken where none is, where the last one expired, or where it is ours already: the
# keys it returns, each with whether its receipt is there (looked up in the same statement, so a
# first run, where none is, reads no receipt).  (A multi-row VALUES reads its rows' ``excluded``
# values: one statement per chunk.)
_TAKE = (
    "INSERT INTO lease (key, owner, expires) VALUES {} "
    "ON CONFLICT(key) DO UPDATE SET owner = excluded.owner, expires = excluded.expires "
    "WHERE lease.expires < ? OR lease.owner = excluded.owner "
    "RETURNING key, EXISTS (SELECT 1 FROM receipt WHERE receipt.key = lease.key)"
)
_NOT_UTF8 = "its value is not UTF-8 text (damaged)"
_new = tuple.__new__  # Found(*row) is a Python call, once per receipt read; this is a C one


class SqliteBackend:
    """Records in ``directory/receipts.db``; ``notify`` hears what the user should be told."""

    remote = False

    def __init__(
        self,
        directory: Path,
        *,
        readonly: bool = False,
        notify: Callable[[str], None] | None = None,
        synced: bool = True,
    ) -> None:
        self.directory = directory
        self.location = str(directory)
        self.readonly = readonly
        self.notices: list[str] = []
        self._notify = notify
        self._db = Database(directory, readonly=readonly, synced=synced)
        self._identity: str | None = None
        self._log: bool | None = None  # whether the file has a memo log (one opened read-only may not)
        self.notices += open_store(self._db, directory)
        self._db.on_moved = self._made_again

    def __repr__(self) -> str:
        return f"SqliteBackend({self.location!r})"

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (tests use it to make the disk misbehave)."""
        self._db.end_snapshot()
        return self._db.connection()

    # -- receipts --------------------------------------------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None:
        try:
            found = self._db.snapshot().execute(_LOOKUP, (key,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):  # "Could not decode to UTF-8": that record is damaged
                raise reason(exc) from None
            return Damaged(_NOT_UTF8)
        except sqlite3.Error as exc:
            raise reason(exc) from None
        return None if found is None else _new(Found, found)

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]:
        """One query per chunk of keys (a tenth of the cost of one query per key, at 256 keys)."""
        if len(keys) == 1:
            return [self.lookup(keys[0])]
        cursor = self._db.cursor()
        found: dict[str, Found] = {}
        try:
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                try:
                    rows = cursor.execute(_LOOKUP_MANY.format(",".join("?" * len(chunk))), chunk).fetchall()
                except sqlite3.OperationalError as exc:
                    if "decode" not in str(exc):  # one record of the chunk is not UTF-8: ask one by one
                        raise
                    return [self.lookup(key) for key in keys]
                for row in rows:
                    found[row[0]] = _new(Found, row[1:])
        except sqlite3.Error as exc:
            raise reason(exc) from None
        return [found.get(key) for key in keys]

    def tool_of(self, key: str) -> str | None:
        row = self._db.read(
            lambda con: con.execute("SELECT CAST(tool AS BLOB) FROM receipt WHERE key = ?", (key,)).fetchone()
        )
        return bytes(row[0]).decode("utf-8", "replace") if row and row[0] else None

    def get(self, key: str) -> Record | Damaged | None:
        rows = self._db.read(
            lambda con: con.execute(f"SELECT {_AS_BYTES} FROM receipt WHERE key = ?", (key,)).fetchall()
        )
        return _record(rows[0]) if rows else None

    def write(self, records: Sequence[Record], released: Sequence[str] = (), owner: str = "") -> int:
        """Receipts (and step records) are what was paid for: on the disk before their rows go on.
        ``released``: leases of ``owner`` given back in the same transaction (of the calls these
        receipts answer: another process that takes one finds the receipt).  Returns how many
        receipts it added."""
        receipts = [row for row in records if row.key.startswith(RECEIPT)]

        def write(con: sqlite3.Connection) -> int:
            # Inserted where none is: the statement's changes count the receipts added (a key
            # twice in one write adds one).  Those already there are replaced after, in order.
            added = con.executemany(_ADD, receipts).rowcount if receipts else 0
            if added < len(receipts):
                con.executemany(_UPSERT, receipts)
            if len(receipts) < len(records):
                con.executemany(_UPSERT, [row for row in records if not row.key.startswith(RECEIPT)])
            _release(con, released, owner)
            return added

        return self._db.write(write, synced=True)

    def records(self, tool: str | None = None) -> Iterator[tuple[str, Record | Damaged]]:
        where = _RECEIPTS + (" AND tool = ?" if tool is not None else "")
        args = (tool,) if tool is not None else ()
        rows = self._db.read(
            lambda con: con.execute(
                f"SELECT {_AS_BYTES} FROM receipt WHERE {where} ORDER BY at", args
            ).fetchall()
        )
        for row in rows:
            yield bytes(row[0]).decode("utf-8", "replace"), _record(row)

    # -- row memos -------------------------------------------------------------------------------

    def memos(self, keys: Sequence[str]) -> tuple[Sequence[MemoFields], list[str]]:
        found: list[MemoFields] = []
        bad: list[str] = []
        cursor = self._db.cursor()
        # In key order, keys that share pages read them once: the more keys asked at once, the
        # more they share (8,192 of a million memos: 6% faster than as they come, being digests).
        keys = sorted(keys) if len(keys) > 500 else keys
        try:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                try:
                    rows = cursor.execute(_MEMOS.format(",".join("?" * len(chunk))), chunk).fetchall()
                except sqlite3.OperationalError as exc:
                    if "decode" not in str(exc):
                        raise
                    rows = _one_by_one(cursor, chunk, bad)
                found += rows
        except sqlite3.Error as exc:
            raise reason(exc) from None
        return found, bad

    def write_memos(self, rows: Sequence[MemoRow]) -> None:
        # Appended to the log: put in their places in the memo table (a digest's place is
        # anywhere), a million memos written a flush at a time into a store of a million take 28 s;
        # appended, 1.5 s, and folded in in key order, 4 s more.
        if not self.readonly:
            self._db.write(
                lambda con: con.executemany("INSERT INTO memo_log VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            )

    def fold_memos(self) -> None:
        if self.readonly or not self._db.read(
            lambda con: con.execute("SELECT EXISTS (SELECT 1 FROM memo_log)").fetchone()[0]
        ):
            return

        def fold(con: sqlite3.Connection) -> None:
            # In key order (each page of the table written once); of one key, the last written wins.
            con.execute(
                f"INSERT OR REPLACE INTO memo SELECT {_MEMO_COLUMNS} FROM memo_log ORDER BY key, rowid"
            )
            con.execute("DELETE FROM memo_log")

        self._db.write(fold)

    # SQLite answers a lookup in microseconds: it needs no reading ahead, so it keeps no hints.
    def hints(self, play: str, rows: Sequence[str]) -> dict[str, list[str]]:
        return {}

    def write_hints(self, hints: Sequence[tuple[str, str, str]]) -> None:
        pass

    def write_spend(self, rows: Sequence[SpendRow]) -> None:
        self._db.write(lambda con: con.executemany(_SPEND, rows))

    def spend_rows(self) -> list[SpendRow]:
        def read(con: sqlite3.Connection) -> list[SpendRow]:
            if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'spend'").fetchone():
                return []  # a store of an older playbook, opened read-only
            return [tuple(row) for row in con.execute("SELECT * FROM spend ORDER BY day, provider, tool")]

        return self._db.read(read)

    # -- upkeep ----------------------------------------------------------------------------------

    def counts(self) -> Counts:
        def count(con: sqlite3.Connection) -> tuple[list[tuple[bytes, int, float]], int]:
            by_tool = con.execute(
                f"SELECT CAST(tool AS BLOB), COUNT(*), TOTAL(cost) FROM receipt WHERE {_RECEIPTS} GROUP BY tool"
            ).fetchall()
            (memos,) = con.execute(
                f"SELECT (SELECT COUNT(*) FROM memo){self._and_log('SELECT COUNT(*) FROM memo_log')}"
            ).fetchone()
            return by_tool, int(memos)

        by_tool, memos = self._db.read(count)
        tools = {bytes(name).decode("utf-8", "replace"): (int(n), float(cost)) for name, n, cost in by_tool}
        return Counts(tools, memos, self._db.size())

    def clear(self, tool: str | None = None) -> int:
        def remove(con: sqlite3.Connection) -> int:
            if tool is None:
                return int(
                    con.execute("DELETE FROM receipt").rowcount
                    + con.execute("DELETE FROM memo").rowcount
                    + con.execute("DELETE FROM memo_log").rowcount
                )
            con.execute("DELETE FROM memo WHERE instr(tools, ?) > 0", (f" {tool}=",))
            con.execute("DELETE FROM memo_log WHERE instr(tools, ?) > 0", (f" {tool}=",))
            return int(con.execute(f"DELETE FROM receipt WHERE {_RECEIPTS} AND tool = ?", (tool,)).rowcount)

        removed = self._db.write(remove)
        self._db.read(lambda con: con.execute("PRAGMA incremental_vacuum").fetchall())  # give the space back
        return removed

    # -- its mark (marks.py) -----------------------------------------------------------------------

    def receipt_count(self) -> int:
        (count,) = self._db.read(
            lambda con: con.execute(f"SELECT COUNT(*) FROM receipt WHERE {_RECEIPTS}").fetchone()
        )
        return int(count)

    @property
    def identity(self) -> str:
        """This database's own id, made with it: a file made again has another (opened only to
        look, one with none yet has none: ``""``)."""
        if self._identity is None and self.readonly:
            found = self._db.read(
                lambda con: con.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()
            )
            return "" if found is None else str(found[0])
        if self._identity is None:
            made = uuid.uuid4().hex

            def identify(con: sqlite3.Connection) -> str:
                con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('identity', ?)", (made,))
                return str(con.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()[0])

            self._identity = self._db.write(identify)
        return self._identity

    def read_mark(self) -> str | None:
        try:
            return (self.directory / MARK).read_text()
        except OSError:
            return None

    def write_mark(self, mark: str) -> None:
        with contextlib.suppress(OSError):  # a store that cannot take it is failing louder elsewhere
            temporary = self.directory / f".{MARK}.{os.getpid()}"
            temporary.write_text(mark)
            os.replace(temporary, self.directory / MARK)

    def memo_count(self, tool: str) -> int:
        where = "WHERE instr(tools, ?) > 0"
        count = f"SELECT (SELECT COUNT(*) FROM memo {where}){self._and_log(f'SELECT COUNT(*) FROM memo_log {where}')}"
        args = (f" {tool}=",) * count.count("?")
        row = self._db.read(lambda con: con.execute(count, args).fetchone())
        return int(row[0])

    def _and_log(self, count: str) -> str:
        """`` + (count)``: the memos not folded yet counted too; nothing where there is no log (a
        store an earlier playbook made, opened read-only)."""
        if self._log is None:
            self._log = bool(
                self._db.read(
                    lambda con: con.execute("SELECT 1 FROM sqlite_master WHERE name = 'memo_log'").fetchone()
                )
            )
        return f" + ({count})" if self._log else ""

    # -- leases ----------------------------------------------------------------------------------

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        got = self._take(keys, owner, ttl)
        return [key in got for key in keys]

    def take_and_look(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> tuple[list[bool], list[Found | Damaged | None]]:
        got = self._take(keys, owner, ttl)
        # Read are the receipts the take found there (another process paid and let go just
        # before), and those of the keys another process holds: in a first run, none.
        there = [key for key in dict.fromkeys(keys) if got.get(key, True)]
        read = dict(zip(there, self.lookup_many(there))) if there else {}
        return [key in got for key in keys], [read.get(key) for key in keys]

    def _take(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int]:
        """The keys leased, each with whether its receipt is there."""
        now = time.time()
        expires = now + ttl
        # Each key once (twice in one statement would be an error), in key order: the lease
        # table's pages and the receipts' index are walked once, not jumped about (a tenth
        # cheaper a key).
        asked = sorted(set(keys))

        def take(con: sqlite3.Connection) -> dict[str, int]:
            got: dict[str, int] = {}
            for start in range(0, len(asked), _CHUNK):
                chunk = asked[start : start + _CHUNK]
                values = [v for key in chunk for v in (key, owner, expires)]
                sql = _TAKE.format(",".join(["(?, ?, ?)"] * len(chunk)))
                got.update(con.execute(sql, (*values, now)).fetchall())
            return got

        return self._db.write(take)

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        expires = time.time() + ttl
        self._db.write(
            lambda con: con.executemany(
                "UPDATE lease SET expires = ? WHERE key = ? AND owner = ?",
                [(expires, k, owner) for k in keys],
            )
        )

    def release(self, keys: Sequence[str], owner: str) -> None:
        self._db.write(lambda con: _release(con, keys, owner))

    def holder(self, key: str) -> tuple[str, float] | None:
        row = self._db.read(
            lambda con: con.execute("SELECT owner, expires FROM lease WHERE key = ?", (key,)).fetchone()
        )
        left = 0.0 if row is None else float(row[1]) - time.time()
        return None if row is None or left <= 0 else (str(row[0]), left)

    def close(self) -> None:
        self._db.close()

    # -- a store removed while in use ------------------------------------------------------------

    def _made_again(self, old: sqlite3.Connection) -> None:
        """The store was removed or replaced from outside while in use, and is made again: copy
        into it what the old file, still open, holds, and say so."""
        counts = self._db.write(lambda con: (initialise(self.directory, con), _copy(old, con))[1])
        note = (
            f"the receipt store at {self.location} was removed or replaced while in use; playbook made it again there and "
            f"copied into it the {counts[0]} receipts and {counts[1]} row memos the old one held, so nothing paid for is lost"
        )
        self.notices.append(note)
        if self._notify is not None:
            self._notify(note)


def _record(row: tuple[Any, ...]) -> Record | Damaged:
    """A ``Record`` from a row read with ``_AS_BYTES``, or ``Damaged`` if its text is not UTF-8."""
    try:
        values: list[Any] = [bytes(v).decode("utf-8") if isinstance(v, bytes) else v for v in row]
        return Record(*values)
    except UnicodeDecodeError:
        return Damaged(_NOT_UTF8)


def _release(con: sqlite3.Connection, keys: Sequence[str], owner: str) -> None:
    """Give back ``owner``'s leases on ``keys``."""
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        con.execute(_RELEASE.format(",".join("?" * len(chunk))), (owner, *chunk))


def _one_by_one(cursor: sqlite3.Cursor, chunk: list[str], bad: list[str]) -> list[MemoFields]:
    """The memos of ``chunk`` that are UTF-8 text, one by one (one of them is not: damaged)."""
    rows: list[MemoFields] = []
    for key in chunk:
        try:
            rows += cursor.execute(_MEMOS.format("?"), (key,)).fetchall()
        except sqlite3.OperationalError:
            bad.append(key)
    return rows


def _copy(old: sqlite3.Connection, new: sqlite3.Connection) -> tuple[int, int]:
    """Copy every receipt and row memo from ``old`` into ``new`` (keeping what ``new`` has); returns
    the counts."""
    counts = []
    for select, insert in (
        (f"SELECT {COLUMNS} FROM receipt", _ADD),
        ("SELECT * FROM memo", "INSERT OR IGNORE INTO memo VALUES (?, ?, ?, ?, ?, ?, ?)"),
        (
            f"SELECT {_MEMO_COLUMNS} FROM memo_log ORDER BY rowid",
            "INSERT OR REPLACE INTO memo VALUES (?, ?, ?, ?, ?, ?, ?)",
        ),
    ):
        copied = 0
        try:
            rows = old.execute(select)
            while batch := rows.fetchmany(10_000):
                new.executemany(insert, batch)
                copied += len(batch)
        except sqlite3.DatabaseError:
            pass  # the old file cannot be read any more either: keep what was copied
        counts.append(copied)
    return counts[0], counts[1] + counts[2]
