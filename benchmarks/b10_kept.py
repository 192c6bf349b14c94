"""B10's second hand-written loop: the first one, keeping what playbook promises on a first run.

The first loop writes its results a thousand at a time and never makes a row wait.  playbook
promises more, and each promise is work on SQLite and a wait on the event loop:

- never pay twice, across processes: a call's receipt is looked up first; one not found is
  leased before it is made (the leases asked in one turn of the loop in one statement, then the
  receipt looked up again: another process may have just paid), the lease given back with its
  receipt;
- a crash loses nothing paid for: the receipt is written and synced to the disk
  (``synchronous=FULL``) before its row goes on, the receipts of one turn in one commit;
- a rerun is a resume: a memo per finished row, appended 16,384 at a time and moved into the
  keyed memo table in key order at the end (as playbook does: written into their places a batch
  at a time, memos keyed by digests cost a page each).

This loop does exactly that and nothing else (no retries, rates, progress or errors): what any
code that keeps those promises pays.  B10 prints its rates beside the first loop's: a first run
on a new file, and a new version of the play over the receipts it left (every call answered by
its receipt, every row's memo written).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from typing import Any

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
_MEMOS = 16_384


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


async def _run(
    db: sqlite3.Connection, values: list[int], concurrency: int, version: str
) -> list[dict[str, int]]:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(concurrency)
    asked: list[tuple[str, asyncio.Future[bool]]] = []
    written: list[tuple[str, str, asyncio.Future[None]]] = []
    memos: list[tuple[str, str]] = []

    def grant() -> None:
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
        db.execute("COMMIT")
        for key, done in batch:
            done.set_result(key in got)

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

    async def one(x: int) -> dict[str, int]:
        async with gate:
            key = _key("double", "1", {"x": x})
            found = db.execute("SELECT value FROM receipt WHERE key = ?", (key,)).fetchone()
            if not found:
                leased: asyncio.Future[bool] = loop.create_future()
                asked.append((key, leased))
                if len(asked) == 1:
                    loop.call_soon(grant)
                if not await leased:
                    raise RuntimeError(f"the lease on {key} is held")
                found = db.execute("SELECT value FROM receipt WHERE key = ?", (key,)).fetchone()
            value = json.loads(found[0]) if found else await _double(x)
            if not found:
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

    results = await asyncio.gather(*(one(x) for x in values))
    if memos:
        flush()
    fold()
    return results
