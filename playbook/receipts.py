"""The receipt store: every paid tool result, and every finished row, as JSON on disk.

Built on diskcache (SQLite + files).  Keys are short hex digests from :mod:`playbook.keys`,
prefixed by kind (``r`` receipt, ``m`` row memo).  Values are JSON text: the disk class below
refuses to pickle on write and refuses to unpickle on read, so the store never holds or runs
pickled data, whatever wrote to the directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diskcache
import pandas as pd

from .errors import ReceiptError
from .keys import canonical, jsonable, receipt_key
from .models import Receipt
from .tools import NO_INPUT

if TYPE_CHECKING:
    from .tools import Tool

__all__ = ["MISSING", "ReceiptStore", "default_store"]

FORMAT = 1
_FORMAT_KEY = "playbook/format"


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

    def __init__(self, path: str | os.PathLike[str] | None = None, *, clock: Callable[[], float] = time.time) -> None:
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
        except ReceiptError as exc:
            raise ReceiptError(f"cannot open the receipt store at {self.path}: {exc}") from None
        except (OSError, sqlite3.Error) as exc:
            raise ReceiptError(f"cannot open the receipt store at {self.path}: {exc}") from None
        if found is not None and found != FORMAT:
            raise ReceiptError(
                f"the receipt store at {self.path} has format {found!r}; this playbook reads format "
                f"{FORMAT}. Upgrade playbook, or point store= at another directory."
            )
        self._pending_memos: list[tuple[str, Any, str]] = []
        self.inflight: dict[str, asyncio.Future[None]] = {}  # receipt key -> call being paid for now

    def __repr__(self) -> str:
        return f"ReceiptStore({str(self.path)!r})"

    # -- receipts (hot path) -------------------------------------------------------------

    def lookup(self, key: str, ttl: float | None = None) -> Any:
        """The stored record for ``key``, or ``MISSING`` (also when older than ``ttl`` seconds)."""
        try:
            record = self._cache.get(key, default=MISSING)
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}") from None
        if record is not MISSING and type(record) is dict:
            if record.get("v", FORMAT) != FORMAT:
                raise ReceiptError(f"receipt {key} has format {record.get('v')!r}; expected {FORMAT}")
            if ttl is not None and self._clock() - record["at"] > ttl:
                return MISSING
        return record

    def write(self, key: str, record: dict[str, Any], tag: str) -> None:
        """Write one record durably (committed before this returns)."""
        try:
            self._cache.set(key, record, tag=tag)
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot write to the receipt store at {self.path}: {exc}") from None

    def lookup_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """Records for the keys that exist, in one SQL query per 500 keys."""
        found: dict[str, Any] = {}
        keys = list(keys)
        # diskcache has no bulk get; its ``Cache`` table (key, raw, mode, filename, value) is
        # stable across 5.x, and one IN query is ~5x cheaper per key than a get() each.
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            try:
                rows = self._cache._sql(
                    f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN ({marks})",
                    chunk,
                ).fetchall()
            except sqlite3.Error as exc:
                raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}") from None
            fetch = self._cache._disk.fetch
            for key, mode, filename, value in rows:
                found[key] = fetch(mode, filename, value, False)
        return found

    # -- row memos (buffered: losing one only means a row replays against its receipts) --

    def add_memo(self, key: str, record: dict[str, Any], play: str) -> None:
        self._pending_memos.append((key, record, "memo:" + play))
        if len(self._pending_memos) >= 256:
            self.flush()

    def flush(self) -> None:
        """Write buffered row memos in one transaction."""
        pending, self._pending_memos = self._pending_memos, []
        if not pending:
            return
        try:
            with self._cache.transact():
                for key, record, tag in pending:
                    self._cache.set(key, record, tag=tag)
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
        rows = [_receipt(key, rec).model_dump() for key, rec in self._records("r") if name is None or rec["tool"] == name]
        frame = pd.DataFrame(rows, columns=list(Receipt.model_fields))
        return frame.sort_values("created_at", kind="stable").reset_index(drop=True)

    def stats(self) -> dict[str, Any]:
        """How many receipts (per tool) and row memos the store holds, and its size on disk."""
        by_tool: dict[str, int] = {}
        memos = 0
        for key, rec in self._records(""):
            if key.startswith("r"):
                by_tool[rec["tool"]] = by_tool.get(rec["tool"], 0) + 1
            elif key.startswith("m"):
                memos += 1
        return {
            "path": str(self.path),
            "receipts": sum(by_tool.values()),
            "by_tool": dict(sorted(by_tool.items())),
            "row_memos": memos,
            "cost_stored": round(sum(rec.get("cost", 0.0) for _, rec in self._records("r")), 6),
            "bytes": self._cache.volume(),
        }

    def clear(self, tool: str | Tool | None = None) -> int:
        """Remove one tool's receipts, or everything; returns how many entries went."""
        self.flush()
        name = getattr(tool, "name", tool)
        if name is None:
            count = self._cache.clear()
            self._cache.set(_FORMAT_KEY, FORMAT)
            return count
        return self._cache.evict(name)

    def close(self) -> None:
        self.flush()
        self._cache.close()

    def _records(self, prefix: str) -> Iterable[tuple[str, dict[str, Any]]]:
        self.flush()
        for key in list(self._cache.iterkeys()):
            if isinstance(key, str) and key.startswith(prefix) and key != _FORMAT_KEY:
                record = self._cache.get(key, default=MISSING)
                if type(record) is dict:
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
