"""Where a store is: a directory (SQLite), a ``redis://`` URL, or ``"memory"``; and its backend."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .protocol import Backend

__all__ = ["home", "is_url", "masked_in", "open_backend"]

_URLS = ("redis://", "rediss://", "unix://")


def masked_in(text: str) -> bool:
    """``text`` already names a store's URL (a backend's message does, with its password masked)."""
    return any(scheme in text for scheme in _URLS)


def is_url(location: str | os.PathLike[str]) -> bool:
    """A store that is not a directory: a ``redis://`` URL, or ``"memory"``."""
    text = os.fspath(location)
    return text.startswith(_URLS) or text == "memory"


def home() -> Path | str:
    """``$PLAYBOOK_HOME`` (a directory or a ``redis://`` URL), or ``.playbook`` in the working directory."""
    where = os.environ.get("PLAYBOOK_HOME") or ".playbook"
    return where if is_url(where) else Path(where)


def open_backend(location: str | os.PathLike[str], *, readonly: bool = False, notify: Callable[[str], None] | None = None) -> Backend:
    """The backend for a directory (SQLite), a ``redis://`` URL, or ``"memory"``."""
    text = os.fspath(location)
    if text.startswith(_URLS):
        from .redis import RedisBackend

        return RedisBackend(text, readonly=readonly)
    if text == "memory":
        from .memory import MemoryBackend

        return MemoryBackend()
    from .sqlite import SqliteBackend

    return SqliteBackend(Path(text), readonly=readonly, notify=notify)
