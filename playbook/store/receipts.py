"""The receipt store: every paid tool result, and every finished row, as JSON in SQLite.

A directory (``.playbook/``, ``$PLAYBOOK_HOME`` or one you name) holding ``receipts.db``.  Every
record is tagged JSON text (:mod:`playbook.tagged`): never a pickle, and a replay gives back
exactly the value first stored.

Damage never stops a run.  A store that cannot be opened (not a database, a newer format) raises
:class:`ReceiptError` naming the directory and what to do.  One record that cannot be read (bad
JSON, bad UTF-8, a tag from a newer playbook) counts as missing, with a warning naming it: the
call is made again and its new receipt replaces the bad one.  A store that fails while a run goes
on (disk full, read-only, removed) fails the rows that needed it, with the reason and the path;
receipts of calls already paid for are kept in memory and written again at the end of the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..errors import ReceiptError
from ..models import Receipt
from ..tagged import decode, loads
from ..tools.base import NO_INPUT
from .db import Database, StoreFailure, reason
from .leases import Leases
from .opening import ELSEWHERE as _ELSEWHERE
from .opening import initialise, open_store
from .records import COLUMNS, OUTPUT_TAGGED, Record, parse_tools, receipt_of

if TYPE_CHECKING:
    from ..tools.base import Tool

__all__ = ["MISSING", "ReceiptStore", "default_store", "home"]

_LOOKUP = "SELECT output, miss, flags, error, at FROM receipt WHERE key = ?"
_UPSERT = f"INSERT OR REPLACE INTO receipt ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_RECEIPTS = "key >= 'r' AND key < 's'"  # receipt keys start with "r", step records with "s"
_json_loads = json.loads
_logger = logging.getLogger("playbook.store")


class _Missing:
    """Sentinel for "no receipt": a tool may legitimately return ``None``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


def home() -> Path:
    """``$PLAYBOOK_HOME``, or ``.playbook`` in the working directory."""
    return Path(os.environ.get("PLAYBOOK_HOME") or ".playbook")


class ReceiptStore:
    """Durable receipts of tool calls and memos of finished rows, in a directory.

    ``ReceiptStore()`` uses ``$PLAYBOOK_HOME`` or ``.playbook/`` in the working directory.
    ``readonly=True`` opens an existing store only to look at it (what ``python -m playbook cache
    stats/list/export`` do), which works on a full disk or a read-only mount too.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = 30.0,
        readonly: bool = False,
    ) -> None:
        self.path = Path(path) if path is not None else home()
        self.clock = clock
        self.notices: list[str] = []  # what went wrong with the store, for the runs that use it
        self._db = Database(self.path, readonly=readonly)
        self.notices += open_store(self._db, self.path)
        self._db.on_moved = self._made_again
        self._pending_memos: list[tuple[str, str, str, int, float, int, str]] = []
        self._flushed = time.monotonic()
        self._warned: set[str] = set()  # unreadable records already reported
        self._writes: list[tuple[Record, asyncio.Future[None]]] = []
        self._unwritten: dict[str, Record] = {}  # paid for, not yet on disk
        self.inflight: dict[str, asyncio.Future[None]] = {}  # receipt key -> call being paid for now
        self.leases = Leases(self._db, self.path, ttl=lease_ttl)  # the same, across processes

    def __repr__(self) -> str:
        return f"ReceiptStore({str(self.path)!r})"

    # -- receipts (hot path) -------------------------------------------------------------

    def lookup(self, key: str, ttl: float | None = None) -> Any:
        """``(value, miss, error)`` stored for ``key`` (the value as first returned), or
        ``MISSING`` (also when older than ``ttl`` seconds).  ``error`` is set when the answer was
        paid for but had no JSON form.

        A record that cannot be read is ``MISSING`` too, with a warning naming it, so the call
        is made again and its new receipt replaces the bad one.  Failing the row instead would
        fail it again on every rerun, and the only way out, clearing the tool's receipts, would
        throw away every other call of that tool already paid for.
        """
        try:
            found = self._db.cursor().execute(_LOOKUP, (key,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):  # "Could not decode to UTF-8": that record is damaged
                raise self._read_error(exc) from None
            self._warn_unreadable(key, "its value is not UTF-8 text (damaged)")
            return MISSING
        except sqlite3.Error as exc:
            raise self._read_error(exc) from None
        if found is None:
            row = self._unwritten.get(key) if self._unwritten else None
            if row is None:
                return MISSING
            found = (row.output, row.miss, row.flags, row.error, row.at)
        output, miss, flags, error, at = found
        if ttl is not None and self.clock() - at > ttl:
            return MISSING
        try:
            value = _json_loads(output)
            return (decode(value) if flags & OUTPUT_TAGGED else value), bool(miss), error
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # bad JSON, or a tag this playbook does not know
            self._warn_unreadable(key, _damage(exc))
            return MISSING

    def _read_error(self, exc: sqlite3.Error) -> ReceiptError:
        return ReceiptError(f"cannot read the receipt store at {self.path}: {reason(exc).reason}; {_ELSEWHERE}")

    def _warn_unreadable(self, key: str, problem: str) -> None:
        if key not in self._warned:  # a call looks its receipt up more than once (before and after its lease)
            self._warned.add(key)
            _logger.warning(
                "%s; it counts as missing: a run that needs it makes the call again and replaces it", self._unreadable(key, problem)
            )

    def _unreadable(self, key: str, problem: str) -> str:
        try:
            row = self._db.read(lambda con: con.execute("SELECT CAST(tool AS BLOB) FROM receipt WHERE key = ?", (key,)).fetchone())
        except StoreFailure:
            row = None
        tool = f" of tool {row[0].decode('utf-8', 'replace')!r}" if row and row[0] else ""
        return f"receipt {key}{tool} in {self.path} cannot be read: {problem}"

    async def commit(self, record: Record) -> None:
        """Write one record durably; returns once it is committed (``ReceiptError`` if it cannot be).

        Records written in the same turn of the event loop share one transaction (group
        commit): each row still waits for its own receipt to be on disk, but a burst of 64
        finishing calls costs one commit instead of 64.
        """
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._writes.append((record, done))
        if len(self._writes) == 1:
            loop.call_soon(self._commit_writes)
        await done

    def _commit_writes(self) -> None:
        writes, self._writes = self._writes, []
        rows = [row for row, _ in writes]
        try:
            self._db.write(lambda con: con.executemany(_UPSERT, rows))
        except (StoreFailure, ReceiptError) as exc:
            problem = exc.reason if isinstance(exc, StoreFailure) else str(exc)
            error = ReceiptError(f"cannot write to the receipt store at {self.path}: {problem}")
            for row, done in writes:
                self._unwritten[row.key] = row  # paid for: kept, and written again at the end of the run
                if not done.done():
                    done.set_exception(error)
            return
        for row, done in writes:
            self._unwritten.pop(row.key, None)
            if not done.done():  # a row cancelled while waiting: its receipt is written anyway
                done.set_result(None)

    def _made_again(self, old: sqlite3.Connection) -> None:
        """The store was removed or replaced from outside while in use, and is made again: copy
        into it what the old file, still open, holds, and say so."""
        counts = self._db.write(lambda con: (initialise(self.path, con), _copy(old, con))[1])
        note = (
            f"the receipt store at {self.path} was removed or replaced while in use; playbook made it again there and "
            f"copied into it the {counts[0]} receipts and {counts[1]} row memos the old one held, so nothing paid for is lost"
        )
        _logger.warning("%s", note)
        self.notices.append(note)

    def unwritten(self) -> int:
        """Receipts of paid calls that could not be written (yet)."""
        return len(self._unwritten)

    def write_unwritten(self) -> int:
        """Try once more to write the receipts that failed to be written; returns how many are still not on disk."""
        if not self._unwritten:
            return 0
        rows = list(self._unwritten.values())
        try:
            self._db.write(lambda con: con.executemany(_UPSERT, rows))
        except (StoreFailure, ReceiptError):
            return len(self._unwritten)
        self._unwritten.clear()
        return 0

    # -- row memos (buffered: losing one only means a row replays against its receipts) --

    def memos(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """Row memos for the keys that have one, in one SQL query per 500 keys: each a dict with
        the row's ``output``, how many ``calls`` it made, their ``cost`` and the ``tools`` it used
        (name -> fingerprint).

        A memo that cannot be read is left out (with a warning): its row runs again, against
        its receipts, so that costs nothing.
        """
        found: dict[str, dict[str, Any]] = {}
        bad: list[str] = []
        cursor = self._db.cursor()
        select = "SELECT key, output, flags, calls, cost, tools FROM memo WHERE key IN ({})"
        try:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                query = select.format(",".join("?" * len(chunk)))
                try:
                    rows = cursor.execute(query, chunk).fetchall()
                except sqlite3.OperationalError as exc:
                    if "decode" not in str(exc):
                        raise
                    rows = self._readable_memos(cursor, select.format("?"), chunk, bad)
                for key, output, flags, calls, cost, tools in rows:
                    try:
                        out = loads(output)
                        if type(out) is not dict:
                            raise ValueError("not a row's output")
                        found[key] = {"output": decode(out) if flags & OUTPUT_TAGGED else out, "calls": calls, "cost": cost,
                                      "tools": parse_tools(tools)}  # fmt: skip
                    except (ValueError, TypeError, KeyError, IndexError):
                        bad.append(key)
        except sqlite3.Error as exc:
            raise self._read_error(exc) from None
        if bad:
            _logger.warning(
                "%d row memo(s) in %s cannot be read (first: %s); those rows run again, against their receipts",
                len(bad), self.path, bad[0],
            )  # fmt: skip
        return found

    @staticmethod
    def _readable_memos(cursor: sqlite3.Cursor, query: str, chunk: list[str], bad: list[str]) -> list[Any]:
        """The memos of ``chunk`` that are UTF-8 text, one by one (one of them is not: damaged)."""
        rows = []
        for key in chunk:
            try:
                rows += cursor.execute(query, (key,)).fetchall()
            except sqlite3.OperationalError:
                bad.append(key)
        return rows

    def add_memo(self, key: str, play: str, tools: str, calls: int, cost: float, flags: int, output: str) -> None:
        """Remember a finished row (``output``: its output as JSON text; ``tools``: " a=fp b=fp ");
        written at the next flush.  A crash loses at most the last half second of memos, and
        those rows replay from their receipts for free."""
        pending = self._pending_memos
        pending.append((key, play, tools, calls, cost, flags, output))
        if len(pending) >= 16384 or (len(pending) >= 1024 and time.monotonic() - self._flushed > 0.5):
            self.flush()

    def flush(self) -> None:
        """Write buffered row memos in one transaction.  If they cannot be written, they are
        dropped with a warning: the rows run again next time, against their receipts."""
        pending, self._pending_memos = self._pending_memos, []
        self._flushed = time.monotonic()
        if not pending or self._db.readonly:
            return
        try:
            self._db.write(lambda con: con.executemany("INSERT OR REPLACE INTO memo VALUES (?, ?, ?, ?, ?, ?, ?)", pending))
        except StoreFailure as exc:
            note = (
                f"{len(pending)} row memos could not be written to the receipt store at {self.path}: {exc.reason}. "
                "Those rows run again next time, against their receipts (no call is paid for twice)"
            )
            _logger.warning("%s", note)
            self.notices.append(note)

    # -- public inspection ---------------------------------------------------------------

    def get(self, tool: Tool, input: Any = NO_INPUT, /, **kwargs: Any) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None`` if it was never paid for.

        Raises ``ReceiptError`` if the receipt is there but cannot be read.
        """
        key = tool.key(tool.bind(input, kwargs))
        rows = self._db.read(lambda con: con.execute(f"SELECT {_AS_BYTES} FROM receipt WHERE key = ?", (key,)).fetchall())
        if not rows:
            return None
        try:
            return receipt_of(_record(rows[0]))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise ReceiptError(
                f"{self._unreadable(key, _damage(exc))}. A run that needs it makes the call again and replaces it; "
                f"`python -m playbook cache clear --store {self.path} --tool {tool.name}` drops all of that tool's receipts."
            ) from None

    def records(self, tool: str | None = None) -> Iterator[tuple[str, Record | None]]:
        """Every receipt (or one tool's) as ``(key, record)``, oldest first, values in stored
        form; ``record`` is ``None`` for one that cannot be read."""
        where = _RECEIPTS + (" AND tool = ?" if tool is not None else "")
        args = (tool,) if tool is not None else ()
        rows = self._db.read(lambda con: con.execute(f"SELECT {_AS_BYTES} FROM receipt WHERE {where} ORDER BY at", args).fetchall())
        for row in rows:
            try:
                record: Record | None = _record(row)
            except ValueError:
                record = None
            yield bytes(row[0]).decode("utf-8", "replace"), record

    def receipts(self, tool: str | Tool | None = None) -> pd.DataFrame:
        """All readable receipts (or one tool's) as a DataFrame, oldest first; values as first returned."""
        name = getattr(tool, "name", tool)
        rows = []
        for _, record in self.records(name):
            if record is None:
                continue
            try:
                rows.append(receipt_of(record).model_dump())
            except (ValueError, TypeError, KeyError, IndexError):
                continue  # a tag this playbook does not know: left out, as an unreadable record is
        return pd.DataFrame(rows, columns=list(Receipt.model_fields))

    def stats(self) -> dict[str, Any]:
        """How many receipts (per tool) and row memos the store holds, and its size on disk."""
        self.flush()

        def count(con: sqlite3.Connection) -> tuple[list[Any], int]:
            by_tool = con.execute(f"SELECT CAST(tool AS BLOB), COUNT(*), TOTAL(cost) FROM receipt WHERE {_RECEIPTS} GROUP BY tool").fetchall()
            (memos,) = con.execute("SELECT COUNT(*) FROM memo").fetchone()
            return by_tool, memos

        by_tool, memos = self._db.read(count)
        tools = {bytes(name).decode("utf-8", "replace"): n for name, n, _ in by_tool}
        return {
            "path": str(self.path),
            "receipts": sum(tools.values()),
            "by_tool": dict(sorted(tools.items())),
            "row_memos": memos,
            "cost_stored": round(sum(cost for *_, cost in by_tool), 6),
            "bytes": self._db.size(),
        }

    def clear(self, tool: str | Tool | None = None) -> int:
        """Remove one tool's receipts, and the row memos of rows that used it, so the next run
        pays for that tool again; or, without ``tool``, everything.  Returns the records removed."""
        self.flush()
        name = getattr(tool, "name", tool)

        def remove(con: sqlite3.Connection) -> int:
            if name is None:
                return con.execute("DELETE FROM receipt").rowcount + con.execute("DELETE FROM memo").rowcount
            con.execute("DELETE FROM memo WHERE instr(tools, ?) > 0", (f" {name}=",))
            return con.execute(f"DELETE FROM receipt WHERE {_RECEIPTS} AND tool = ?", (name,)).rowcount

        try:
            removed = self._db.write(remove)
            self._db.read(lambda con: con.execute("PRAGMA incremental_vacuum").fetchall())  # give the space back
            return removed
        except StoreFailure as exc:
            raise ReceiptError(f"cannot clear the receipt store at {self.path}: {exc.reason}") from None

    def memo_count(self, tool: str) -> int:
        """How many row memos used ``tool`` (what :meth:`clear` of it drops besides its receipts)."""
        self.flush()
        return self._db.read(lambda con: con.execute("SELECT COUNT(*) FROM memo WHERE instr(tools, ?) > 0", (f" {tool}=",)).fetchone()[0])

    def connection(self) -> sqlite3.Connection:
        """This thread's SQLite connection to the store (for tests that make the disk misbehave)."""
        return self._db.connection()

    def close(self) -> None:
        self.flush()
        self._db.close()


# Text columns read as bytes: one record that is not UTF-8 must not stop a listing of the others.
_AS_BYTES = ", ".join(c if c in ("at", "cost", "miss", "flags") else f"CAST({c} AS BLOB)" for c in COLUMNS.split(", "))


def _record(row: tuple[Any, ...]) -> Record:
    """A ``Record`` from a row read with ``_AS_BYTES``; ``ValueError`` if its text is not UTF-8 or
    its values not JSON."""
    record = Record(*(bytes(v).decode("utf-8") if isinstance(v, bytes) else v for v in row))
    loads(record.output)
    if record.input is not None:
        loads(record.input)
    return record


def _copy(old: sqlite3.Connection, new: sqlite3.Connection) -> tuple[int, int]:
    """Copy every receipt and row memo from ``old`` into ``new`` (keeping what ``new`` has); returns the counts."""
    counts = []
    for select, insert in (
        (f"SELECT {COLUMNS} FROM receipt", _UPSERT.replace("OR REPLACE", "OR IGNORE")),
        ("SELECT * FROM memo", "INSERT OR IGNORE INTO memo VALUES (?, ?, ?, ?, ?, ?, ?)"),
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
    return counts[0], counts[1]


def _damage(exc: BaseException) -> str:
    """What is wrong with a record that cannot be read."""
    if isinstance(exc, UnicodeDecodeError):
        return "its value is not UTF-8 text (damaged)"
    if isinstance(exc, ValueError) and str(exc).startswith("unknown tag"):
        return f"its value cannot be decoded ({exc})"
    if isinstance(exc, ValueError):
        return "its value is not valid JSON (truncated or overwritten)"
    return f"its value is not a record playbook wrote ({type(exc).__name__}: {exc})"


_default: ReceiptStore | None = None


def default_store() -> ReceiptStore:
    """The store under ``$PLAYBOOK_HOME`` (or ``.playbook/``), opened once per directory."""
    global _default
    if _default is None or _default.path != home():
        _default = ReceiptStore()
    return _default

