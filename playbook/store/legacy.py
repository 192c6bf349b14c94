"""Stores written by playbook 0.1 (store format 1): a diskcache directory, ``cache.db``.

The first time such a directory is opened, its receipts and step records are copied into
``receipts.db`` as they are (format-1 records, plain JSON), so they keep answering wherever the
key is unchanged: calls of tools pinned with ``version=``.  The old files are only read, never
changed or removed.  Row memos are not copied: they do not say which tools they used, so they
cannot be trusted after a tool changed; those rows run once more, against their receipts.

diskcache kept a value of 32 kB or more in a file of its own (``ab/cd/….val``) and the row
naming it in ``cache.db``.  A ``cache.db`` emptied from outside leaves such files behind with
nothing to say which call they answer: that is reported, since those receipts are lost.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from playbook.store.records import COLUMNS

__all__ = ["import_legacy"]

_logger = logging.getLogger("playbook.store")
_OLD = "cache.db"
_MODE_RAW, _MODE_TEXT = 1, 3  # diskcache's modes: the value in the row, or in a text file
_FIELDS = frozenset({"v", "out", "at"})


def import_legacy(directory: Path, con: sqlite3.Connection) -> list[str]:
    """Copy a format-1 store's records in ``directory`` into the open transaction on ``con``;
    returns what to tell the user (nothing when there is no old store).  Raises sqlite3 errors
    when ``cache.db`` is there but cannot be read."""
    old = directory / _OLD
    if not old.is_file():
        return []
    with closing(sqlite3.connect(f"{old.as_uri()}?mode=ro", uri=True)) as src:
        tables = {name for (name,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = (
            []
            if "Cache" not in tables
            else src.execute(
                "SELECT key, mode, filename, value, tag FROM Cache WHERE raw = 1 AND key >= 'r' AND key < 't'"
            ).fetchall()
        )
    copied, unreadable = 0, 0
    for key, mode, filename, value, tag in rows:
        record = _record(directory, mode, filename, value)
        if record is None or not (key.startswith(("r", "s"))):
            unreadable += 1
            continue
        con.execute(
            f"INSERT OR IGNORE INTO receipt ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _row(key, record, tag),
        )
        copied += 1
    notes = []
    if copied or unreadable:
        notes.append(
            f"copied {copied} receipts and step records of an earlier playbook from {old} into {directory / 'receipts.db'}"
            + (f"; {unreadable} could not be read and were left out" if unreadable else "")
            + f". {old.name} and its value files are left as they were: delete them once you no longer need them."
        )
    orphans = _value_files(directory) - {row[2] for row in rows if row[2]}
    if orphans:
        notes.append(
            f"{len(orphans)} value files of an earlier playbook store in {directory} are not named by its {old.name}, which "
            "was emptied or replaced from outside: the receipts they held cannot be matched to their calls and are lost"
        )
    for note in notes:
        _logger.warning("%s", note)
    return notes


def _row(key: str, record: dict[str, Any], tag: str | None) -> tuple[Any, ...]:
    """A format-1 record as a row of the receipt table.  Its values are plain JSON (no tags,
    ``flags`` 0), exactly what playbook 0.1 returned for them."""
    cost = record.get("cost", 0.0)

    def text(value: Any) -> str:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"))

    return (
        key,
        str(record.get("tool", f"step:{tag or ''}")),
        str(record.get("ver", "")),
        str(record.get("acct", "")),
        float(record["at"]),
        float(cost) if isinstance(cost, (int, float)) else 0.0,
        bool(record.get("miss", False)),
        0,
        text(record["in"]) if "in" in record else None,
        text(record["out"]),
        None,
    )


def _record(directory: Path, mode: int, filename: str | None, value: Any) -> dict[str, Any] | None:
    try:
        if mode == _MODE_RAW and isinstance(value, str):
            text = value
        elif mode == _MODE_TEXT and filename:
            text = (directory / filename).read_text(encoding="utf-8")
        else:  # a pickle or bytes: not something playbook wrote, and never loaded
            return None
        record = json.loads(text)
    except (OSError, ValueError):
        return None
    if (
        type(record) is not dict
        or record.get("v") != 1
        or not record.keys() >= _FIELDS
        or not isinstance(record["at"], (int, float))
    ):
        return None
    return record


def _value_files(directory: Path) -> set[str]:
    """Relative names of diskcache value files (``ab/cd/<hex>.val``) under ``directory``."""
    return {str(p.relative_to(directory)) for p in directory.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*.val")}
