"""B10's second hand-written loop: the worker loop, keeping what playbook promises on a run.

The worker loop (``b10_scale.hand_loop``) writes its results a thousand at a time and never makes
a row wait.  playbook promises more, and each promise is work on SQLite and a wait on the event
loop.  This loop keeps these promises:

- never pay twice, across processes: a call's receipt is looked up first; one not found is
  leased before it is made (the leases asked in one turn of the loop in one statement, then the
  receipts of those granted looked up again in the same transaction: another process may have
  just paid), the lease given back with its receipt;
- a crash loses nothing paid for: the receipt is written and synced to the disk
  (``synchronous=FULL``) before its row goes on, the receipts of one turn in one commit;
- a rerun is a resume: a memo per finished row, appended 16,384 at a time and moved into the
  keyed memo table in key order at the end (as playbook does: written into their places a batch
  at a time, memos keyed by digests cost a page each).

It is written as a careful engineer would and as playbook runs: 256 workers pulling rows from one
iterator, and the receipts read ahead as playbook reads them: before the next 512 rows are worked,
their calls' receipts are looked up at once (500 keys a query).  It does that and nothing else
(no retries, rates, progress, errors, views or events): what any code that keeps those promises
pays.  B10 prints playbook's ratio to it beside the ratio to the worker loop: for a first run on a
new file, and for a new version of the play over the receipts it left (every call answered by its
receipt, every row's memo written).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from .harness import worker_pool

__all__ = ["kept_loop"]

_SCHEMA = (
    "CREATE TABLE receipt (key TEXT PRIMARY KEY, tool TEXT NOT NULL, value TEXT NOT NULL)",
    "CREATE INDEX receipt_tool ON receipt (tool)",  # as playbook's: a tool's receipts are cleared by name
    "CREATE TABLE lease (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL) WITHOUT ROWID",
    "CREATE TABLE memo (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE memo_log (key TEXT NOT NULL, value TEXT NOT NULL)",
)
_TAKE = (
    "INSERT INTO lease VALUES {} ON CONFLICT(key) DO UPDATE SET owner = excluded.owner, "
    "expires = excluded.expires WHERE lease.expires < ? RETURNING key"
)
_LOOK = "SELECT key, value FROM receipt WHERE key IN ({})"
_MEMOS = 16_384
AHEAD = 512  # rows whose receipts are read at once, before they are worked (as playbook's read-ahead)
CHUNK = 500  # keys a query


def kept_loop(values: list[int], path: str, concurrency: int, version: str = "1") -> float:
    """Run version ``version`` of the loop's play over ``values`` with the SQLite file at ``path``
    (made if new); return rows per second."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA wal_autocheckpoint = 16384")  # as playbook's: the log copied every 64 MB
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'receipt'").fetchone():
        for statement in _SCHEMA:
            db.execute(statement)
    start = time.perf_counter()
    asyncio.run(_run(db, values, concurrency, version))
    seconds = time.perf_counter() - start
    db.close()
    return len(values) / seconds


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


async def _double(x: int) -> int:
    return x * 2


def _ahead(db: sqlite3.Connection, values: list[int]) -> Iterator[tuple[int, str, str | None]]:
    """Each row's value, its call's key and the receipt found for it, the receipts of ``AHEAD`` rows
    read at once before those rows are worked (as playbook reads ahead), ``CHUNK`` keys a query."""
    for first in range(0, len(values), AHEAD):
        rows = [(x, _key("double", "1", {"x": x})) for x in values[first : first + AHEAD]]
        found = _found(db, [key for _, key in rows])
        for x, key in rows:
            yield x, key, found.get(key)


def _found(db: sqlite3.Connection, keys: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for i in range(0, len(keys), CHUNK):
        part = keys[i : i + CHUNK]
        found.update(db.execute(_LOOK.format(",".join("?" * len(part))), part).fetchall())
    return found


async def _run(
    db: sqlite3.Connection, values: list[int], concurrency: int, version: str
) -> list[dict[str, int]]:
    loop = asyncio.get_running_loop()
    asked: list[tuple[str, asyncio.Future[str | None]]] = []
    written: list[tuple[str, str, asyncio.Future[None]]] = []
    memos: list[tuple[str, str]] = []

    def grant() -> None:
        # The leases asked in this turn, in one statement; the receipts of those granted looked up
        # again in the same transaction: another process may have paid since the read ahead.
        batch = asked.copy()
        asked.clear()
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        marks = ",".join(["(?, ?, ?)"] * len(batch))
        got = {
            key
            for (key,) in db.execute(
                _TAKE.format(marks), [v for key, _ in batch for v in (key, "me", now + 60)] + [now]
            )
        }
        found = _found(db, list(got))
        db.execute("COMMIT")
        for key, done in batch:
            if key not in got:
                done.set_exception(RuntimeError(f"the lease on {key} is held"))
            else:
                done.set_result(found.get(key))

    def commit() -> None:
        batch = written.copy()
        written.clear()
        db.execute("PRAGMA synchronous = FULL")
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT OR REPLACE INTO receipt VALUES (?, 'double', ?)",
            [(key, value) for key, value, _ in batch],
        )
        db.executemany("DELETE FROM lease WHERE key = ? AND owner = 'me'", [(key,) for key, _, _ in batch])
        db.execute("COMMIT")
        db.execute("PRAGMA synchronous = NORMAL")
        for _, _, done in batch:
            done.set_result(None)

    def flush() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO memo_log VALUES (?, ?)", memos)
        db.execute("COMMIT")
        memos.clear()

    def fold() -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT OR REPLACE INTO memo SELECT key, value FROM memo_log ORDER BY key, rowid")
        db.execute("DELETE FROM memo_log")
        db.execute("COMMIT")

    async def one(row: tuple[int, str, str | None]) -> dict[str, int]:
        x, key, found = row
        if found is None:
            leased: asyncio.Future[str | None] = loop.create_future()
            asked.append((key, leased))
            if len(asked) == 1:
                loop.call_soon(grant)
            found = await leased
        value = json.loads(found) if found is not None else await _double(x)
        if found is None:
            synced: asyncio.Future[None] = loop.create_future()
            written.append((key, json.dumps(value), synced))
            if len(written) == 1:
                loop.call_soon(commit)
            await synced
        output = {"y": value}
        memos.append((_key("doubled", version, {"x": x}), json.dumps(output)))
        if len(memos) >= _MEMOS:
            flush()
        return output

    results = await worker_pool(_ahead(db, values), one, len(values), concurrency)
    if memos:
        flush()
    fold()
    return results
