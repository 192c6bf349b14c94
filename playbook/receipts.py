"""The receipt store: every paid tool result, and every finished row, as JSON on disk.

Receipts live in a diskcache ``Cache`` (SQLite + files), keyed by short hex digests from
:mod:`playbook.keys`.  Values are JSON text: the disk class below refuses to pickle on write and
refuses to unpickle on read, so the store never holds or runs pickled data, whatever wrote to
the directory.

Row memos live in a lean table of their own in the same SQLite file.  A run writes one per
finished row, thousands a second; diskcache's ``set`` (a SELECT, an INSERT and two trigger
updates per row, plus its indexes) made memo writes cost more than the rest of a replayed row.

Damage is handled at two levels.  A store that cannot be opened (not a database, a newer format)
raises :class:`ReceiptError` naming the directory and what to do.  One receipt or memo that
cannot be read (truncated, its value file gone, a pickle planted by something else) counts as
missing, with a warning naming it: the call is made again and the new receipt replaces it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

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
_FIELDS = frozenset({"v", "out", "at"})  # every record: tool receipts ("r…"), steps and sleeps ("s…")
_RECEIPT_FIELDS = _FIELDS | {"tool", "ver", "acct", "in", "miss", "cost"}
_ELSEWHERE = "pass store=pb.ReceiptStore('another/directory') to use another store"
_logger = logging.getLogger("playbook.receipts")


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
        """The JSON value, or ``ReceiptError`` saying what is wrong with it (no path: callers add it)."""
        if mode == diskcache.core.MODE_PICKLE:
            # Something other than playbook wrote here; unpickling it could run code.
            raise ReceiptError("its value is a pickle, which playbook never loads (something else wrote it)")
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_TEXT):
            raise ReceiptError(f"its value is stored in diskcache mode {mode}, not as JSON text (something else wrote it)")
        try:
            # Values of 32 kB and more live in a file of their own (MODE_TEXT), named by the row.
            text = super().fetch(mode, filename, value, read)
        except FileNotFoundError:
            raise ReceiptError(f"its value file {filename} is missing") from None
        except OSError as exc:
            raise ReceiptError(f"its value file {filename} cannot be read ({exc.strerror or exc})") from None
        except ValueError:  # bytes that are not UTF-8
            raise ReceiptError(f"its value file {filename} is not UTF-8 text") from None
        try:
            return json.loads(text)
        except (TypeError, ValueError):
            raise ReceiptError("its value is not valid JSON (truncated or overwritten)") from None


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
        self._cache: Any = None
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
        except ReceiptError as exc:  # the format marker itself is damaged
            self._refuse(f"its format marker cannot be read: {exc}")
        except (OSError, sqlite3.OperationalError) as exc:
            # Read-only, no permission, not a directory, locked: the receipts may be fine, so
            # say how to reach them, never to delete them.
            self._close_quietly()
            raise ReceiptError(
                f"cannot open the receipt store at {self.path}: {exc}. playbook reads and writes receipts "
                f"there: make the directory readable and writable, or {_ELSEWHERE}."
            ) from None
        except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
            self._refuse(f"{self.path / 'cache.db'} is not a readable SQLite database ({exc})")
        except sqlite3.Error as exc:
            self._refuse(str(exc))
        if found is not None and found != FORMAT:
            self._close_quietly()
            if type(found) is int and found > FORMAT:
                raise ReceiptError(
                    f"the receipt store at {self.path} was written by a newer playbook (store format {found}; this "
                    f"playbook reads format {FORMAT}). Upgrade playbook (pip install -U playbook), or {_ELSEWHERE}; "
                    "this store is left untouched."
                )
            self._refuse(f"its format marker is {found!r}, which no playbook writes")
        self._pending_memos: list[tuple[str, str, str]] = []
        self._warned: set[str] = set()  # unreadable receipts already reported
        self._flushed = time.monotonic()
        self._local = threading.local()  # one read cursor per thread (and per process after a fork)
        self._writes: list[tuple[str, dict[str, Any], str, asyncio.Future[None]]] = []
        self.inflight: dict[str, asyncio.Future[None]] = {}  # receipt key -> call being paid for now
        self.leases = Leases(self, ttl=lease_ttl)  # the same, across processes

    def __repr__(self) -> str:
        return f"ReceiptStore({str(self.path)!r})"

    def _refuse(self, problem: str) -> NoReturn:
        self._close_quietly()
        raise ReceiptError(
            f"cannot open the receipt store at {self.path}: {problem}. Move it aside (or delete it, losing "
            f"its receipts) and run again, or {_ELSEWHERE}."
        ) from None

    def _close_quietly(self) -> None:
        if self._cache is not None:
            try:
                self._cache.close()
            except (OSError, sqlite3.Error):
                pass

    # -- receipts (hot path) -------------------------------------------------------------

    def lookup(self, key: str, ttl: float | None = None) -> Any:
        """The stored record for ``key``, or ``MISSING`` (also when older than ``ttl`` seconds).

        A receipt that cannot be read is ``MISSING`` too, with a warning naming it, so the call
        is made again and its new receipt replaces the bad one.  Failing the row instead would
        fail it again on every rerun, and the only way out, clearing the tool's receipts, would
        throw away every other call of that tool already paid for.
        """
        found = self._select(key)
        if found is None:
            return MISSING
        try:
            record = self._decode(key, found[0], found[1], found[2])
        except ReceiptError as exc:
            if key not in self._warned:  # a call looks its receipt up more than once (before and after its lease)
                self._warned.add(key)
                why = self._unreadable(key, exc)
                _logger.warning("%s; it counts as missing: a run that needs it makes the call again and replaces it", why)
            return MISSING
        if ttl is not None and self._clock() - record["at"] > ttl:
            return MISSING
        return record

    def _select(self, key: str) -> tuple[int, str | None, Any] | None:
        try:
            # A direct read of diskcache's table (key, raw, mode, filename, value; stable across
            # 5.x) on a kept cursor: Cache.get's bookkeeping costs twice the query on this path.
            local = self._local
            cursor = getattr(local, "cursor", None)
            if cursor is None or local.pid != os.getpid():
                cursor = local.cursor = self._cache._con.cursor()
                local.pid = os.getpid()
            return cursor.execute(_LOOKUP, (key,)).fetchone()  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}; {_ELSEWHERE}") from None

    def _decode(self, key: str, mode: int, filename: str | None, value: Any) -> dict[str, Any]:
        if mode == _MODE_RAW and type(value) is str:
            try:
                record = json.loads(value)
            except ValueError:
                raise ReceiptError("its value is not valid JSON (truncated or overwritten)") from None
        else:  # a large receipt kept in a file, or something playbook did not write
            record = self._cache._disk.fetch(mode, filename, value, False)
        fields = _RECEIPT_FIELDS if key[:1] == "r" else _FIELDS
        if type(record) is not dict or record.get("v") != FORMAT or not record.keys() >= fields:
            raise ReceiptError(f"its value is not a format-{FORMAT} receipt")
        return record

    def _unreadable(self, key: str, problem: ReceiptError) -> str:
        try:
            row = self._cache._con.execute("SELECT tag FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
        except sqlite3.Error:
            row = None
        tool = f" of tool {row[0]!r}" if row and row[0] else ""
        return f"receipt {key}{tool} in {self.path} cannot be read: {problem}"

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
        except Exception as exc:  # noqa: BLE001 - anything left unset here leaves its rows waiting forever
            error = ReceiptError(f"cannot write to the receipt store at {self.path}: {exc}")
            for *_, done in writes:
                if not done.done():
                    done.set_exception(error)
            return
        for *_, done in writes:
            if not done.done():  # a row cancelled while waiting: its receipt is written anyway
                done.set_result(None)

    # -- row memos (buffered: losing one only means a row replays against its receipts) --

    def memos(self, keys: list[str]) -> dict[str, tuple[dict[str, Any], int, float]]:
        """Row memos for the keys that have one, in one SQL query per 500 keys: the row's output,
        and how many calls it made and what they cost (0 for a memo written before they were kept).

        A memo that cannot be read is left out (with a warning): its row runs again, against
        its receipts, so that costs nothing.
        """
        found: dict[str, tuple[dict[str, Any], int, float]] = {}
        bad: list[str] = []
        con = self._cache._con
        try:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, value in con.execute(f"SELECT key, value FROM {_MEMO} WHERE key IN ({marks})", chunk):
                    try:
                        memo = json.loads(value)
                    except (TypeError, ValueError):
                        memo = None
                    if type(memo) is list and len(memo) == 3 and type(memo[0]) is dict:
                        found[key] = (memo[0], memo[1], memo[2])
                    elif type(memo) is dict:  # an output alone, as memos were first written
                        found[key] = (memo, 0, 0.0)
                    else:
                        bad.append(key)
        except sqlite3.Error as exc:
            raise ReceiptError(f"cannot read the receipt store at {self.path}: {exc}; {_ELSEWHERE}") from None
        if bad:
            _logger.warning(
                "%d row memo(s) in %s cannot be read (first: %s); those rows run again, against their receipts",
                len(bad), self.path, bad[0],
            )  # fmt: skip
        return found

    def add_memo(self, key: str, output: dict[str, Any], play: str, calls: int = 0, cost: float = 0.0) -> None:
        """Remember a finished row's output, with how many calls it made and their cost; written
        at the next flush.  An output with no JSON form is not remembered: that row simply runs
        again next time, against its receipts."""
        try:
            text = to_json([output, calls, cost])
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
        except (sqlite3.Error, diskcache.Timeout) as exc:
            raise ReceiptError(f"cannot write to the receipt store at {self.path}: {exc}") from None

    # -- public inspection ---------------------------------------------------------------

    def get(self, tool: Tool, input: Any = NO_INPUT, /, **kwargs: Any) -> Receipt | None:
        """The receipt for calling ``tool`` with this input, or ``None`` if it was never paid for.

        Raises ``ReceiptError`` if the receipt is there but cannot be read.
        """
        payload = canonical(jsonable(tool.bind(input, kwargs)))
        key = "r" + receipt_key(tool.name, tool.version, payload, tool.account)
        found = self._select(key)
        if found is None:
            return None
        try:
            return _receipt(key, self._decode(key, *found))
        except ReceiptError as exc:
            raise ReceiptError(
                f"{self._unreadable(key, exc)}. A run that needs it makes the call again and replaces it; "
                f"`python -m playbook cache clear --store {self.path} --tool {tool.name}` drops all of that tool's receipts."
            ) from None

    def receipts(self, tool: str | Tool | None = None) -> pd.DataFrame:
        """All readable receipts (or one tool's) as a DataFrame, oldest first."""
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
