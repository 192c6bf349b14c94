"""Opening a store: its file, its format, what it holds from an earlier playbook, and the words
to say when it cannot be opened (never advice that loses receipts, unless the store is unreadable)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import NoReturn

from playbook.errors import ReceiptError
from playbook.store.db import FORMAT, Database, StoreFailure, reason
from playbook.store.legacy import import_legacy
from playbook.store.protocol import ELSEWHERE

__all__ = ["initialise", "open_store"]


def open_store(db: Database, path: Path) -> list[str]:
    """Open ``db`` (the store at ``path``), making it if new; returns what to tell the user.
    Raises ``ReceiptError`` saying what to do when it cannot be used."""
    if db.readonly and not db.file.is_file():
        old = (
            " (it holds a store of playbook 0.1: open it once without readonly=True to copy its receipts)"
            if (path / "cache.db").is_file()
            else ""
        )
        raise ReceiptError(f"there is no receipt store at {path} to read{old}")
    try:
        db.open()
        found = db.read(lambda con: con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone())
        if found is None and db.readonly:
            _refuse(db, path, "it is not a store playbook finished making")
        if found is None:
            return db.write(lambda con: initialise(path, con))
        if not db.readonly:
            # A store that reads but cannot take writes would fail every row that pays: say so now.
            db.write(
                lambda con: con.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('opened', ?)", (str(time.time()),)
                )
            )
    except StoreFailure as exc:
        _refuse_or_explain(db, path, exc)
    except (OSError, sqlite3.Error) as exc:
        _refuse_or_explain(db, path, reason(exc))
    except ReceiptError:
        db.close()
        raise
    try:
        version = int(found[0])
    except (TypeError, ValueError):
        _refuse(db, path, f"its format marker is {found[0]!r}, which no playbook writes")
    if version > FORMAT:
        db.close()
        raise ReceiptError(
            f"the receipt store at {path} was written by a newer playbook (store format {version}; this "
            f"playbook reads format {FORMAT}). Upgrade playbook, or {ELSEWHERE}; this store is left untouched."
        )
    return []


def initialise(path: Path, con: sqlite3.Connection) -> list[str]:
    """Mark a new store with its format, after copying what an earlier playbook left there."""
    try:
        notes = import_legacy(path, con)
    except (sqlite3.Error, OSError) as exc:
        raise ReceiptError(
            f"cannot open the receipt store at {path}: it holds a store of an earlier playbook "
            f"({path / 'cache.db'}) that cannot be read ({reason(exc).reason}). Move that file aside "
            f"to start afresh, or {ELSEWHERE}."
        ) from None
    con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('format', ?)", (str(FORMAT),))
    return notes


def _refuse_or_explain(db: Database, path: Path, failure: StoreFailure) -> NoReturn:
    db.close()
    if failure.code and failure.code.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        _refuse(db, path, f"{db.file} is not a readable SQLite database ({failure.reason})")
    if (
        failure.code
        and failure.code.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY"))
        and path.is_dir()
        and not os.access(path, os.W_OK)
    ):
        failure = StoreFailure(
            f"its directory is read-only (EROFS, or no permission to write) ({failure.code})", failure.code
        )
    # Read-only, no permission, not a directory, locked: the receipts may be fine, so say how to
    # reach them, never to delete them.
    raise ReceiptError(
        f"cannot open the receipt store at {path}: {failure.reason}. playbook reads and writes receipts "
        f"there: make the directory readable and writable, or {ELSEWHERE} (ReceiptStore(path, readonly=True) "
        "only reads it)."
    ) from None


def _refuse(db: Database, path: Path, problem: str) -> NoReturn:
    db.close()
    raise ReceiptError(
        f"cannot open the receipt store at {path}: {problem}. Move it aside (or delete it, losing "
        f"its receipts) and run again, or {ELSEWHERE}."
    ) from None
