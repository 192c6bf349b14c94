"""A store backend in this process's memory: what tests and throwaway runs use.

Nothing survives the process, so nothing here is ever damaged: records are kept as the
:class:`Record` and :class:`MemoRow` tuples they arrive as.  One lock guards every dict, so the
backend is as safe to share between threads as the others.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Sequence

from playbook.store.protocol import Counts, Damaged, Found, SpendRow, StoreFailure
from playbook.store.records import MemoFields, MemoRow, Record, is_receipt, parse_tools

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Records, row memos and leases in dicts."""

    location = "memory"
    remote = False

    def __init__(self, *, readonly: bool = False) -> None:
        self.readonly = readonly
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}
        self._memos: dict[str, MemoRow] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # key -> (owner, expires: time.time())
        self._hints: dict[tuple[str, str], str] = {}
        self._spend: dict[tuple[str, str, str], list[float]] = {}
        self._id = uuid.uuid4().hex
        self._mark: str | None = None

    def __repr__(self) -> str:
        return f"<MemoryBackend records={len(self._records)} memos={len(self._memos)} leases={len(self._leases)}>"

    def _writable(self) -> None:
        if self.readonly:
            raise StoreFailure("the store was opened read-only", "READONLY")

    # -- receipts and step records -------------------------------------------------------------

    def lookup(self, key: str) -> Found | Damaged | None:
        row = self._records.get(key)  # one dict read is atomic: no lock on the hot path
        return None if row is None else Found(row.output, row.miss, row.flags, row.error, row.at)

    def lookup_many(self, keys: Sequence[str]) -> list[Found | Damaged | None]:
        return [self.lookup(key) for key in keys]

    def tool_of(self, key: str) -> str | None:
        row = self._records.get(key)
        return None if row is None else row.tool

    def get(self, key: str) -> Record | Damaged | None:
        return self._records.get(key)

    def write(self, records: Sequence[Record], released: Sequence[str] = (), owner: str = "") -> int:
        self._writable()
        with self._lock:
            added = len({row.key for row in records if is_receipt(row.key) and row.key not in self._records})
            self._records.update((row.key, row) for row in records)
            for key in released:
                if self._leases.get(key, ("", 0.0))[0] == owner:
                    del self._leases[key]
        return added

    def records(self, tool: str | None = None) -> Iterable[tuple[str, Record | Damaged]]:
        with self._lock:
            rows = [
                row
                for key, row in self._records.items()
                if is_receipt(key) and (tool is None or row.tool == tool)
            ]
        # sorted() is stable: records written at the same instant keep the order they were written in.
        return [(row.key, row) for row in sorted(rows, key=lambda row: row.at)]

    # -- row memos -------------------------------------------------------------------------------

    def memos(self, keys: Sequence[str]) -> tuple[Sequence[MemoFields], list[str]]:
        found = [row for row in map(self._memos.get, keys) if row is not None]
        return found, []

    def write_memos(self, rows: Sequence[MemoRow]) -> None:
        self._writable()
        with self._lock:
            self._memos.update((row.key, row) for row in rows)

    def fold_memos(self) -> None:
        pass  # found as written

    def hints(self, play: str, rows: Sequence[str]) -> dict[str, list[str]]:
        with self._lock:
            return {row: self._hints[play, row].split() for row in rows if (play, row) in self._hints}

    def write_hints(self, hints: Sequence[tuple[str, str, str]]) -> None:
        with self._lock:
            self._hints.update(((play, row), keys) for play, row, keys in hints)

    def write_spend(self, rows: Sequence[SpendRow]) -> None:
        self._writable()
        with self._lock:
            for day, provider, tool, *figures in rows:
                line = self._spend.setdefault((day, provider, tool), [0, 0.0, 0, 0.0, 0, 0])
                for i, value in enumerate(figures):
                    line[i] += value

    def spend_rows(self) -> list[SpendRow]:
        with self._lock:
            return [
                (*where, int(a), b, int(c), d, int(e), int(f))
                for where, (a, b, c, d, e, f) in self._spend.items()
            ]

    # -- upkeep ----------------------------------------------------------------------------------

    def counts(self) -> Counts:
        by_tool: dict[str, tuple[int, float]] = {}
        size = 0
        with self._lock:
            for key, row in self._records.items():
                size += len(row.output) + len(row.input or "")
                if is_receipt(key):
                    count, cost = by_tool.get(row.tool, (0, 0.0))
                    by_tool[row.tool] = (count + 1, cost + row.cost)
            size += sum(len(memo.output) for memo in self._memos.values())
            return Counts(by_tool, len(self._memos), size)

    def clear(self, tool: str | None = None) -> int:
        self._writable()
        with self._lock:
            if tool is None:
                removed = len(self._records) + len(self._memos)
                self._records.clear()
                self._memos.clear()
                self._hints.clear()
                return removed
            # Only receipts go: a step record belongs to its row, not to a tool.
            gone = [key for key, row in self._records.items() if is_receipt(key) and row.tool == tool]
            for key in gone:
                del self._records[key]
            for key in [memo.key for memo in self._memos.values() if tool in parse_tools(memo.tools)]:
                del self._memos[key]
            return len(gone)

    def memo_count(self, tool: str) -> int:
        with self._lock:
            return sum(tool in parse_tools(memo.tools) for memo in self._memos.values())

    # -- its mark: kept like the rest, in this process (nothing outlives it to be lost) -----------

    def receipt_count(self) -> int:
        with self._lock:
            return sum(is_receipt(key) for key in self._records)

    @property
    def identity(self) -> str:
        return self._id

    def read_mark(self) -> str | None:
        return self._mark

    def write_mark(self, mark: str) -> None:
        self._mark = mark

    # -- leases ----------------------------------------------------------------------------------

    def take(self, keys: Sequence[str], owner: str, ttl: float) -> list[bool]:
        self._writable()
        now = time.time()
        got = []
        with self._lock:
            for key in keys:
                holder, expires = self._leases.get(key, (owner, 0.0))
                ok = holder == owner or expires < now
                if ok:
                    self._leases[key] = (owner, now + ttl)
                got.append(ok)
        return got

    def take_and_look(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> tuple[list[bool], list[Found | Damaged | None]]:
        return self.take(keys, owner, ttl), self.lookup_many(keys)

    def renew(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        self._writable()
        expires = time.time() + ttl
        with self._lock:
            for key in keys:
                if self._leases.get(key, ("", 0.0))[0] == owner:
                    self._leases[key] = (owner, expires)

    def release(self, keys: Sequence[str], owner: str) -> None:
        self._writable()
        with self._lock:
            for key in keys:
                if self._leases.get(key, ("", 0.0))[0] == owner:
                    del self._leases[key]

    def holder(self, key: str) -> tuple[str, float] | None:
        owner, expires = self._leases.get(key, ("", 0.0))
        left = expires - time.time()
        return (owner, left) if left > 0 else None

    def close(self) -> None:
        pass
