"""The receipt store: every paid tool result, and every finished row, as JSON on disk.

Receipts live in a diskcache ``Cache`` (SQLite + files), keyed by short hex digests from
:mod:`playbook.keys`.  Values are JSON text: the disk class below refuses to pickle on write and
refuses to unpickle on read, so the store never holds or runs pickled data, whatever wrote to
the directory.

Row memos live in a lean table of their own in the same SQLite file.  A run writes one per
finished row, thousands a second; diskcache's ``set`` (a SELECT, an INSERT and two trigger
updates per row, plus its indexes) made memo writes cost more than the rest of a replayed row.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diskcache
import pandas as pd

from .errors import ReceiptError
from .keys import canonical, jsonable, receipt_key, to_json
from .leases import Leases
from .models import Receipt
from .tools import NO_INPUT

if TYPE_CHECKING:
    from .tools import Tool

__all__ = ["MISSING", "ReceiptStore", "default_store"]

FORMAT = 1
_FORMAT_KEY = "playbook/format"
_MEMO = "playbook_memo"
_MODE_RAW = diskcache.core.MODE_RAW
_LOOKUP = "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"


class _Missing:
    """Sentinel for "no receipt": a tool may legitimately return ``None``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class _JSONTextDisk(diskcache.Disk):
    """Stores values as JSON text; never pickles, never unpickles."""

    def store(self, value: Any, read: bool, key: Any = diskcache.UNKNOWN) -> Any:
        if read:
            raise ReceiptError("the receipt store only holds JSON values, not file handles")
        return super().store(_dumps(value), False, key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_TEXT):
            # Something other than playbook wrote here; unpickling it could run code.
            raise ReceiptError(f"the receipt store holds a non-JSON value (mode {mode}); refusing it")
        text = super().fetch(mode, filename, value, read)
        try:
            return json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ReceiptError(f"a receipt is corrupted (not JSON): {exc}") from None


def _home() -> Path:
    return Path(os.environ.get("PLAYBOOK_HOME") or ".playbook")


class ReceiptStore:
    """Durable receipts of tool calls and memos of finished rows, in a directory.

    ``ReceiptStore()`` uses ``$PLAYBOOK_HOME`` or ``.playbook/`` in the working directory.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, clock: Callable[[], float] = time.time, lease_ttl: float = 30.0
    ) -> None:
        self.path = Path(path) if path is not None else _home()
        self._clock = clock
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._cache = diskcache.Cache(
                str(self.path),
                disk=_JSONTextDisk,
                eviction_policy="none",  # receipts are paid for: never evict them to save space
                size_limit=2**62,
                cull_limit=0,
                statistics=False,
                tag_index=True,
            )
            found = self._cache.get(_FORMAT_KEY, default=None)
            if found is None:
                self._cache.set(_FORMAT_KEY, FORMAT)
            self._cache._con.execute(
                f"CREATE TABLE IF NOT EXISTS {_MEMO} (key TEXT PRIMARY KEY, play TEXT NOT NULL, value TEXT NOT NULL) WITHOUT ROWID"
            )
        except ReceiptError as exc:
            raise ReceiptError(f"cannot open the receipt store at {self.path}: {exc}") from None
        except (OSError, sqlite3.Error) as exc:
            raise ReceiptError(f"cannot open the receipt store at {self.path}: {exc}") from None
        if found is not None and found != FORMAT:
            raise ReceiptError(
                f"the receipt store at {self.path} has format {found!r}; this playbook reads format "
                f"{FORMAT}. Upgrade playbook, or point store= at another directory."
            )
        self._pending_memos: list[tuple[str, str, str]] = []
        self._flushed = time.monotonic()
        self._local = threading.local()  # one read cursor per thread (and per process after a fork)
        self._writes: list[tuple[str, dict[str, Any], str, asyncio.Future[None]]] = []
        self.inflight: dict[str, asyncio.Future[None]] = {}  # receipt key -> call being paid for now
        self.leases = Leases(self, ttl=lease_ttl)  # the same, across processes

    def __repr__(self) -> str:
        return f"ReceiptStore({str(self.path)!r})"

    # -- receipts (hot path) -------------------------------------------------------------

    def lookup(self, key: str, ttl: float | None = None) -> Any:
        """The stored record for ``key``, or ``MISSING`` (also when older than ``ttl`` seconds)."""
        try:
            # A direct read of diskcache's table (key, raw, mode, filename, value; stable across
            # 5.x) on a kept cursor: Cache.get's bookkeeping costs twice the query on this path.
            local = self._local
            cursor = getattr(local, "cursor", None)
            if cursor is None or local.pid != os.getpid():
                cursor = local.cursor = self._cache._con.cursor()
                local.pid = os.getpid()
            found = cursor.execute(_LOOKUP, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}") from None
        if found is None:
            return MISSING
        mode, filename, value = found
        if mode == _MODE_RAW and type(value) is str:
            try:
                record = json.loads(value)
            except ValueError:
                raise ReceiptError(f"receipt {key} in {self.path} is corrupted (not JSON)") from None
        else:  # a large receipt kept in a file, or something playbook did not write
            record = self._cache._disk.fetch(mode, filename, value, False)
        if type(record) is not dict or record.get("v") != FORMAT:
            raise ReceiptError(f"receipt {key} in {self.path} is not a format-{FORMAT} receipt")
        if ttl is not None and self._clock() - record["at"] > ttl:
            return MISSING
        return record

    async def commit(self, key: str, record: dict[str, Any], tag: str) -> None:
        """Write one record durably; returns once it is committed.

        Receipts written in the same turn of the event loop share one transaction (group
        commit): each row still waits for its own receipt to be on disk, but a burst of 64
        finishing calls costs one commit instead of 64.
        """
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._writes.append((key, record, tag, done))
        if len(self._writes) == 1:
            loop.call_soon(self._commit_writes)
        await done

    def _commit_writes(self) -> None:
        writes, self._writes = self._writes, []
        try:
            with self._cache.transact():
                for key, record, tag, _ in writes:
                    self._cache.set(key, record, tag=tag)
        except (sqlite3.Error, ReceiptError) as exc:
            error = ReceiptError(f"cannot write to the receipt store at {self.path}: {exc}")
            for *_, done in writes:
                if not done.done():
                    done.set_exception(error)
            return
        for *_, done in writes:
            if not done.done():  # a row cancelled while waiting: its receipt is written anyway
                done.set_result(None)

    # -- row memos (buffered: losing one only means a row replays against its receipts) --

    def memos(self, keys: list[str]) -> dict[str, Any]:
        """Row memos for the keys that have one, in one SQL query per 500 keys."""
        found: dict[str, Any] = {}
        con = self._cache._con
        try:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, value in con.execute(f"SELECT key, value FROM {_MEMO} WHERE key IN ({marks})", chunk):
                    found[key] = json.loads(value)
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}") from None
        except ValueError:
            raise ReceiptError(f"a row memo in {self.path} is corrupted (not JSON)") from None
        return found

    def add_memo(self, key: str, output: dict[str, Any], play: str) -> None:
        """Remember a finished row's output; written at the next flush.  An output with no JSON
        form is not remembered: that row simply runs again next time, against its receipts."""
        try:
            text = to_json(output)
        except (TypeError, ValueError):
            return
        pending = self._pending_memos
        pending.append((key, play, text))
        # A commit costs milliseconds: batch by count and by time.  A crash loses at most the
        # last half second of memos, and those rows replay from their receipts for free.
        if len(pending) >= 16384 or (len(pending) >= 1024 and time.monotonic() - self._flushed > 0.5):
            self.flush()

    def flush(self) -> None:
        """Write buffered row memos in one transaction."""
        pending, self._pending_memos = self._pending_memos, []
        self._flushed = time.monotonic()
        if not pending:
            return
        try:
            with self._cache.transact():
                self._cache._con.executemany(f"INSERT OR REPLACE INTO {_MEMO} VALUES (?, ?, ?)", pending)
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot write to the receipt store at {self.path}: {exc}") from None

    # -- public inspection ---------------------------------------------------------------

    def get(self, tool: Tool, input: Any = NO_INPUT, /, **kwargs: Any) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None`` if it was never paid for."""
        payload = canonical(jsonable(tool.bind(input, kwargs)))
        key = "r" + receipt_key(tool.name, tool.version, payload, tool.account)
        record = self.lookup(key)
        return None if record is MISSING else _receipt(key, record)

    def receipts(self, tool: str | Tool | None = None) -> pd.DataFrame:
        """All receipts (or one tool's) as a DataFrame, oldest first."""
        name = getattr(tool, "name", tool)
        rows = [_receipt(key, rec).model_dump() for key, rec in self._records() if name is None or rec["tool"] == name]
        frame = pd.DataFrame(rows, columns=list(Receipt.model_fields))
        return frame.sort_values("created_at", kind="stable").reset_index(drop=True)

    def stats(self) -> dict[str, Any]:
        """How many receipts (per tool) and row memos the store holds, and its size on disk."""
        by_tool: dict[str, int] = {}
        cost = 0.0
        for _, rec in self._records():
            by_tool[rec["tool"]] = by_tool.get(rec["tool"], 0) + 1
            cost += rec.get("cost", 0.0)
        self.flush()
        (memos,) = self._cache._con.execute(f"SELECT COUNT(*) FROM {_MEMO}").fetchone()
        return {
            "path": str(self.path),
            "receipts": sum(by_tool.values()),
            "by_tool": dict(sorted(by_tool.items())),
            "row_memos": memos,
            "cost_stored": round(cost, 6),
            "bytes": self._cache.volume(),
        }

    def clear(self, tool: str | Tool | None = None) -> int:
        """Remove one tool's receipts, or everything (receipts and row memos); returns how many went."""
        self.flush()
        name = getattr(tool, "name", tool)
        if name is not None:
            return self._cache.evict(name)
        count = self._cache.clear() - 1  # the format marker goes too, and comes back below
        with self._cache.transact():
            count += self._cache._con.execute(f"DELETE FROM {_MEMO}").rowcount
        self._cache.set(_FORMAT_KEY, FORMAT)
        return count

    def close(self) -> None:
        self.flush()
        self._cache.close()

    def _records(self) -> Iterable[tuple[str, dict[str, Any]]]:
        for key in list(self._cache.iterkeys()):
            if isinstance(key, str) and key.startswith("r"):
                record = self.lookup(key)
                if record is not MISSING:
                    yield key, record


def _receipt(key: str, record: dict[str, Any]) -> Receipt:
    return Receipt(
        key=key,
        tool=record["tool"],
        version=record["ver"],
        account=record["acct"],
        input=record["in"],
        output=record["out"],
        miss=record["miss"],
        cost=record["cost"],
        created_at=record["at"],
    )


_default: ReceiptStore | None = None


def default_store() -> ReceiptStore:
    """The store under ``$PLAYBOOK_HOME`` (or ``.playbook/``), opened once per directory."""
    global _default
    if _default is None or _default.path != _home():
        _default = ReceiptStore()
    return _default
